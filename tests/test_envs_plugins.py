"""Plugin loading (clear errors, no tracebacks needed) and ``check_environment``.

The plugin classes below are loaded by import path ``f"{__name__}:ClassName"``, exactly as a
user's ``env.path`` would name them. ``BrokenEnv`` is the deliberately broken example.
"""

from __future__ import annotations

import asyncio
import random
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import EnvConfig
from asyncrl.envs import (
    EnvPluginError,
    GuardedEnv,
    HashSplitTaskSource,
    StepResult,
    Tool,
    check_environment,
    load_plugin,
    make_env,
    make_task_source,
)
from asyncrl.records import Task


# ---------------------------------------------------------------------------------------------
# Example plugins
# ---------------------------------------------------------------------------------------------
class EchoTasks(HashSplitTaskSource):
    task_types = ("echo",)
    difficulties = (1, 2)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = "".join(rng.choice("abcdefgh") for _ in range(3 * difficulty))
        return Task(id=f"echo-{word}", task_type="echo", difficulty=difficulty, payload={"word": word})

    def content_key(self, task: Task) -> str:
        return str(task.payload["word"])


class EchoEnv:
    """A well-behaved plugin: answer with the word; ``shout`` upper-cases its argument."""

    def __init__(self, suffix: str = "") -> None:
        self.suffix = suffix
        self.tools = [Tool("shout", "upper-case text", {"type": "string", "example": "hi"})]
        self.word = ""

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> EchoTasks:
        return EchoTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)

    @staticmethod
    def solve(task: Task) -> list[str]:
        return [f"<answer>{task.payload['word']}</answer>"]

    async def reset(self, task: Task) -> str:
        self.word = task.payload.get("word", "")
        return f"Say {self.word}{self.suffix}"

    async def step(self, model_text: str) -> StepResult:
        if model_text.startswith("<tool>shout("):
            return StepResult(observation=model_text[12:-8].upper(), process_reward=0.1)
        if model_text.startswith("<answer>"):
            ok = model_text[8:-9] == self.word
            return StepResult(
                observation="", done=True, reward=float(ok), outcome="success" if ok else "failure"
            )
        return StepResult(observation="error: malformed", process_reward=-0.1)


class SyncEchoEnv(EchoEnv):
    """The same, written synchronously."""

    def reset(self, task: Task) -> str:  # type: ignore[override]
        return asyncio.run(EchoEnv.reset(self, task))

    def step(self, model_text: str) -> StepResult:  # type: ignore[override]
        return asyncio.run(EchoEnv.step(self, model_text))


class OverlappingTasks:
    """Violates the split: held-out tasks come from the same pool as training tasks."""

    task_types = ("x",)
    difficulties = (1,)

    def sample(self, rng: random.Random, difficulty: int | None = None) -> Task:
        return Task(id=f"t{rng.randrange(5)}", task_type="x", difficulty=1)

    def heldout(self) -> list[Task]:
        return [Task(id=f"t{i}", task_type="x", difficulty=1) for i in range(3)]


class BrokenEnv:
    """Deliberately broken: bad tool name, non-ASCII prompt, a step returning a dict, a NaN
    process reward, answers that never end the episode, and an overlapping held-out split."""

    def __init__(self) -> None:
        self.tools = [Tool("bad name", "a tool with a space in its name")]

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> OverlappingTasks:
        return OverlappingTasks()

    async def reset(self, task: Task) -> str:
        return "Löse die Aufgabe"

    async def step(self, model_text: str) -> Any:
        if model_text.startswith("<tool>"):
            return {"observation": "not a StepResult"}
        if model_text.startswith("<answer>"):
            return StepResult(observation="keep going")
        return StepResult(observation="hm", process_reward=float("nan"))


class CrashingEnv(EchoEnv):
    async def reset(self, task: Task) -> str:
        raise KeyError("payload has no 'question'")


class HangingEnv(EchoEnv):
    def step(self, model_text: str) -> StepResult:  # type: ignore[override]
        time.sleep(30)  # a blocking synchronous step
        raise AssertionError


class SlowToolEnv(EchoEnv):
    """Its tool awaits (does not block) for a while: slow, but harmless to other episodes."""

    async def step(self, model_text: str) -> StepResult:
        if model_text.startswith("<tool>"):
            await asyncio.sleep(0.4)
        return await EchoEnv.step(self, model_text)


