"""The model families users bring, each as a tiny model carrying the family's real chat template,
special tokens and published ``generation_config`` end ids (``tests/families.py`` says where each
template text comes from): what the template probe finds, what the one preflight (``asyncrl
train`` and ``asyncrl model info``) decides, a 2-step ``asyncrl train`` per family, and the
family table of ``docs/models.md``, which these tests generate and check — every column, the
exactness one recomputed from scripted episodes on the renderer ``train`` builds (the 2-step train
of ``make test-models`` must agree with it).

Families ``train`` still refuses are ``xfail(strict=True)`` with the missing piece named, so the
change that makes one train flips its test (and the table must then be regenerated:
``python tests/test_families.py``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import ModelConfig, load_config
from asyncrl.errors import UserError
from asyncrl.policy.chat import Renderer
from asyncrl.policy.preflight import preflight_model
from asyncrl.policy.template_probe import probe_template
from asyncrl.rollout.heldout import retokenization_stats
from families import FAMILIES, build_tokenizer, end_ids, write_family_model
from helpers import TWO_STEPS
from models_util import REPO, load_tokenizer, smollm2_dir
from test_families_render import call_text, play, sampled

DOC = REPO / "docs" / "models.md"
BEGIN, END = "<!-- families table: begin (python tests/test_families.py) -->", "<!-- families table: end -->"

# What train needs and does not have yet, per family it refuses (none since the renderer work of #25).
REFUSED: dict[str, str] = {}
SMALL = [*TWO_STEPS, "trainer.checkpoint_every=2", "algo.kl_coef=0"]


@pytest.fixture(scope="module")
def base() -> Any:
    return load_tokenizer(smollm2_dir())


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory, base: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: write_family_model(root / name, name, base=base) for name in FAMILIES}


# ---------------------------------------------------------------------------------------------
# the template probe reads what each published template does
# ---------------------------------------------------------------------------------------------
EXPECTED_PROBE: dict[str, dict[str, Any]] = {
    "smollm2": {"system_supported": True, "tool_role": False, "prefix_stable": True, "trims_content": False},
    "qwen25": {
        "tool_role": True,
        "prefix_stable": True,
        "renders_tools": True,
        "tool_markers": ("<tool_call>",),
    },
    "qwen3": {"prefix_stable": False, "strips_reasoning": True, "renders_tools": True},
    "llama31": {"tool_role": True, "prefix_stable": True, "trims_content": True, "turn_end": "<|eot_id|>"},
    "llama32": {"tool_role": True, "prefix_stable": True, "trims_content": True, "turn_end": "<|eot_id|>"},
    "mistral_v03": {
        "prefix_stable": False,
        "tool_call_id_length": 9,
        "trims_content": True,
        "turn_end": "</s>",
    },
    "gemma2": {"system_supported": False, "tool_role": False, "trims_content": True},
    "gemma3": {
        "system_supported": True,
        "prefix_stable": True,
        "trims_content": True,
        "turn_end": "<end_of_turn>",
    },
    "phi35_mini": {"prefix_stable": True, "tool_role": False, "turn_end": "<|end|>"},
    "phi4_mini": {"renders_tools": False, "turn_end": "<|end|>"},
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_probe_reads_each_published_template(name: str, base: Any) -> None:
    tok = build_tokenizer(name, base)
    profile = probe_template(tok, end_ids(tok, name))
    for key, want in EXPECTED_PROBE[name].items():
        got = profile.turn_end_text if key == "turn_end" else getattr(profile, key)
        assert got == want, (name, key, profile)


def test_every_end_id_counts_and_the_one_the_template_writes_closes_a_turn(
    family_dirs: dict[str, Path],
) -> None:
    """Gemma 3 publishes ``eos_token_id: [<eos>, <end_of_turn>]``; its template closes a turn with
    ``<end_of_turn>``, so that is the turn end, and both ids stop sampling."""
    plan = preflight_model(ModelConfig(path=str(family_dirs["gemma3"])))
    assert plan is not None
    gen = json.loads((family_dirs["gemma3"] / "generation_config.json").read_text())["eos_token_id"]
    assert len(gen) == 2 and plan.turn_end == "<end_of_turn>"
    assert sorted(plan.end_ids) == sorted(gen) and plan.renderer.turn_end_ids() == [gen[1]]


def _eos_only(gemma3: Path, d: Path) -> Path:
    """A copy of the Gemma 3 directory whose generation config lists only ``<eos>``."""
    import shutil

    shutil.copytree(gemma3, d)
    gen = json.loads((d / "generation_config.json").read_text())
    gen["eos_token_id"] = gen["eos_token_id"][0]  # <eos> only: the template closes turns with <end_of_turn>
    (d / "generation_config.json").write_text(json.dumps(gen))
    return d


def test_a_template_closing_turns_with_no_end_id_is_refused_naming_the_id_to_add(
    family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    d = _eos_only(family_dirs["gemma3"], tmp_path / "gemma3-eos-only")
    with pytest.raises(UserError, match=r"closes an assistant turn with '<end_of_turn>.*add that token's id"):
        preflight_model(ModelConfig(path=str(d)))


# ---------------------------------------------------------------------------------------------
# the one preflight: model info prints what train will do, or train's error
# ---------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_model_info_prints_the_plan_train_uses_or_its_error(
    family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    ok = _cli("model", "info", str(family_dirs["llama31"]))
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"tool_format: llama3_json", ok.stdout) and "observation_role: tool" in ok.stdout
    assert "multi_turn: bridge" in ok.stdout and "preflight: ok" in ok.stdout
    qwen3 = _cli("model", "info", str(family_dirs["qwen3"]))
    assert qwen3.returncode == 0 and "multi_turn: per_turn (the template is not prefix-stable" in qwen3.stdout
    gemma2 = _cli("model", "info", str(family_dirs["gemma2"]), "--json")
    assert gemma2.returncode == 0 and json.loads(gemma2.stdout)["system"] == "folded into the first user turn"
    bad = _eos_only(family_dirs["gemma3"], tmp_path / "gemma3-eos-only")  # no end id closes a turn
    refused = _cli("model", "info", str(bad), "--json")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    error = json.loads(refused.stdout)["preflight"]
    assert error.startswith("error: ") and "add that token's id" in error and "\n" not in error
    assert refused.stderr.strip() == f"asyncrl: error: {error.removeprefix('error: ')}"
    with pytest.raises(UserError, match="add that token's id"):  # train's own preflight says the same
        preflight_model(ModelConfig(path=str(bad)))
    as_user = _cli(
        "model", "info", str(family_dirs["qwen25"]), "--set", "model.observation_role=user", "--json"
    )
    assert as_user.returncode == 0 and json.loads(as_user.stdout)["observation_role"] == "user"


def test_a_context_too_small_for_one_turn_is_an_error_before_a_run_directory(
    family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from asyncrl.jobs.train import train

    runs = tmp_path / "runs"
    cfg = load_config(
        None, [*SMALL, "model.max_context=140", f"model.path={family_dirs['smollm2']}", f"run_root={runs}"]
    )
    with pytest.raises(UserError, match=r"leaves \d+ tokens after the longest episode opening") as err:
        train(cfg, display=False, eval_limit=2)
    assert "rollout.sampling.max_new_tokens=16" in str(err.value) and "\n" not in str(err.value)
    assert not runs.exists() or not any(runs.iterdir())


# ---------------------------------------------------------------------------------------------
# a 2-step asyncrl train per family, and the table of docs/models.md
# ---------------------------------------------------------------------------------------------
def family_row(name: str, directory: Path, exactness: str | None = None) -> str:
    """One row of the family table: loads, multi-turn mode, tool format, observation role,
    exactness (default: :func:`scripted_exactness` on the renderer the preflight builds), and what
    the probe found in the template."""
    title = FAMILIES[name].title
    try:
        plan = preflight_model(ModelConfig(path=str(directory)))
    except UserError as exc:
        reason = str(exc).split(": ", 1)[1].split(" [template probe")[0]
        return f"| {title} | no: {reason} | — | — | — | — | {_notes(name, directory)} |"
    assert plan is not None
    mode = plan.multi_turn.split(" ")[0]
    exactness = exactness if exactness is not None else scripted_exactness(name, plan.renderer)
    return (
        f"| {title} | yes | {mode} | {plan.tool_format} | {plan.observation_role} | {exactness} "
        f"| {_notes(name, directory)} |"
    )


def exactness_cell(rate: float | None, unchecked: int) -> str:
    """The exactness column: the token-exact share of the checked samples, the unchecked beside it."""
    return f"{'—' if rate is None else f'{rate:.2f}'} ({unchecked} unchecked)"


def scripted_exactness(name: str, r: Renderer) -> str:
    """Exactness of scripted tool episodes on ``r`` (calls in the family's format, reasoning for
    Qwen3, unicode and padded observations, a turn cut short before its end token): each sample
    checked against the template's own rendering, as in a run."""
    episodes = [
        (
            [
                sampled(r, call_text(name, r, "x")),
                sampled(r, call_text(name, r, "ünïcödé")),
                sampled(r, "<answer>42</answer>"),
            ],
            ["x = 41", "  padded result \n\n"],
            "stop",
        ),
        (
            [sampled(r, call_text(name, r, "x"), close=False), sampled(r, "<answer>1</answer>")],
            ["v"],
            "length",
        ),
    ]
    trajs = [t for turns, obs, finish in episodes for t in play(r, turns, obs, finish=finish)[0]]
    stats = retokenization_stats(trajs)
    return exactness_cell(stats["token_exact_rate"], stats["token_exact_unchecked"])


