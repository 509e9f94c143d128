"""``check_environment``: exercise a (user) environment and report contract violations in words.

The check talks to the RAW environment (no guard), because the guard's job is to hide exactly
the problems this check must reveal. Every call still runs with a timeout, in a worker thread
for synchronous environments, so a broken environment cannot hang or crash the check.

Checked, in order: loading and construction; ``tools``; the task source (sampling, difficulty
range, held-out split deterministic and disjoint from training tasks); on a few tasks:
``reset`` (returns short plain text), a well-formed tool call, a malformed action, an answer
(the episode must end with a valid outcome within ``max_steps``); reward values; timing; the
optional reference solver (its episode must succeed); ``close``.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from asyncrl.envs.base import StepResult, call_env, close_env, is_async_method
from asyncrl.records import OUTCOMES, Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["CheckReport", "Finding", "acheck_environment", "check_environment"]

Level = Literal["ok", "warning", "error"]


@dataclass
class Finding:
    level: Level
    check: str
    message: str


@dataclass
class CheckReport:
    """Findings of :func:`check_environment`; ``ok`` is False when any finding is an error."""

    target: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.level == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warning"]

    def add(self, level: Level, check: str, message: str) -> None:
        self.findings.append(Finding(level, check, message))

    def render(self) -> str:
        tag = {"ok": "ok  ", "warning": "WARN", "error": "FAIL"}
        lines = [f"Environment check: {self.target}"]
        lines += [f"  {tag[f.level]}  {f.check}: {f.message}" for f in self.findings]
        verdict = "passed" if self.ok else "FAILED"
        lines.append(f"Result: {verdict} ({len(self.errors)} problem(s), {len(self.warnings)} warning(s))")
        return "\n".join(lines).encode("ascii", "backslashreplace").decode("ascii")


class _Timeout(Exception):
    pass


async def _timed(fn: Callable[[], Awaitable[Any]], timeout: float) -> tuple[Any, float]:
    """Run with a timeout; exceptions (any BaseException) are re-raised as ``Exception``."""

    async def run() -> tuple[bool, Any]:
        try:
            return True, await fn()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            return False, exc

    started = time.monotonic()
    task = asyncio.ensure_future(run())
    done, _ = await asyncio.wait({task}, timeout=timeout)
    elapsed = time.monotonic() - started
    if not done:
        task.cancel()
        raise _Timeout(f"no result within {timeout:g}s")
    if task.cancelled():
        raise RuntimeError("raised CancelledError")
    ok, value = task.result()
    if not ok:
        raise value if isinstance(value, Exception) else RuntimeError(f"{type(value).__name__}: {value}")
    return value, elapsed


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _is_finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _step_problems(res: Any) -> list[str]:
    """Contract violations of one step result, in words."""
    if not isinstance(res, StepResult):
        return [f"step() returned {type(res).__name__}, expected asyncrl.envs.StepResult"]
    out = []
    if not isinstance(res.observation, str):
        out.append(f"observation is {type(res.observation).__name__}, expected str")
    if not _is_finite(res.process_reward):
        out.append(f"process_reward is {res.process_reward!r}, expected a finite number")
    elif not -1.0 <= float(res.process_reward) <= 1.0:
        out.append(f"process_reward {res.process_reward} is outside [-1, 1]")
    if not _is_finite(res.reward):
        out.append(f"reward is {res.reward!r}, expected a finite number")
    if not isinstance(res.done, bool):
        out.append(f"done is {type(res.done).__name__}, expected bool")
    if res.done and res.outcome not in OUTCOMES:
        out.append(f"done=True with outcome {res.outcome!r}; use one of {', '.join(OUTCOMES)}")
    if not isinstance(res.info, dict):
        out.append(f"info is {type(res.info).__name__}, expected dict")
    return out


async def acheck_environment(
    path_or_cfg: str | EnvConfig,
    *,
    episodes: int = 3,
    max_steps: int = 16,
    timeout_s: float = 10.0,
    slow_s: float = 2.0,
    overlap_samples: int = 300,
) -> CheckReport:
    """Async version of :func:`check_environment`.

    ``episodes``: tasks to play; ``max_steps``: answer steps allowed before "done never
    reached"; ``timeout_s``: limit of every single call; ``slow_s``: calls slower than this are
    reported; ``overlap_samples``: training tasks drawn to test the held-out split.
    """
    from asyncrl.config import EnvConfig
    from asyncrl.envs.registry import EnvPluginError, env_class, make_raw_env, make_task_source

    if isinstance(path_or_cfg, str):
        try:
            cfg = EnvConfig(kind="plugin", path=path_or_cfg)
        except ValueError as exc:
            report = CheckReport(path_or_cfg)
            report.add("error", "config", str(exc))
            return report
    else:
        cfg = path_or_cfg
    report = CheckReport(cfg.path if cfg.kind == "plugin" and cfg.path else cfg.kind)

    # -- load and construct ---------------------------------------------------------------------
    try:
        cls = env_class(cfg)
        env = make_raw_env(cfg)
    except EnvPluginError as exc:
        report.add("error", "load", str(exc))
        return report
    report.add("ok", "load", f"{cls.__name__} constructed")
    sync = not is_async_method(getattr(env, "step", None))
    if sync:
        report.add("ok", "style", "synchronous methods: they will run in worker threads")

    # -- tools ----------------------------------------------------------------------------------
    tools = list(getattr(env, "tools", []))
    names = [getattr(t, "name", None) for t in tools]
    if not tools:
        report.add("warning", "tools", "no tools: the agent can only answer")
    bad = [n for n in names if not (isinstance(n, str) and n.isidentifier())]
    if bad:
        report.add("error", "tools", f"tool names must be identifiers, got {bad!r}")
    elif len(set(names)) != len(names):
        report.add("error", "tools", f"duplicate tool names {names!r}")
    elif tools:
        report.add("ok", "tools", ", ".join(str(n) for n in names))

    # -- task source ----------------------------------------------------------------------------
    tasks: list[Task] = []
    try:
        source = make_task_source(cfg)
    except EnvPluginError as exc:
        report.add("error", "task source", str(exc))
        source = None
    if source is not None:
        tasks = _check_source(report, source, episodes, overlap_samples)
    if not tasks:
        tasks = [Task(id="check-0", task_type="check", difficulty=0, payload={})]
        report.add("warning", "tasks", "no tasks available; checking with an empty placeholder task")

    # -- episodes -------------------------------------------------------------------------------
    slowest = 0.0
    solve = getattr(cls, "solve", None)
    for i, task in enumerate(tasks):
        where = f"task {task.id}"
        try:
            prompt, dt = await _timed(lambda t=task: call_env(env.reset, t), timeout_s)  # type: ignore[misc]
            slowest = max(slowest, dt)
        except _Timeout as exc:
            report.add("error", "reset", f"{where}: hung ({exc})")
            continue
        except Exception as exc:
            report.add("error", "reset", f"{where}: raised {_exc(exc)}")
            continue
        if not isinstance(prompt, str):
            report.add(
                "error", "reset", f"{where}: returned {type(prompt).__name__}, expected the prompt text (str)"
            )
            continue
        n_findings = len(report.findings)
        if not prompt.strip():
            report.add("warning", "reset", f"{where}: the prompt is empty")
        if not prompt.isascii():
            report.add(
                "warning",
                "reset",
                f"{where}: the prompt is not plain ASCII (the default char tokenizer cannot encode it)",
            )
        if len(prompt) > 400:
            report.add(
                "warning",
                "reset",
                f"{where}: the prompt has {len(prompt)} characters; the default context is 512",
            )
        if i == 0 and len(report.findings) == n_findings:
            report.add("ok", "reset", f"prompt {prompt[:60]!r}")

        ok_episode = True
        # a well-formed tool call
        if tools:
            t0 = tools[0]
            schema = getattr(t0, "args_schema", {}) or {}
            example = schema.get("example", "") if isinstance(schema, dict) else ""
            ok_episode &= await _check_step(
                report, env, f"<tool>{t0.name}({example})</tool>", "tool call", where, timeout_s
            )
        # a malformed action
        ok_episode &= await _check_step(
            report, env, "this is not an action", "malformed action", where, timeout_s, malformed=True
        )
        # answers until done
        reached = False
        for _ in range(max_steps):
            try:
                res, dt = await _timed(lambda: call_env(env.step, "<answer>42</answer>"), timeout_s)
                slowest = max(slowest, dt)
            except _Timeout as exc:
                report.add("error", "answer", f"{where}: step hung ({exc})")
                break
            except Exception as exc:
                report.add("error", "answer", f"{where}: step raised {_exc(exc)}")
                break
            problems = _step_problems(res)
            if problems:
                report.add("error", "answer", f"{where}: " + "; ".join(problems))
                break
            if res.done:
                reached = True
                break
        else:
            report.add("error", "done", f"{where}: done never reached within {max_steps} steps of answering")
        if reached and ok_episode and i == 0:
            report.add("ok", "episode", "tool call, malformed action and answer handled; episode ends")

        if callable(solve) and task.payload:
            await _check_solver(report, env, solve, task, timeout_s)

    if slowest > slow_s:
        report.add(
            "warning",
            "timing",
            f"slowest call took {slowest:.2f}s (> {slow_s:g}s); the guard times out at env.guard.step_timeout_s",
        )
    try:
        await _timed(lambda: close_env(env), timeout_s)
    except Exception as exc:
        report.add("error", "close", f"close() failed: {_exc(exc)}")
    return report


async def _check_step(
    report: CheckReport,
    env: Any,
    text: str,
    name: str,
    where: str,
    timeout_s: float,
    *,
    malformed: bool = False,
) -> bool:
    try:
        res, _ = await _timed(lambda: call_env(env.step, text), timeout_s)
    except _Timeout as exc:
        report.add("error", name, f"{where}: step hung ({exc})")
        return False
    except Exception as exc:
        report.add("error", name, f"{where}: step({text!r}) raised {_exc(exc)}")
        return False
    problems = _step_problems(res)
    if problems:
        report.add("error", name, f"{where}: " + "; ".join(problems))
        return False
    if malformed and _is_finite(res.process_reward) and res.process_reward > 0:
        report.add(
            "warning", name, f"{where}: a malformed action earned process_reward {res.process_reward} > 0"
        )
    if malformed and res.done:
        report.add("warning", name, f"{where}: a malformed action ended the episode")
    return True


async def _check_solver(report: CheckReport, env: Any, solve: Any, task: Task, timeout_s: float) -> None:
    try:
        texts = solve(task)
        await _timed(lambda: call_env(env.reset, task), timeout_s)
        res: Any = None
        for text in texts:
            res, _ = await _timed(lambda t=text: call_env(env.step, t), timeout_s)  # type: ignore[misc]
            if not isinstance(res, StepResult) or res.done:
                break
    except Exception as exc:
        report.add("error", "solver", f"task {task.id}: reference solver episode failed: {_exc(exc)}")
        return
    if not (isinstance(res, StepResult) and res.done and res.outcome == "success"):
        outcome = getattr(res, "outcome", None)
        report.add(
            "error", "solver", f"task {task.id}: reference solution did not succeed (outcome {outcome!r})"
        )


def _check_source(report: CheckReport, source: Any, episodes: int, overlap_samples: int) -> list[Task]:
    rng = random.Random(0)
    tasks: list[Task] = []
    difficulties = list(getattr(source, "difficulties", ()) or [])
    if not difficulties:
        report.add("warning", "task source", "no 'difficulties' declared")
    try:
        for _ in range(episodes):
            t = source.sample(rng)
            if not isinstance(t, Task):
                report.add(
                    "error",
                    "task source",
                    f"sample() returned {type(t).__name__}, expected asyncrl.records.Task",
                )
                return []
            tasks.append(t)
        for d in difficulties:
            t = source.sample(rng, d)
            if isinstance(t, Task) and t.difficulty != d:
                report.add(
                    "error",
                    "task source",
                    f"sample(rng, difficulty={d}) returned a task of difficulty {t.difficulty}",
                )
    except Exception as exc:
        report.add("error", "task source", f"sample() raised {_exc(exc)}")
        return tasks
    try:
        held = source.heldout()
        held2 = source.heldout()
    except Exception as exc:
        report.add("error", "held-out", f"heldout() raised {_exc(exc)}")
        return tasks
    if not isinstance(held, list) or not all(isinstance(t, Task) for t in held):
        report.add("error", "held-out", "heldout() must return a list of Task")
        return tasks
    if not held:
        report.add("error", "held-out", "heldout() returned no tasks")
        return tasks
    if [t.id for t in held] != [t.id for t in held2]:
        report.add("error", "held-out", "heldout() is not deterministic (two calls returned different tasks)")
    held_ids = {t.id for t in held}
    held_payloads = {repr(sorted(t.payload.items())) for t in held if t.payload}
    overlap = 0
    try:
        for _ in range(overlap_samples):
            t = source.sample(rng)
            if t.id in held_ids or (t.payload and repr(sorted(t.payload.items())) in held_payloads):
                overlap += 1
    except Exception as exc:
        report.add("error", "task source", f"sample() raised {_exc(exc)}")
        return tasks
    if overlap:
        report.add(
            "error",
            "held-out",
            f"{overlap} of {overlap_samples} sampled training tasks are in the held-out split; "
            "sample() must never return a held-out task (see HashSplitTaskSource)",
        )
    else:
        report.add(
            "ok", "held-out", f"{len(held)} tasks, disjoint from {overlap_samples} sampled training tasks"
        )
    return tasks


def check_environment(path_or_cfg: str | EnvConfig, **kwargs: Any) -> CheckReport:
    """Exercise an environment (``"pkg.mod:Class"`` or an EnvConfig) and report violations.

    Safe to call with or without a running event loop (it then runs in a helper thread).
    Keyword arguments: see :func:`acheck_environment`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(acheck_environment(path_or_cfg, **kwargs))
    box: list[CheckReport] = []
    thread = threading.Thread(target=lambda: box.append(_run(acheck_environment(path_or_cfg, **kwargs))))
    thread.start()
    thread.join()
    return box[0]


def _run(coro: Awaitable[CheckReport]) -> CheckReport:
    """Like ``asyncio.run``, but does not wait forever for abandoned calls of an environment
    that ignores cancellation (``asyncio.run`` would)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
        loop.close()
