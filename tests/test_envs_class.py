"""``env.kind: class``: a TRL ``environment_factory`` class, unchanged, as an asyncrl environment —
tool schemas from signatures and docstrings, coerced arguments, tool errors as observations, the
reward function over the environment, the rows' held-out split, clear errors and ``env check``."""

from __future__ import annotations

import asyncio
import json
import random
import textwrap
from pathlib import Path
from typing import Any

import pytest

from asyncrl.cli import main as cli_main
from asyncrl.config import ConfigError, EnvConfig, load_config
from asyncrl.envs.base import Tool
from asyncrl.envs.check import check_environment
from asyncrl.envs.class_tools import ToolArgsError, class_tools
from asyncrl.envs.imports import EnvPluginError
from asyncrl.envs.registry import ADAPTERS, env_where, make_env, make_raw_env, make_task_source
from asyncrl.envs.wrappers import EnvWrapper
from asyncrl.policy.toolcalls import HermesFormat, args_text
from helpers import run_texts_sync

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "trl_env"

# A class in TRL's docs style: reset(**row), public methods with Google-style docstrings, a private helper.
TRL_STYLE = '''
from __future__ import annotations


class Guess:
    def __init__(self) -> None:
        self.secret = 0
        self.tries = 0
        self.won = False

    def reset(self, **kwargs) -> str | None:
        self.secret, self.tries, self.won = int(kwargs["secret"]), 0, False
        return " Guess it." if kwargs.get("hint") else None

    def guess(self, number: int) -> str:
        """
        Guess the secret number.

        Args:
            number: The guess.

        Returns:
            higher, lower or correct.
        """
        self.tries += 1
        if number == self.secret:
            self.won = True
            return "correct"
        return "higher" if number < self.secret else "lower"

    def scale(self, values: list[int], factor: float = 1.0) -> list[float]:
        """
        Scale numbers.

        Args:
            values: The numbers.
            factor: The factor.
        """
        return [v * factor for v in values]

    def boom(self, why: str) -> str:
        """
        Fail on purpose.

        Args:
            why: The reason.
        """
        raise RuntimeError(f"boom: {why}")

    async def wait(self, seconds: float) -> str:
        """
        Wait a little (an async tool).

        Args:
            seconds: How long.
        """
        return f"waited {seconds}"

    def _helper(self) -> int:
        return 7

    def get_reward(self) -> float:
        return 0.5 if self.won else 0.0


SEEN: list = []


def reward_func(environments, completions, secret, **kwargs) -> list[float]:
    SEEN.append({"completions": completions, "secret": secret, "keys": sorted(kwargs)})
    return [1.0 if env.won and env.tries <= 2 else 0.0 for env in environments]
'''


@pytest.fixture
def guess_env(tmp_path: Path) -> tuple[Path, Path]:
    mod = tmp_path / "guess_env.py"
    mod.write_text(TRL_STYLE)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"prompt": f"Find the number #{i}.", "secret": i % 10, "hint": (i // 10) % 2}) + "\n"
            for i in range(200)
        )
    )
    return mod, rows


def cfg_of(mod: Path, rows: Path, **section: Any) -> EnvConfig:
    c = {"factory": f"{mod}:Guess", "reward": f"{mod}:reward_func", "rows": str(rows), **section}
    return EnvConfig(kind="class", heldout_size=8, class_env=c)


def task_with(cfg: EnvConfig, **row: Any) -> Any:
    source = make_task_source(cfg)
    return next(t for t in source.train if all(t.payload["row"][k] == v for k, v in row.items()))