def _notes(name: str, directory: Path) -> str:
    tok = load_tokenizer(directory)
    pr = probe_template(tok, end_ids(tok, name))
    notes = [f"ends a turn with `{pr.turn_end_text}`"] if pr.turn_end_text else ["no end id closes a turn"]
    notes += ["no system role"] if not pr.system_supported else []
    notes += ["not prefix-stable"] if not pr.prefix_stable else []
    notes += ["strips `<think>`"] if pr.strips_reasoning else []
    notes += ["trims content"] if pr.trims_content else []
    notes += [f"markers {', '.join(f'`{m}`' for m in pr.tool_markers)}"] if pr.tool_markers else []
    notes += [f"{pr.tool_call_id_length}-char tool ids"] if pr.tool_call_id_length else []
    return "; ".join(notes)


def doc_rows() -> dict[str, str]:
    """The family rows of docs/models.md, by family title."""
    text = DOC.read_text()
    table = text[text.index(BEGIN) : text.index(END)]
    return {
        line.split(" | ")[0][2:]: line
        for line in table.splitlines()
        if line.startswith("| ") and " | " in line
    }


def _train_two_steps(directory: Path, tmp_path: Path) -> dict[str, Any]:
    from asyncrl.jobs.train import train

    cfg = load_config(
        None, [*SMALL, f"model.path={directory}", f"run_root={tmp_path}", f"cache_dir={tmp_path / 'c'}"]
    )
    _, summary = train(cfg, display=False, eval_limit=2)
    return summary


