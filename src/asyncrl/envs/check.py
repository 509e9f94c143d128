"""``check_environment``: exercise a (user) environment and report contract violations in words.

The check talks to the RAW environment (no guard), because the guard's job is to hide exactly
the problems this check must reveal. Every call still runs with a timeout, in a worker thread
for synchronous environments, so a broken environment cannot hang or crash the check.

Checked, in order: loading and construction; ``tools``; the task source (sampling, difficulty
range, held-out split deterministic and disjoint from training tasks); on a few tasks:
``reset`` (returns short plain text), a well-formed tool call, a malformed action, an answer
(the episode must end with a valid outcome within ``max_steps``); reward values; the optional
reference solver ``solve`` and demonstrator ``demonstrate`` (their episodes must succeed;
``demonstrate`` is required when the run warm-starts); ``close``; timing: every call, tool calls
included, is timed (slow ones are reported per check), and a heartbeat task measures how long an
``async`` method blocked the event loop (a ``time.sleep`` in ``async def step`` stalls every episode
of a rollout worker). Every check that passes prints an ``ok`` line.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from asyncrl.config import EnvConfig
from asyncrl.envs.base import (
    AnyEnvironment,
    CallTimeout,
    StepResult,
    TaskSource,
    call_env,
    call_with_timeout,
    close_env,
    finite,
    is_async_method,
    step_problems,
)
from asyncrl.envs.demos import tool_note
from asyncrl.envs.mix import MixTaskSource, mix_members
from asyncrl.envs.registry import EnvPluginError, env_class, env_where, make_raw_env, make_task_source
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig, SFTConfig

__all__ = ["ENV_OWN_DIFFICULTIES", "CheckReport", "Finding", "acheck_environment", "check_environment"]

ENV_OWN_DIFFICULTIES = {"min_difficulty": 0, "max_difficulty": 100}
"""A difficulty range wide enough for any task source (whose ``from_config`` keeps its own levels):
what a check without a run config uses, rather than the calculator's default range."""

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