class BlockingStepEnv(EchoEnv):
    """``time.sleep`` inside ``async def step``: blocks the event loop, and every episode with it."""

    async def step(self, model_text: str) -> StepResult:
        if model_text.startswith("<tool>"):
            time.sleep(0.4)
        return await EchoEnv.step(self, model_text)


class DemoEnv(EchoEnv):
    """A reference demonstrator for the warm start (plus the solver inherited from EchoEnv); its
    task source follows the configured difficulty range."""

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> EchoTasks:
        return EchoTasks.from_config(cfg)  # type: ignore[return-value]

    @staticmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        wrong = rng.random() < corruption_rate
        return [f"<answer>{'x' if wrong else task.payload['word']}</answer>"]


class OptionsEnv(EchoEnv):
    """Needs a constructor option."""

    def __init__(self, n: int) -> None:
        super().__init__(suffix="!" * n)


class NoTaskSourceEnv:
    def __init__(self) -> None:
        self.tools: list[Tool] = []

    async def reset(self, task: Task) -> str:
        return "hi"

    async def step(self, model_text: str) -> StepResult:
        return StepResult(observation="", done=True, outcome="failure")


class NoToolsAttr:
    async def reset(self, task: Task) -> str:
        return "hi"

    async def step(self, model_text: str) -> StepResult:
        return StepResult(observation="")


NOT_A_CLASS = 42


class NotAnEnv:
    def reset(self) -> None: ...


def path(name: str) -> str:
    return f"{__name__}:{name}"


# ---------------------------------------------------------------------------------------------
# Loading errors
# ---------------------------------------------------------------------------------------------
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    ("plugin_path", "message"),
    [
        ("no_colon_here", "must look like 'package.module:ClassName'"),
        ("a:b:c", "must look like"),
        ("surely_missing_pkg_xyz.env:Env", "module 'surely_missing_pkg_xyz.env' not found"),
        (f"{__name__}:EchoEnvv", "has no attribute 'EchoEnvv' (did you mean EchoEnv"),
        (f"{__name__}:NOT_A_CLASS", "is a int, not an environment class"),
        (f"{__name__}:NotAnEnv", "has no step method"),
    ],
)
def test_load_plugin_errors_are_clear(plugin_path: str, message: str) -> None:
    with pytest.raises(EnvPluginError) as info:
        load_plugin(plugin_path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_import_problems_inside_the_plugin_are_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_module(tmp_path, monkeypatch, "plug_needs_dep", "import surely_missing_dep_xyz\nclass Env: ...\n")
    write_module(tmp_path, monkeypatch, "plug_syntax", "def broken(:\n    pass\n")
    write_module(tmp_path, monkeypatch, "plug_raises", "raise RuntimeError('no GPU here')\n")
    with pytest.raises(EnvPluginError, match="needs module 'surely_missing_dep_xyz'"):
        load_plugin("plug_needs_dep:Env")
    with pytest.raises(EnvPluginError, match=r"syntax error in .*plug_syntax.py, line 1"):
        load_plugin("plug_syntax:Env")
    with pytest.raises(EnvPluginError, match="RuntimeError: no GPU here"):
        load_plugin("plug_raises:Env")


def test_construction_and_task_source_errors() -> None:
    bad_opts = EnvConfig(kind="plugin", path=path("EchoEnv"), options={"nope": 1})
    with pytest.raises(EnvPluginError, match=r"could not construct .* with env.options"):
        make_env(bad_opts, 0)
    with pytest.raises(EnvPluginError, match="needs a 'tools' list"):
        make_env(EnvConfig(kind="plugin", path=path("NoToolsAttr")), 0)
    with pytest.raises(
        EnvPluginError, match="provides no task source: define a classmethod make_task_source"
    ):
        make_task_source(EnvConfig(kind="plugin", path=path("NoTaskSourceEnv")))
    with pytest.raises(EnvPluginError, match="must be empty"):
        make_task_source(EnvConfig(kind="calculator", options={"x": 1}))
    with pytest.raises(EnvPluginError, match="supports difficulties"):
        make_task_source(EnvConfig(kind="kb_lookup", min_difficulty=5, max_difficulty=6))


def test_plugin_runs_through_make_env() -> None:
    cfg = EnvConfig(kind="plugin", path=path("EchoEnv"), options={"suffix": "!"})
    env = make_env(cfg, rng_seed=1)
    source = make_task_source(cfg)
    task = source.sample(random.Random(0))

    async def go() -> tuple[str, StepResult]:
        prompt = await env.reset(task)
        return prompt, await env.step(EchoEnv.solve(task)[0])

    prompt, res = asyncio.run(go())
    assert isinstance(env, GuardedEnv) and prompt.endswith("!") and res.outcome == "success"


# ---------------------------------------------------------------------------------------------
# check_environment
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["EchoEnv", "SyncEchoEnv"])
def test_check_passes_a_good_plugin(name: str) -> None:
    report = check_environment(path(name))
    assert report.ok, report.render()
    assert "Result: passed" in report.render()