def _family_params() -> list[Any]:
    out = []
    for name in FAMILIES:
        marks = (
            [pytest.mark.xfail(raises=UserError, strict=True, reason=REFUSED[name])]
            if name in REFUSED
            else []
        )
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.slow
@pytest.mark.realmodel  # make test-models: 1-4 min a family on two shared cores (role processes start)
@pytest.mark.parametrize("name", _family_params())
def test_two_steps_of_asyncrl_train_per_family(
    name: str, family_dirs: dict[str, Path], tmp_path: Path
) -> None:
    summary = _train_two_steps(family_dirs[name], tmp_path)
    assert summary["trainer_steps"] == 2 and summary["lost_trajectories"] == 0
    assert summary["token_exact_checked"] > 0 and summary["token_exact_rate"] == 1.0
    cell = exactness_cell(summary["token_exact_rate"], summary["token_exact_unchecked"])
    row = family_row(name, family_dirs[name], cell)  # the train agrees with the scripted episodes
    assert doc_rows().get(FAMILIES[name].title) == row, (
        "docs/models.md is stale (python tests/test_families.py), or the 2-step train's exactness "
        "differs from the scripted episodes'"
    )


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_family_table_in_the_docs_is_current(name: str, family_dirs: dict[str, Path]) -> None:
    """Every column recomputed: loads / mode / tool format / role / notes from the preflight, the
    exactness from scripted episodes on the preflight's renderer — nothing read back from the doc."""
    row = doc_rows().get(FAMILIES[name].title, "")
    assert row.split(" | ") == family_row(name, family_dirs[name]).split(" | "), (
        "docs/models.md is stale: python tests/test_families.py"
    )


def write_table(tmp: Path) -> str:
    """Regenerate the table: preflight every family, scripted episodes on the ones that load."""
    rows = ["| family | loads | multi-turn | tool format | observation role | exactness | template |"]
    rows.append("|---|---|---|---|---|---|---|")
    for name in FAMILIES:
        rows.append(family_row(name, write_family_model(tmp / name, name)))
    text = DOC.read_text()
    table = "\n".join([BEGIN, *rows, END])
    DOC.write_text(text[: text.index(BEGIN)] + table + text[text.index(END) + len(END) :])
    return table


if __name__ == "__main__":  # python tests/test_families.py: regenerate the table of docs/models.md
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(write_table(Path(tmp)))