def _exc(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _step_problems(res: object) -> list[str]:
    """Contract violations of one step result, in words (the guard's, and a process reward outside [-1, 1])."""
    out = [message for _, message in step_problems(res)]
    if isinstance(res, StepResult) and finite(res.process_reward) and not -1.0 <= res.process_reward <= 1.0:
        out.append(f"process_reward {res.process_reward} is outside [-1, 1]")
    return out


_TICK = 0.01  # heartbeat period of the event-loop stall probe, seconds


class _Checker:
    """One check of one raw environment: its report, and every call run with a timeout while
    recording, per check, the slowest call and the longest event-loop stall during a call.

    The stall is measured by a heartbeat task that wakes every ``_TICK`` seconds: an ``async def``
    method that blocks (``time.sleep``, blocking I/O, long CPU work) keeps the heartbeat from
    running, so the largest gap between beats during a call is how long it froze the loop, and with
    it every other episode of a rollout worker.
    """

    def __init__(self, report: CheckReport, env: AnyEnvironment, timeout_s: float) -> None:
        self.report, self.env, self.timeout_s = report, env, timeout_s
        self.slowest: dict[str, tuple[float, str]] = {}  # check -> (seconds, where)
        self.stalls: dict[str, tuple[float, str]] = {}
        self._beat = time.monotonic()
        self._gap = 0.0

    async def heartbeat(self) -> None:
        while True:
            now = time.monotonic()
            self._gap, self._beat = max(self._gap, now - self._beat), now
            await asyncio.sleep(_TICK)

    async def call(self, check: str, where: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        self._gap, self._beat = 0.0, time.monotonic()
        started = self._beat
        value = await call_with_timeout(fn, self.timeout_s)
        elapsed = time.monotonic() - started
        stall = max(self._gap, time.monotonic() - self._beat)  # ≈ _TICK when nothing blocked
        for seen, x in ((self.slowest, elapsed), (self.stalls, stall)):
            if x > seen.get(check, (0.0, ""))[0]:
                seen[check] = (x, where)
        return value

    async def attempt(
        self, check: str, where: str, what: str, fn: Callable[[], Awaitable[Any]]
    ) -> tuple[bool, Any]:
        """``(True, fn())`` by :meth:`call`, or ``(False, None)`` with the error reported when it hung or raised."""
        try:
            return True, await self.call(check, where, fn)
        except CallTimeout as exc:
            self.report.add("error", check, f"{where}: {what} hung ({exc})")
        except Exception as exc:
            self.report.add("error", check, f"{where}: {what} raised {_exc(exc)}")
        return False, None

    async def step(self, check: str, where: str, text: str) -> StepResult | None:
        """One step; ``None``, with the error reported, when it hung, raised or broke the contract."""
        ok, res = await self.attempt(check, where, f"step({text!r})", lambda: call_env(self.env.step, text))
        if not ok:
            return None
        problems = _step_problems(res)
        if problems:
            self.report.add("error", check, f"{where}: " + "; ".join(problems))
            return None
        return res  # type: ignore[no-any-return]

    async def episode(self, tools: list[Any], task: Task, max_steps: int, *, first: bool) -> None:
        """reset, one well-formed tool call, one malformed action, then answers until done."""
        where, add = f"task {task.id}", self.report.add
        ok, prompt = await self.attempt("reset", where, "reset()", lambda: call_env(self.env.reset, task))
        if not ok or not self.prompt(prompt, where, first=first):
            return
        if tools:
            schema = getattr(tools[0], "args_schema", {}) or {}
            example = schema.get("example", "") if isinstance(schema, dict) else ""
            res = await self.step("tool call", where, f"<tool>{tools[0].name}({example})</tool>")
            ok = res is not None
            if res is not None and res.tool_call is None and not res.malformed:
                add(
                    "warning",
                    "tool call",
                    f"{where}: a well-formed call returned no StepResult.tool_call: asyncrl records it from the "
                    "parsed action (ok unless the observation starts with 'error'); set tool_call to report it "
                    "exactly",
                )
        res = await self.step("malformed action", where, "this is not an action")
        ok &= res is not None
        if res is not None and finite(res.process_reward) and res.process_reward > 0:
            add(
                "warning",
                "malformed action",
                f"{where}: a malformed action earned process_reward {res.process_reward} > 0",
            )
        if res is not None and res.done:
            add("warning", "malformed action", f"{where}: a malformed action ended the episode")
        for _ in range(max_steps):
            end = await self.step("answer", where, "<answer>42</answer>")
            if end is None or end.done:
                break
        else:
            add("error", "done", f"{where}: done never reached within {max_steps} steps of answering")
            return
        if end is not None and ok and first:
            add("ok", "episode", "tool call, malformed action and answer handled; episode ends")

    def prompt(self, prompt: object, where: str, *, first: bool) -> bool:
        if not isinstance(prompt, str):
            kind = type(prompt).__name__
            self.report.add("error", "reset", f"{where}: returned {kind}, expected the prompt text (str)")
            return False
        warnings = [
            text
            for text, bad in (
                ("the prompt is empty", not prompt.strip()),
                (
                    "the prompt is not plain ASCII (the default char tokenizer cannot encode it)",
                    not prompt.isascii(),
                ),
                (f"the prompt has {len(prompt)} characters; the default context is 512", len(prompt) > 400),
            )
            if bad
        ]
        for text in warnings:
            self.report.add("warning", "reset", f"{where}: {text}")
        if first and not warnings:
            self.report.add("ok", "reset", f"prompt {prompt[:60]!r}")
        return True

    async def reference(self, tasks: list[Task], warm_start: SFTConfig | None) -> None:
        """The optional solver ``solve`` and the demonstrator ``demonstrate`` (required to warm-start)
        of the built environment."""
        add, env = self.report.add, self.env
        solve = getattr(env, "solve", None)
        if not callable(solve):
            add("ok", "solver", "no reference solver (solve) declared; skipped")
        elif tasks and await self.play("solver", tasks, solve):
            add("ok", "solver", f"reference solution succeeded on {len(tasks)} task(s)")
        demonstrate = getattr(env, "demonstrate", None)
        if not callable(demonstrate):
            if warm_start is not None and warm_start.source == "demos":
                add(
                    "error",
                    "demonstrate",
                    "the run warm-starts from demonstrations (trainer.sft.source: demos) but the environment has "
                    "no reference demonstrator demonstrate(task, rng, corruption_rate) -> list[str]; add one "
                    "(see docs/environments.md), or set trainer.sft.source: rollouts",
                )
            elif warm_start is not None:
                add(
                    "ok",
                    "demonstrate",
                    f"no demonstrate(): the warm start (trainer.sft.source: {warm_start.source}) plays rounds of "
                    "the policy's own episodes and keeps the successes",
                )
            else:
                add("warning", "demonstrate", "no demonstrate(): `asyncrl train` cannot warm-start on it")
            return
        if not tasks:
            return
        rng = random.Random(warm_start.seed if warm_start else 0)
        clean = await self.play("demonstrate", tasks, lambda t: demonstrate(t, rng, 0.0))
        rate = warm_start.corruption_rate if warm_start else 0.5
        try:
            for t in tasks:
                texts = demonstrate(t, rng, rate)
                if not (isinstance(texts, list) and all(isinstance(x, str) for x in texts)):
                    raise TypeError(f"returned {type(texts).__name__}, expected list[str]")
        except Exception as exc:
            add("error", "demonstrate", f"demonstrate(task, rng, {rate:g}) failed: {_exc(exc)}")
            return
        if clean:
            done = f"clean demonstrations succeeded on {len(tasks)} task(s); corruption {rate:g} ok"
            add("ok", "demonstrate", done)

    async def play(self, name: str, tasks: list[Task], texts_for: Callable[[Task], Iterable[str]]) -> bool:
        """Play the reference texts of every task; True when every episode succeeds."""
        for task in tasks:
            where = f"task {task.id}"
            res: object = None
            try:
                await self.call(name, where, functools.partial(call_env, self.env.reset, task))
                for text in texts_for(task):
                    res = await self.call(name, where, functools.partial(call_env, self.env.step, text))
                    if not isinstance(res, StepResult) or res.done:
                        break
            except Exception as exc:
                self.report.add("error", name, f"{where}: reference episode failed: {_exc(exc)}")
                return False
            if not (isinstance(res, StepResult) and res.done and res.outcome == "success"):
                outcome = getattr(res, "outcome", None)
                self.report.add(
                    "error", name, f"{where}: reference episode did not succeed (outcome {outcome!r})"
                )
                return False
        return True

    def timing(self, slow_s: float, stall_s: float, guard_timeout_s: float, sync: bool) -> None:
        """Warn on slow calls per check (a slow tool stretches every episode) and on a blocked loop."""
        slow = {k: v for k, v in self.slowest.items() if v[0] > slow_s}
        for check, (secs, where) in slow.items():
            self.report.add(
                "warning",
                "timing",
                f"{check} took {secs:.2f}s ({where}; > {slow_s:g}s): every episode waits for it; "
                f"the guard times a call out after env.guard.step_timeout_s = {guard_timeout_s:g}s",
            )
        if self.slowest and not slow:
            check, (secs, _) = max(self.slowest.items(), key=lambda kv: kv[1][0])
            self.report.add("ok", "timing", f"slowest call {secs:.2f}s ({check})")
        if sync:
            return  # synchronous methods run in worker threads: they cannot block the event loop
        stalls = {k: v for k, v in self.stalls.items() if v[0] > stall_s}
        for check, (secs, where) in stalls.items():
            self.report.add(
                "warning",
                "event loop",
                f"{check} blocked the event loop for {secs:.2f}s ({where}): an async method must not block "
                "(time.sleep, blocking I/O, long CPU work) -- it stalls every episode of the rollout worker; "
                "use `await asyncio.sleep`, an async client, or `await asyncio.to_thread(...)`",
            )
        if not stalls:
            worst = max((v[0] for v in self.stalls.values()), default=0.0)
            gap = f"longest gap between heartbeats {worst:.2f}s"
            self.report.add("ok", "event loop", f"async methods never blocked it ({gap})")


async def _check_mix(
    cfg: EnvConfig, check: Callable[..., Awaitable[CheckReport]], warm_start: SFTConfig | None
) -> CheckReport:
    """A mix: ``check`` (:func:`acheck_environment` with the caller's settings) on every member's own
    config (a member of ``sft_share`` 0 as one that does not warm-start), each finding prefixed with
    the member's name, then the mix's task source (every member drawn from, every member's held-out
    split)."""
    report = CheckReport(cfg.kind)
    shares = {m.name: m.sft_share for m in cfg.mix or []}
    for name, weight, member in mix_members(cfg):
        sub = await check(member, warm_start=None if shares[name] == 0 else warm_start)
        report.add("ok", f"{name}", f"member {name!r} ({sub.target}, weight {weight:g})")
        for f in sub.findings:
            report.add(f.level, f"{name}: {f.check}", f.message)
    try:
        source = MixTaskSource.of(cfg, make_task_source)
        held = source.heldout()
    except (EnvPluginError, ValueError) as exc:
        report.add("error", "mix", str(exc))
        return report
    rng = random.Random(cfg.seed)
    draws = 50 * len(source.members)
    drawn = {source.sample(rng).env for _ in range(draws)}
    missing = [n for n in source.members if n not in drawn]
    if missing:
        report.add("error", "mix", f"no training task drawn from {missing} in {draws} draws")
    else:
        counts = {n: sum(t.env == n for t in held) for n in source.members}
        report.add(
            "ok", "mix", f"{len(source.members)} environments; held-out tasks per environment {counts}"
        )
    return report


def _target(path_or_cfg: str | EnvConfig) -> EnvConfig | CheckReport:
    """The config to check: a plugin path on every difficulty it declares, or the config itself; a
    report with the error when the path does not make a config."""
    if not isinstance(path_or_cfg, str):
        return path_or_cfg
    try:
        return EnvConfig(kind="plugin", path=path_or_cfg, **ENV_OWN_DIFFICULTIES)
    except ValueError as exc:
        report = CheckReport(path_or_cfg)
        report.add("error", "config", str(exc))
        return report


async def acheck_environment(
    path_or_cfg: str | EnvConfig,
    *,
    episodes: int = 3,
    max_steps: int = 16,
    timeout_s: float = 10.0,
    slow_s: float = 2.0,
    stall_s: float = 0.2,
    overlap_samples: int = 300,
    warm_start: SFTConfig | None = None,
) -> CheckReport:
    """Async version of :func:`check_environment`.

    ``path_or_cfg``: ``"pkg.module:Class"`` (on every difficulty its task source declares) or an
    :class:`~asyncrl.config.EnvConfig` (used as a run would use it; a ``mix`` checks each member).
    ``episodes``: tasks to play; ``max_steps``: answer steps before "done never reached";
    ``timeout_s``: limit of every call; ``slow_s``/``stall_s``: calls slower than this / ``async``
    methods blocking the loop longer than this are reported; ``overlap_samples``: training tasks drawn
    to test the held-out split; ``warm_start``: the run's SFT settings when it warm-starts (then
    ``demonstrate`` is required; otherwise checked when present).
    """

    cfg = _target(path_or_cfg)
    if isinstance(cfg, CheckReport):
        return cfg
    if cfg.kind == "mix":  # every member, then the mix's own task source
        kw: dict[str, Any] = {"episodes": episodes, "max_steps": max_steps, "timeout_s": timeout_s}
        kw["slow_s"] = slow_s
        kw |= {"stall_s": stall_s, "overlap_samples": overlap_samples}
        return await _check_mix(cfg, functools.partial(acheck_environment, **kw), warm_start)
    report = CheckReport(cfg.path if cfg.kind == "plugin" and cfg.path else cfg.kind)

    # -- load and construct ---------------------------------------------------------------------
    try:
        cls = env_class(cfg)
        env = make_raw_env(cfg)
    except EnvPluginError as exc:
        report.add("error", "load", str(exc))
        return report
    report.add("ok", "load", f"{cls.__name__} constructed" + (f" with {cfg.options}" if cfg.options else ""))
    sync = not is_async_method(env.step)
    if sync:
        report.add("ok", "style", "synchronous methods: they will run in worker threads")
    tools = _check_tools(report, env)

    # -- task source ----------------------------------------------------------------------------
    tasks: list[Task] = []
    try:
        tasks = _check_source(report, make_task_source(cfg), episodes, overlap_samples)
    except EnvPluginError as exc:
        report.add("error", "task source", str(exc))
    if not tasks:
        tasks = [Task(id="check-0", task_type="check", difficulty=0, payload={})]
        report.add("warning", "tasks", "no tasks available; checking with an empty placeholder task")

    # -- episodes, the reference solver and demonstrator, under the timing probes ---------------
    checker = _Checker(report, env, timeout_s)
    heartbeat = asyncio.ensure_future(checker.heartbeat())
    try:
        for i, task in enumerate(tasks):
            await checker.episode(tools, task, max_steps, first=i == 0)
        solved = [t for t in tasks if t.payload]
        await checker.reference(solved, warm_start)
        if note := tool_note(env, solved, env_where(cfg)):
            report.add("warning", "tools", note)
        if (await checker.attempt("close", "close()", "the call", lambda: close_env(env)))[0]:
            report.add("ok", "close", "closed")
    finally:
        heartbeat.cancel()
    checker.timing(slow_s, stall_s, cfg.guard.step_timeout_s, sync)
    return report


def _check_tools(report: CheckReport, env: AnyEnvironment) -> list[Any]:
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
    return tools


def _check_source(report: CheckReport, source: TaskSource, episodes: int, overlap_samples: int) -> list[Task]:
    def error(check: str, message: str) -> list[Task]:
        report.add("error", check, message)
        return tasks

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
                message = f"sample(rng, difficulty={d}) returned a task of difficulty {t.difficulty}"
                report.add("error", "task source", message)
    except Exception as exc:
        return error("task source", f"sample() raised {_exc(exc)}")
    seen = sorted({t.difficulty for t in tasks})
    report.add("ok", "task source", f"{len(tasks)} task(s) sampled, difficulties {seen}")
    try:
        held, again = source.heldout(), source.heldout()
    except Exception as exc:
        return error("held-out", f"heldout() raised {_exc(exc)}")
    if not isinstance(held, list) or not all(isinstance(t, Task) for t in held):
        return error("held-out", "heldout() must return a list of Task")
    if not held:
        return error("held-out", "heldout() returned no tasks")
    if [t.id for t in held] != [t.id for t in again]:
        report.add("error", "held-out", "heldout() is not deterministic (two calls returned different tasks)")
    held_ids = {t.id for t in held}
    held_payloads = {repr(sorted(t.payload.items())) for t in held if t.payload}
    try:
        drawn = [source.sample(rng) for _ in range(overlap_samples)]
    except Exception as exc:
        return error("task source", f"sample() raised {_exc(exc)}")
    overlap = sum(
        t.id in held_ids or bool(t.payload and repr(sorted(t.payload.items())) in held_payloads)
        for t in drawn
    )
    if overlap:
        return error(
            "held-out",
            f"{overlap} of {overlap_samples} sampled training tasks are in the held-out split; "
            "sample() must never return a held-out task (see HashSplitTaskSource)",
        )
    report.add("ok", "held-out", f"{len(held)} tasks, disjoint from {overlap_samples} sampled training tasks")
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