@pytest.mark.parametrize("kind", ["calculator", "kb_lookup", "python", "strings"])
def test_check_passes_the_builtins(kind: str) -> None:
    report = check_environment(EnvConfig(kind=kind), episodes=2)  # type: ignore[arg-type]
    assert report.ok, report.render()


def test_check_reports_every_problem_of_the_broken_env() -> None:
    report = check_environment(path("BrokenEnv"), episodes=1, max_steps=5)
    text = report.render()
    assert not report.ok
    for expected in [
        "tool names must be identifiers",
        "not plain ASCII",
        "step() returned dict, expected asyncrl.envs.StepResult",
        "process_reward is nan, expected a finite number",
        "done never reached within 5 steps",
        "sampled training tasks are in the held-out split",
        "Result: FAILED",
    ]:
        assert expected in text, text
    assert text.isascii()


def test_check_reports_exceptions_hangs_and_load_errors() -> None:
    crash = check_environment(path("CrashingEnv"), episodes=1)
    assert not crash.ok and "raised KeyError: \"payload has no 'question'\"" in crash.render()
    started = time.monotonic()
    hang = check_environment(path("HangingEnv"), episodes=1, timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert not hang.ok and "hung (no result within 0.3s)" in hang.render()
    missing = check_environment("nowhere_pkg_xyz:Env")
    assert not missing.ok and "FAIL  load: module 'nowhere_pkg_xyz' not found" in missing.render()
    no_source = check_environment(path("NoTaskSourceEnv"))
    assert "provides no task source" in no_source.render()


def test_plugin_errors_are_user_errors_and_the_guard_exposes_the_solver() -> None:
    from asyncrl.errors import UserError

    with pytest.raises(UserError):
        load_plugin("nowhere_pkg_xyz:Env")
    env = make_env(EnvConfig(kind="calculator"), rng_seed=0)
    task = make_task_source(EnvConfig(kind="calculator")).sample(random.Random(0))
    assert env.demonstrate(task, random.Random(0), 0.0) == env.solve(task)  # used by the SFT warm start
    with pytest.raises(AttributeError):
        env.no_such_attribute  # noqa: B018


def test_check_times_tool_calls_and_detects_a_blocked_event_loop() -> None:
    slow = check_environment(path("SlowToolEnv"), episodes=1, slow_s=0.2).render()
    assert "WARN  timing: tool call took 0.4" in slow, slow
    assert "WARN  event loop" not in slow and "ok    event loop" in slow  # awaiting is fine
    blocking = check_environment(path("BlockingStepEnv"), episodes=1, slow_s=0.2).render()
    assert "WARN  event loop: tool call blocked the event loop for 0.4" in blocking, blocking
    assert "time.sleep" in blocking
    fast = check_environment(path("EchoEnv"), episodes=1).render()
    warnings = [line for line in fast.splitlines() if "WARN" in line]
    assert all(("demonstrate" in w or "no StepResult.tool_call" in w) for w in warnings), fast


def test_check_prints_an_ok_line_per_check_and_checks_the_demonstrator() -> None:
    from asyncrl.config import load_config

    text = check_environment(path("DemoEnv"), episodes=2).render()
    for check in (
        "load",
        "tools",
        "task source",
        "held-out",
        "reset",
        "episode",
        "solver",
        "demonstrate",
        "close",
        "timing",
        "event loop",
    ):
        assert f"ok    {check}:" in text, text
    # a run that warm-starts from demonstrations needs demonstrate: a missing one fails now, not minutes
    # into the run; from the policy's own episodes (auto, rollouts) it does not
    cfg = load_config(None, ["env.kind=plugin", f"env.path={path('EchoEnv')}", "trainer.sft.source=demos"])
    missing = check_environment(cfg.env, episodes=1, warm_start=cfg.trainer.sft)
    assert not missing.ok and "FAIL  demonstrate: the run warm-starts from demonstrations" in missing.render()
    auto = check_environment(
        cfg.env, episodes=1, warm_start=cfg.trainer.sft.model_copy(update={"source": "auto"})
    )
    assert (
        auto.ok
        and "ok    demonstrate: no demonstrate(): the warm start (trainer.sft.source: auto)" in auto.render()
    )
    assert check_environment(path("EchoEnv"), episodes=1).ok  # without a warm start: a warning only


def test_env_check_cli_takes_a_config_with_options_and_difficulty_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncrl.cli import main

    assert main(["env", "check", path("OptionsEnv")]) == 1  # n is required
    assert "FAIL  load" in capsys.readouterr().out
    assert main(["env", "check", path("OptionsEnv"), "--set", "env.options.n=2", "--episodes", "1"]) == 0
    assert "with {'n': 2}" in capsys.readouterr().out
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"env:\n  kind: plugin\n  path: {path('DemoEnv')}\n  min_difficulty: 1\n  max_difficulty: 1\n"
    )
    assert main(["env", "check", str(cfg), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "difficulties [1]" in out and "ok    demonstrate" in out, out
    cfg.write_text(f"env:\n  kind: plugin\n  path: {path('EchoEnv')}\n")
    assert main(["env", "check", str(cfg), "--episodes", "1"]) == 0  # auto: rounds of its own episodes
    demos = ["--set", "trainer.sft.source=demos"]
    assert main(["env", "check", str(cfg), "--episodes", "1", *demos]) == 1  # demonstrations, none to give


def test_tool_call_is_importable_where_step_result_is() -> None:
    import asyncrl.envs
    from asyncrl.envs import ToolCall

    assert "ToolCall" in asyncrl.envs.__all__
    StepResult(observation="12", tool_call=ToolCall(name="calc", arguments="3*4", ok=True))


class SlowGraderEnv(EchoEnv):
    """A user environment whose answer check takes a while (and does not use the verifier cache)."""

    async def step(self, model_text: str) -> StepResult:
        if model_text.startswith("<answer>"):
            await asyncio.sleep(0.05)
        return await EchoEnv.step(self, model_text)


def test_a_user_environments_answer_checking_cost_is_counted() -> None:
    from asyncrl.envs.toolenv import VERIFIER_CACHE

    env = make_env(EnvConfig(kind="plugin", path=path("SlowGraderEnv")), rng_seed=0)
    task = make_task_source(EnvConfig(kind="plugin", path=path("SlowGraderEnv"))).sample(random.Random(0))
    seconds, misses = VERIFIER_CACHE.seconds, VERIFIER_CACHE.misses

    async def go() -> None:
        await env.reset(task)
        await env.step("<tool>shout(hi)</tool>")  # not an answer: not counted
        await env.step(f"<answer>{task.payload['word']}</answer>")

    asyncio.run(go())
    assert VERIFIER_CACHE.misses == misses + 1
    assert VERIFIER_CACHE.seconds - seconds >= 0.05


class TinyTasks(HashSplitTaskSource):
    """A task space of five words: its held-out split (about a tenth) cannot hold 8 tasks."""

    task_types = ("echo",)
    difficulties = (1,)
    max_attempts = 50

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = rng.choice(["ab", "cd", "ef", "gh", "ij"])
        return Task(id=f"tiny-{word}", task_type="echo", difficulty=1, payload={"word": word})

    def content_key(self, task: Task) -> str:
        return str(task.payload["word"])


class TinyEnv(EchoEnv):
    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> TinyTasks:  # type: ignore[override]
        return TinyTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)


def test_a_heldout_split_smaller_than_heldout_size_is_a_one_line_error_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncrl.jobs.warm_start
    from asyncrl.cli import main

    def no_work(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the warm start began")

    monkeypatch.setattr(asyncrl.jobs.warm_start, "warm_start", no_work)
    over = ["env.kind=plugin", f"env.path={__name__}:TinyEnv", "env.heldout_size=8", f"run_root={tmp_path}"]
    args = ["train", "configs/calculator.yaml", "--no-display", *(a for o in over for a in ("--set", o))]
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "env.heldout_size" in err and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())  # no run directory was made
