"""Other ecosystems' environments in process: ``gem`` (GEM and TextArena games), ``openenv`` (an
OpenEnv ``Environment`` class, its MCP tools as asyncrl tools) and ``verifiers`` (a v0
``SingleTurnEnv``): each builds, resets, steps and scores; seed splits are disjoint; TextArena
gives the latest feedback only; ``code:*`` is refused; the install changes none of asyncrl's pins
(docs/environments.md#gem, #openenv, #verifiers)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import re
import tomllib
from pathlib import Path

import pytest

from asyncrl.config import EnvConfig, load_config
from asyncrl.envs import check_environment, make_raw_env, make_task_source
from asyncrl.envs.gem_env import latest_feedback
from asyncrl.envs.openenv_env import call_arguments
from asyncrl.errors import UserError
from helpers import run_texts_sync

ROOT = Path(__file__).resolve().parents[1]
needs_gem = pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="gem-llm not installed")
needs_ta = pytest.mark.skipif(importlib.util.find_spec("textarena") is None, reason="textarena not installed")
needs_openenv = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None, reason="openenv-core not installed"
)
needs_vf = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="verifiers not installed")

GEM = EnvConfig(kind="gem", gem={"game": "game:GuessTheNumber-v0-easy"}, heldout_size=16)
TA = EnvConfig(kind="gem", gem={"game": "textarena:GuessTheNumber-v0"}, heldout_size=16)
OPENENV = EnvConfig(
    kind="openenv", openenv={"path": "examples.openenv_guess:GuessNumberEnv"}, heldout_size=16
)
VF = EnvConfig(
    kind="verifiers", verifiers={"path": "examples.verifiers_arith:load_environment"}, heldout_size=16
)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # examples.* import from the repository root


def test_installing_the_ecosystem_packages_moves_none_of_asyncrls_pins() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for pin in pins:
        name, version = re.split(r"==", pin.split(";")[0].strip())
        installed = importlib.metadata.version(name).split("+")[0]  # torch: 2.13.0+cpu
        assert installed == version, f"{name} moved from its pin {version}"


def test_the_extras_install_without_dependencies_and_name_exact_versions() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["games"] == ["gem-llm==0.1.0", "textarena==0.7.4"]
    assert extras["openenv"] == ["openenv-core==0.3.0"]
    assert extras["verifiers"] == ["verifiers==0.3.1"]
    assert "--no-deps gem-llm==0.1.0" in (ROOT / "Makefile").read_text()


@needs_gem
def test_gem_game_builds_resets_steps_and_scores() -> None:
    env, source = make_raw_env(GEM), make_task_source(GEM)
    task = source.sample(random.Random(0))
    target = next(
        n for n in range(1, 11) if run_texts_sync(make_raw_env(GEM), task, [f"\\boxed{{{n}}}"])[0].reward == 1
    )
    first = run_texts_sync(
        env, task, [f"\\boxed{{{11 - target if target != 5 else 4}}}", f"\\boxed{{{target}}}"]
    )
    assert not first[0].done and ("higher" in first[0].observation or "lower" in first[0].observation)
    assert first[-1].done and first[-1].outcome == "success" and first[-1].reward == 1.0
    lost = run_texts_sync(make_raw_env(GEM), task, ["no number"])[-1]
    assert lost.done and lost.outcome == "failure" and lost.reward < 1.0


@needs_gem
def test_seed_split_is_disjoint_and_deterministic() -> None:
    source = make_task_source(GEM)
    held = {t.payload["seed"] for t in source.heldout()}
    assert len(held) == 16 and held == {t.payload["seed"] for t in make_task_source(GEM).heldout()}
    rng = random.Random(1)
    assert not held & {source.sample(rng).payload["seed"] for _ in range(2000)}


@needs_ta
def test_textarena_gives_the_latest_feedback_only() -> None:
    env, task = make_raw_env(TA), make_task_source(TA).sample(random.Random(0))
    results = run_texts_sync(env, task, ["[1]", "[20]", "[2]"])
    for res in results:
        assert res.observation.startswith("[GAME]") and "[Player]" not in res.observation
        assert "You are playing" not in res.observation and res.observation.count("[GAME]") == 1
    assert latest_feedback("a", "a\n[Player] [3]\n[GAME] lower") == "[GAME] lower"
    assert latest_feedback("x", "other") == "other"


@needs_ta
def test_textarena_game_ends_with_an_outcome() -> None:
    env, task = make_raw_env(TA), make_task_source(TA).sample(random.Random(0))
    res = run_texts_sync(env, task, [f"[{n}]" for n in range(1, 21)])
    assert res[-1].done and res[-1].outcome in ("success", "failure")


@needs_gem
def test_unsandboxed_code_envs_are_refused_and_python_runs_in_asyncrls_sandbox() -> None:
    with pytest.raises(UserError, match="without isolation"):
        make_raw_env(EnvConfig(kind="gem", gem={"game": "code:CodeContest"}))
    with pytest.raises(UserError, match="could not be made"):
        make_raw_env(EnvConfig(kind="gem", gem={"game": "game:NoSuchGame-v0"}))
    cfg = EnvConfig(kind="gem", gem={"game": "game:GuessTheNumber-v0-easy", "tools": ["python"]})
    env = make_raw_env(cfg)
    assert [t.name for t in env.tools] == ["python"]
    res = run_texts_sync(
        env, make_task_source(cfg).sample(random.Random(0)), ["<tool>python(print(6*7))</tool>"]
    )[0]
    assert res.tool_call is not None and res.tool_call.name == "python" and not res.done


def test_the_section_must_match_the_kind() -> None:
    with pytest.raises(ValueError, match=r"needs the env\.gem section"):
        EnvConfig(kind="gem")
    with pytest.raises(ValueError, match=r"set env\.kind: openenv"):
        EnvConfig(kind="calculator", openenv={"path": "a.b:C"})


@needs_openenv
def test_openenv_mcp_tools_are_listed_and_called_in_process() -> None:
    env, source = make_raw_env(OPENENV), make_task_source(OPENENV)
    assert [t.name for t in env.tools] == ["guess"]
    assert env.tools[0].parameters()["properties"]["number"]["type"] == "integer"
    task = source.sample(random.Random(0))
    texts = [f"<tool>guess({n})</tool>" for n in range(1, 17)]
    results = run_texts_sync(env, task, texts)
    assert all(r.tool_call is not None and r.tool_call.ok for r in results)
    assert results[-1].done and results[-1].outcome in ("success", "failure")
    wins = [
        run_texts_sync(make_raw_env(OPENENV), task, [f"<tool>guess({n})</tool>"])[0] for n in range(1, 17)
    ]
    assert sum(w.done and w.outcome == "success" and w.reward == 1.0 for w in wins) == 1
    bad = run_texts_sync(make_raw_env(OPENENV), task, ["<tool>guess(seven)</tool>", "<tool>nope(1)</tool>"])
    assert bad[0].tool_call is not None and not bad[0].tool_call.ok and "integer" in bad[0].observation
    assert bad[1].malformed and "unknown tool" in bad[1].observation
    assert call_arguments('{"number": 3}', {}) == {"number": 3}


@needs_openenv
def test_openenv_not_an_environment_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="not an OpenEnv Environment"):
        make_raw_env(EnvConfig(kind="openenv", openenv={"path": "random:Random"}))


@needs_vf
def test_verifiers_v0_single_turn_env_scores_with_its_rubric() -> None:
    env, source = make_raw_env(VF), make_task_source(VF)
    task = source.sample(random.Random(0))
    prompt = run_texts_sync(env, task, [])  # reset only
    assert prompt == []
    import asyncio

    text = asyncio.run(env.reset(task))
    a, b = map(int, re.findall(r"(\d+)\+(\d+)", text)[0])
    good = run_texts_sync(env, task, [f"<answer>{a + b}</answer>"])[0]
    bad = run_texts_sync(env, task, [f"<answer>{a + b + 1}</answer>"])[0]
    assert good.done and good.outcome == "success" and good.reward == 1.0
    assert bad.done and bad.outcome == "failure" and bad.reward == 0.0
    held = {t.id for t in source.heldout()}
    assert len(held) == 16 and not held & {source.sample(random.Random(2)).id for _ in range(500)}


@needs_vf
def test_verifiers_non_v0_environment_is_refused_with_the_gateway_recipe() -> None:
    with pytest.raises(UserError, match="through the gateway"):
        make_raw_env(EnvConfig(kind="verifiers", verifiers={"path": "random:Random"}))


@pytest.mark.parametrize("cfg", [GEM, TA, OPENENV, VF], ids=["gem", "textarena", "openenv", "verifiers"])
def test_env_check_passes_on_each_kind(cfg: EnvConfig) -> None:
    module = {"gem": "gem", "openenv": "openenv", "verifiers": "verifiers"}[cfg.kind]
    if cfg is TA:
        module = "textarena"
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed")
    report = check_environment(cfg, episodes=2, overlap_samples=100)
    assert report.ok, report.render()


@pytest.mark.parametrize("name", ["gem_guess", "openenv_guess", "verifiers_arith"])
def test_configs_load(name: str) -> None:
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert cfg.env.kind in ("gem", "openenv", "verifiers") and cfg.trainer.sft.steps == 0


@needs_openenv
def test_openenv_answer_calls_the_answer_tool_or_ends_the_episode() -> None:
    task = make_task_source(OPENENV).sample(random.Random(0))
    gave_up = run_texts_sync(make_raw_env(OPENENV), task, ["<answer>3</answer>"])[0]
    assert gave_up.done and gave_up.outcome == "failure" and gave_up.tool_call is None
    cfg = EnvConfig(
        kind="openenv", openenv={"path": "examples.openenv_guess:GuessNumberEnv", "answer_tool": "guess"}
    )
    via_tool = run_texts_sync(make_raw_env(cfg), task, ["<answer>3</answer>"])[0]
    assert via_tool.tool_call is not None and via_tool.tool_call.name == "guess"


@pytest.mark.parametrize("name", ["gem_guess", "openenv_guess", "verifiers_arith"])
def test_asyncrl_env_check_passes_on_each_config(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import main

    module = {"gem_guess": "gem", "openenv_guess": "openenv", "verifiers_arith": "verifiers"}[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed")
    assert main(["env", "check", str(ROOT / "configs" / f"{name}.yaml"), "--episodes", "2"]) == 0
    assert "Result: passed" in capsys.readouterr().out


def test_the_verifiers_v1_recipe_points_eval_at_the_gateway_and_reads_the_reward(tmp_path: Path) -> None:
    import importlib

    recipe = importlib.import_module("examples.verifiers_agent")
    argv = recipe.command("py", "my-env", "http://127.0.0.1:9/v1", "/out", 3)
    assert argv[argv.index("--client.base_url") + 1] == "http://127.0.0.1:9/v1" and "my-env" in argv
    assert recipe.reward_of(tmp_path) is None
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "traces.jsonl").write_text('{"reward": 0.5}\n')
    assert recipe.reward_of(tmp_path) == 0.5


@needs_gem
@needs_openenv
def test_gem_and_openenv_mix_in_one_run() -> None:
    cfg = EnvConfig(
        kind="mix",
        mix=[
            {
                "name": "guess",
                "weight": 1,
                "env": {"kind": "gem", "gem": {"game": "game:GuessTheNumber-v0-easy"}, "heldout_size": 4},
            },
            {
                "name": "mcp",
                "weight": 1,
                "env": {
                    "kind": "openenv",
                    "openenv": {"path": "examples.openenv_guess:GuessNumberEnv"},
                    "heldout_size": 4,
                },
            },
        ],
    )
    report = check_environment(cfg, episodes=4, overlap_samples=50)
    assert report.ok, report.render()
    held = make_task_source(cfg).heldout()
    assert len(held) == 8