def _wrappers(env: Any) -> list[str]:
    names = []
    while isinstance(env, EnvWrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_a_class_env_is_timed_as_grading_and_a_builtin_grading_itself_is_not(
    guess_env: tuple[Path, Path],
) -> None:
    """``Adapter.grades_itself``: a TRL class's final step is timed as its answer check (AnswerCostWrapper);
    a built-in grades through the verifier cache itself, so it gets no such wrapper."""
    assert ADAPTERS["class"].grades_itself is False
    assert env_where(cfg_of(*guess_env)) == "env.class_env"  # messages name the kind's section
    assert _wrappers(make_env(cfg_of(*guess_env), rng_seed=0)) == ["GuardedEnv", "AnswerCostWrapper"]
    assert _wrappers(make_env(EnvConfig(kind="calculator"), rng_seed=0)) == ["GuardedEnv"]


def test_a_class_env_has_demonstrations_exactly_when_its_rows_or_demonstrator_give_them(
    guess_env: tuple[Path, Path],
) -> None:
    """``trainer.sft.source: auto`` warm-starts from a class's ``demo_field`` (ClassEnv itself has no
    ``demonstrate``; the built DemoClassEnv has)."""
    from asyncrl.jobs.warm_start import has_demonstrations

    assert has_demonstrations(cfg_of(*guess_env, demo_field="secret"))
    assert not has_demonstrations(cfg_of(*guess_env))


def test_tools_are_the_public_methods_with_schemas_from_signature_and_docstring(
    guess_env: tuple[Path, Path],
) -> None:
    env = make_raw_env(cfg_of(*guess_env))
    assert [t.name for t in env.tools] == ["boom", "guess", "scale", "wait"]  # not reset, get_reward, _helper
    guess = next(t for t in env.tools if t.name == "guess")
    assert guess.description == "Guess the secret number."
    assert guess.parameters() == {
        "type": "object",
        "properties": {"number": {"type": "integer", "description": "The guess."}},
        "required": ["number"],
    }
    scale = next(t for t in env.tools if t.name == "scale")
    assert scale.parameters()["required"] == ["values"]
    assert scale.parameters()["properties"]["values"] == {
        "type": "array",
        "items": {"type": "integer"},
        "description": "The numbers.",
    }


def test_a_method_without_documented_arguments_is_refused_in_words() -> None:
    class Bad:
        def reset(self, **kwargs: Any) -> None: ...

        def act(self, x: int) -> int:
            """Do it."""
            return x

    with pytest.raises(EnvPluginError, match=r"method 'act' cannot be a tool: .*'x'.*Args:"):
        class_tools(Bad(), "Bad")


def test_arguments_are_coerced_to_their_annotated_types(guess_env: tuple[Path, Path]) -> None:
    env = make_raw_env(cfg_of(*guess_env))
    tools = env._tools
    assert tools["guess"].arguments("7") == {"number": 7}
    assert tools["guess"].arguments('{"number": "7"}') == {"number": 7}
    assert tools["scale"].arguments('{"values": ["1", 2], "factor": "2.5"}') == {
        "values": [1, 2],
        "factor": 2.5,
    }
    assert tools["scale"].arguments("[1, 2]") == {"values": [1, 2]}  # plain text: the one required argument
    assert tools["boom"].arguments('{"a": 1}') == {"why": '{"a": 1}'}  # a str argument keeps the text
    with pytest.raises(ToolArgsError, match=r"argument 'number'.*integer"):
        tools["guess"].arguments("seven")
    with pytest.raises(ToolArgsError, match=r"unknown argument\(s\) \['size'\]"):
        tools["scale"].arguments('{"values": [1], "size": 3}')
    with pytest.raises(ToolArgsError, match=r"missing argument\(s\) \['values'\]"):
        tools["scale"].arguments('{"factor": 2}')


def test_a_tool_of_several_parameters_gets_a_json_object_from_a_native_call() -> None:
    two = Tool("add", "", parameters_schema={"type": "object", "properties": {"amount": {}, "times": {}}})
    one = Tool("guess", "", parameters_schema={"type": "object", "properties": {"number": {}}})
    assert args_text(two, {"amount": 5}) == '{"amount":5}'  # was the bare 5: which parameter?
    assert args_text(one, {"number": 5}) == "5"
    text = '<tool_call>\n{"name": "add", "arguments": {"amount": 5}}\n</tool_call>'
    assert HermesFormat().to_action(text, [two]) == '<tool>add({"amount":5})</tool>'


def test_episode_tool_errors_are_observations_and_the_reward_is_the_functions_plus_get_reward(
    guess_env: tuple[Path, Path],
) -> None:
    cfg = cfg_of(*guess_env)
    env = make_raw_env(cfg)
    task = task_with(cfg, secret=3, hint=1)
    texts = ["<tool>boom(x)</tool>", "<tool>guess(abc)</tool>", "<tool>guess(3)</tool>", "<answer>3</answer>"]
    boom, bad, ok, final = run_texts_sync(env, task, texts)
    assert boom.observation == "error: RuntimeError: boom: x" and not boom.done and not boom.malformed
    assert (
        boom.tool_call is not None
        and boom.tool_call.ok is False
        and boom.tool_call.error.startswith("RuntimeError")
    )
    assert bad.tool_call is not None and not bad.tool_call.ok and "integer" in bad.observation
    assert ok.observation == "correct" and ok.tool_call is not None and ok.tool_call.ok
    # reward_func: won in 2 guesses -> 1.0; get_reward: 0.5; TRL sums the sources
    assert final.done and final.reward == 1.5 and final.outcome == "success"
    seen = env.reward_fn.__globals__["SEEN"][-1]
    assert seen["secret"] == [3]
    assert {"prompts", "completion_ids", "hint", "trainer_state", "log_metric"} <= set(seen["keys"])
    assert "prompt" not in seen["keys"]  # TRL passes the prompt column as `prompts` only
    completion = seen["completions"][0]
    assert [m["role"] for m in completion] == ["assistant", "tool"] * 3 + ["assistant"]
    assert completion[-1]["content"] == "3" and completion[5]["content"] == "correct"


def test_reset_returns_text_appended_to_the_prompt_and_success_needs_success_reward(
    guess_env: tuple[Path, Path],
) -> None:
    cfg = cfg_of(*guess_env, success_reward=2.0)
    env = make_raw_env(cfg)
    hinted, plain = task_with(cfg, secret=4, hint=1), task_with(cfg, secret=4, hint=0)
    assert asyncio.run(env.reset(hinted)) == hinted.payload["prompt"] + " Guess it."
    assert asyncio.run(env.reset(plain)) == plain.payload["prompt"]
    _, wrong, done = run_texts_sync(
        env, hinted, ["<tool>guess(4)</tool>", "<tool>wait(0.5)</tool>", "<answer>4</answer>"]
    )
    assert wrong.observation == "waited 0.5"  # an async tool
    assert done.reward == 1.5 and done.outcome == "failure"  # below success_reward 2.0
    again = asyncio.run(env.step("<answer>4</answer>"))
    assert again.done and again.reward == 1.5 and again.info == {"after_done": True}


def test_unknown_tool_and_no_action_are_malformed(guess_env: tuple[Path, Path]) -> None:
    cfg = cfg_of(*guess_env)
    env = make_raw_env(cfg)
    unknown, junk = run_texts_sync(env, task_with(cfg, secret=1), ["<tool>_helper()</tool>", "hello"])
    assert unknown.malformed and "unknown tool '_helper'" in unknown.observation and unknown.tool_call is None
    assert junk.malformed and not junk.done


def test_rows_split_held_out_by_content_or_by_column(tmp_path: Path, guess_env: tuple[Path, Path]) -> None:
    mod, rows = guess_env
    source = make_task_source(cfg_of(mod, rows))
    held = source.heldout()
    assert len(held) == 8 and {t.task_type for t in held} == {"class"}
    keys = {source.content_key(t) for t in held}
    assert not keys & {source.content_key(t) for t in source.train}
    assert all(not source.is_heldout(source.sample(random.Random(i))) for i in range(50))
    split = tmp_path / "split.jsonl"
    lines = [{"prompt": "p", "secret": i, "split": "test" if i < 10 else "train"} for i in range(30)]
    lines.append(
        {"prompt": "p", "secret": 3, "split": "train"}
    )  # a held-out row's twin: dropped from training
    split.write_text("".join(json.dumps(r) + "\n" for r in lines))
    source = make_task_source(cfg_of(mod, split, split_field="split"))
    assert sorted(t.payload["row"]["secret"] for t in source.heldout()) == list(range(8))
    assert len(source.train) == 20 and source.dropped == 1


def test_clear_errors_for_config_mistakes(guess_env: tuple[Path, Path], tmp_path: Path) -> None:
    mod, rows = guess_env
    with pytest.raises(ValueError, match=r"env.kind 'class' needs the env.class_env section"):
        EnvConfig(kind="class")
    with pytest.raises(ValueError, match=r"env.class_env is set but env.kind is 'dataset'"):
        EnvConfig(kind="dataset", dataset={"path": "x.jsonl"}, class_env={"factory": "a:B", "rows": "r"})
    base = ["env.kind=class", f"env.class_env.factory={mod}:Guess", f"env.class_env.rows={rows}"]
    with pytest.raises(
        ConfigError, match=r"set trainer.sft.source: rollouts.*demo_field.*trainer.sft.steps: 0"
    ):
        load_config(None, [*base, "trainer.sft.source=demos"])
    assert load_config(None, base).trainer.sft.source == "auto"  # no demonstrations: auto plays rollouts
    assert load_config(None, [*base, "trainer.sft.steps=0"]).env.class_env is not None
    assert load_config(None, [*base, "env.class_env.demo_field=secret"]).env.class_env is not None
    no_reward = EnvConfig(kind="class", class_env={"factory": f"{mod}:SEEN", "rows": str(rows)})
    with pytest.raises(EnvPluginError, match=r"env.class_env.factory .* is a list, not a class"):
        make_raw_env(no_reward)
    plain = tmp_path / "plain.py"
    plain.write_text("class P:\n    def reset(self, **kw):\n        return None\n")
    with pytest.raises(EnvPluginError, match=r"no reward source: set env.class_env.reward"):
        make_raw_env(EnvConfig(kind="class", class_env={"factory": f"{plain}:P", "rows": str(rows)}))
    with pytest.raises(EnvPluginError, match=r"env.class_env.factory: file 'nope.py' does not exist"):
        make_raw_env(EnvConfig(kind="class", class_env={"factory": "nope.py:P", "rows": str(rows)}))
    with pytest.raises(EnvPluginError, match=r"row 0 has no field 'answer'"):
        make_task_source(cfg_of(mod, rows, demo_field="answer"))
    with pytest.raises(EnvPluginError, match=r"env.class_env.rows '.*missing.jsonl' does not exist"):
        make_task_source(cfg_of(mod, tmp_path / "missing.jsonl"))


def test_the_example_passes_env_check_and_its_demonstrations_succeed() -> None:
    cfg = load_config(ROOT / "configs" / "trl_class.yaml").env
    report = check_environment(
        cfg, episodes=2, warm_start=load_config(ROOT / "configs" / "trl_class.yaml").trainer.sft
    )
    assert report.ok, report.render()
    text = report.render()
    assert "demonstrate: clean demonstrations succeeded" in text and "tools: add, read" in text
    env = make_env(cfg, 0)
    source = make_task_source(cfg)
    rng = random.Random(0)
    outcomes = []
    for _ in range(40):
        task = source.sample(rng)
        results = run_texts_sync(env, task, env.demonstrate(task, rng, 1.0))
        outcomes.append(results[-1].outcome)
    # corruption rate 1: a number changed in the tool call; a task that needs no call has none to change
    assert outcomes.count("failure") >= 30


def test_cli_env_check_requires_a_demonstrator_only_when_the_run_warm_starts(
    guess_env: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mod, rows = guess_env
    config = tmp_path / "run.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            env:
              kind: class
              heldout_size: 8
              class_env: {{factory: "{mod}:Guess", reward: "{mod}:reward_func", rows: "{rows}"}}
            trainer:
              sft: {{steps: 0}}
            """
        )
    )
    assert cli_main(["env", "check", str(config)]) == 0
    assert "no demonstrate()" in capsys.readouterr().out
    assert (
        cli_main(
            [
                "env",
                "check",
                str(config),
                "--set",
                "env.class_env.demo_field=secret",
                "--set",
                "trainer.sft.steps=5",
            ]
        )
        == 1
    )
    out = capsys.readouterr().out
    assert "FAIL  demonstrate" in out  # the answer alone does not win: the reference episode fails


def test_a_conversational_prompt_column_or_none_at_all(guess_env: tuple[Path, Path], tmp_path: Path) -> None:
    mod, _ = guess_env
    rows = tmp_path / "chat.jsonl"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Find it."}]
    rows.write_text("".join(json.dumps({"prompt": chat, "secret": i, "hint": 1}) + "\n" for i in range(100)))
    cfg = cfg_of(mod, rows)
    env = make_raw_env(cfg)
    task = make_task_source(cfg).train[0]
    assert asyncio.run(env.reset(task)) == "Be brief.\n\nFind it. Guess it."
    assert env._prompt == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Find it. Guess it."},
    ]
    cfg = cfg_of(mod, rows, prompt_field=None)
    assert asyncio.run(make_raw_env(cfg).reset(make_task_source(cfg).train[0])) == " Guess it."
