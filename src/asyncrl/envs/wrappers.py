"""Environment wrappers: simulated latency, injected faults, and the fault-isolating guard.

``make_env`` stacks them as ``GuardedEnv(FaultWrapper(LatencyWrapper(env)))``: latency and
faults are *inside* the guard, so the guard's timeout covers slow tools and its retries
absorb injected faults exactly like real ones.

The guard's semantics (what fails an attempt, retries, the fault result, hung attempts, recorded
tool calls) are in docs/environments.md ("Wrappers and the guard"). Contract: nothing an
environment does escapes :class:`GuardedEnv`; a step that fails every attempt becomes
``StepResult(fault_observation, fault_reward, done=False)`` carrying a
:class:`~asyncrl.records.Fault`, and a reset that does raises :class:`EnvResetError`. RETRYING
RE-SENDS THE SAME MODEL TEXT: a non-idempotent environment may already have changed its state.
Hung attempts are abandoned, not awaited; an ``async def`` that blocks the event loop itself
(``time.sleep`` in a coroutine) is the one thing no wrapper can preempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import (
    AnyEnvironment,
    CallTimeout,
    StepResult,
    Tool,
    ToolCallAction,
    call_env,
    call_with_timeout,
    close_env,
    parse_action,
    step_problems,
    tool_call,
)
from asyncrl.envs.toolenv import VERIFIER_CACHE
from asyncrl.records import Fault, FaultKind, ToolCall

if TYPE_CHECKING:
    from asyncrl.config import FaultConfig, GuardConfig, LatencyConfig
    from asyncrl.records import Task

__all__ = [
    "GUARD_STATS",
    "AnswerCostWrapper",
    "EnvResetError",
    "EnvWrapper",
    "FaultWrapper",
    "GuardStats",
    "GuardedEnv",
    "InjectedFault",
    "LatencyWrapper",
]


@dataclass
class GuardStats:
    """What the guards of one process absorbed (cumulative; the rollout worker reports them as
    the ``guard`` section of its report, :class:`asyncrl.telemetry.reports.GuardFigures`). ``calls``: guarded ``reset``/``step`` calls; ``faults``: calls that
    failed on every attempt; ``retries``: failed attempts that were retried; ``timeouts``,
    ``exceptions``, ``malformed``: failed attempts by kind (retried or not); ``fault_seconds``: wall
    time spent in failed attempts (a hang costs up to ``step_timeout_s`` each); ``tool_faults``:
    failed steps whose model text was a tool call (counted as failed tool calls); ``tool_calls_recorded``:
    tool calls the guard recorded from the parsed action because the environment's ``StepResult`` carried
    none; ``scorer_errors``: answers whose scorer raised or gave no finite score (graded as failures,
    :mod:`asyncrl.envs.scoring`)."""

    calls: int = 0
    faults: int = 0
    retries: int = 0
    timeouts: int = 0
    exceptions: int = 0
    malformed: int = 0
    fault_seconds: float = 0.0
    tool_faults: int = 0
    tool_calls_recorded: int = 0
    scorer_errors: int = 0


GUARD_STATS = GuardStats()
"""Process-wide: one per rollout worker."""


class EnvResetError(RuntimeError):
    """``reset`` failed on every attempt; ``fault`` says how (the runner records ``env_error``)."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(
            f"environment reset failed after {fault.attempts} attempt(s): {fault.kind}: {fault.message}"
        )
        self.fault = fault


class InjectedFault(RuntimeError):
    """The exception :class:`FaultWrapper` raises on purpose."""


class EnvWrapper:
    """Base wrapper: forwards ``tools``, ``reset``, ``step``, ``close`` (sync or async inner env)."""

    def __init__(self, env: AnyEnvironment) -> None:
        self.env = env

    def __getattr__(self, name: str) -> Any:
        """Forward other attributes (``solve``, ``demonstrate``, ``kb`` ...) to the inner env.

        Only protocol methods are wrapped; anything reached through this forwarding bypasses
        the guard, which is why it is meant for static helpers like the reference solver.
        """
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)

    @property
    def tools(self) -> list[Tool]:
        tools = getattr(self.env, "tools", [])
        return list(tools) if isinstance(tools, (list, tuple)) else []

    async def reset(self, task: Task) -> str:
        return await call_env(self.env.reset, task)  # type: ignore[no-any-return]

    async def step(self, model_text: str) -> StepResult:
        return await call_env(self.env.step, model_text)  # type: ignore[no-any-return]

    async def close(self) -> None:
        await close_env(self.env)


# ---------------------------------------------------------------------------------------------
class LatencyWrapper(EnvWrapper):
    """Adds a random delay before every step (simulated tool latency).

    ``constant``: ``seconds``; ``lognormal``: median ``seconds``, shape ``sigma``;
    ``pareto``: scale ``x_m = seconds``, tail index ``alpha`` (median ``x_m * 2**(1/alpha)``).
    Every delay is capped at ``max_seconds``. The delay is added to ``tool_call.latency_s``.
    """

    def __init__(self, env: AnyEnvironment, cfg: LatencyConfig, rng: random.Random) -> None:
        super().__init__(env)
        self.cfg = cfg
        self.rng = rng

    def sample_delay(self) -> float:
        c = self.cfg
        if c.kind == "none" or c.seconds <= 0:
            return 0.0
        if c.kind == "lognormal":
            delay = self.rng.lognormvariate(math.log(c.seconds), c.sigma)
        elif c.kind == "pareto":
            delay = c.seconds * self.rng.paretovariate(c.alpha)
        else:
            delay = c.seconds
        return min(delay, c.max_seconds)

    async def step(self, model_text: str) -> StepResult:
        delay = self.sample_delay()
        if delay > 0:
            await asyncio.sleep(delay)
        result = await super().step(model_text)
        if isinstance(result, StepResult) and isinstance(result.tool_call, ToolCall):
            result.tool_call.latency_s += delay
        return result


# ---------------------------------------------------------------------------------------------
class FaultWrapper(EnvWrapper):
    """Injects faults into steps, for robustness tests (``env.faults``, docs/environments.md).

    Per step, one uniform draw decides (rates stacked in this order): raise :class:`InjectedFault`,
    hang forever, or return a malformed result. Faults replace the inner step (the inner
    environment is not called), so the guard's retry sees an untouched environment; :meth:`active`
    confines them to task types or buckets, a wall-clock window or a switch file's existence.
    """

    MALFORMED_KINDS = ("non_str", "huge", "nan_reward", "inf_process_reward", "not_a_result")

    def __init__(self, env: AnyEnvironment, cfg: FaultConfig, rng: random.Random) -> None:
        super().__init__(env)
        self.cfg = cfg
        self.rng = rng
        self.bucket: tuple[str, str] = ("", "")

    async def reset(self, task: Task) -> str:
        self.bucket = (task.task_type, f"{task.task_type}:{task.difficulty}")
        return await super().reset(task)

    def active(self) -> bool:
        """Whether faults are injected now (task-type/bucket filter and time window)."""
        c, now = self.cfg, time.time()
        if c.task_types and not set(self.bucket) & set(c.task_types):
            return False
        if c.switch_file and not os.path.exists(c.switch_file):
            return False
        return now >= c.active_from and (not c.active_until or now < c.active_until)

    def _malformed(self) -> Any:
        kind = self.rng.choice(self.MALFORMED_KINDS)
        if kind == "non_str":
            return StepResult(observation=12345)  # type: ignore[arg-type]
        if kind == "huge":
            return StepResult(observation="x" * 1_000_000)
        if kind == "nan_reward":
            return StepResult(observation="ok", done=True, reward=float("nan"), outcome="success")
        if kind == "inf_process_reward":
            return StepResult(observation="ok", process_reward=float("inf"))
        return {"observation": "not a StepResult"}

    async def step(self, model_text: str) -> StepResult:
        u = self.rng.random()
        c = self.cfg
        if not self.active():
            return await super().step(model_text)
        if u < c.exception_rate:
            raise InjectedFault("injected fault: exception")
        if u < c.exception_rate + c.hang_rate:
            await asyncio.Event().wait()  # hang forever
        if u < c.exception_rate + c.hang_rate + c.malformed_rate:
            return self._malformed()  # type: ignore[no-any-return]
        return await super().step(model_text)


# ---------------------------------------------------------------------------------------------
class _AttemptFailed(Exception):
    def __init__(self, kind: FaultKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _describe(exc: Exception) -> str:
    """``Type: message``; a ``SystemExit`` or ``CancelledError`` wrapped by :func:`call_with_timeout` by
    its own message, which names it."""
    cause = exc.__cause__
    wrapped = (
        isinstance(exc, RuntimeError) and cause is not None and str(exc).startswith(type(cause).__name__)
    )
    return (str(exc) if wrapped else f"{type(exc).__name__}: {exc}")[:500]


class AnswerCostWrapper(EnvWrapper):
    """Answer-checking cost for environments that do not grade through the verifier cache.

    The built-ins grade answers through :data:`~asyncrl.envs.toolenv.VERIFIER_CACHE`, which counts
    the seconds spent grading (the cost ledger's ``reward`` component) and caches verdicts. For any
    other environment the step that ends an episode is taken to be its answer check: its time is
    added to the same counters (one uncached check), so a user environment's verification cost is
    not $0. An environment that calls ``VERIFIER_CACHE.verdict`` itself (see docs/environments.md)
    is counted there, and only there. Innermost in :func:`~asyncrl.envs.make_env`, so simulated
    latency and injected faults are not counted as grading.
    """

    async def step(self, model_text: str) -> StepResult:
        cache = VERIFIER_CACHE
        seen, started = cache.hits + cache.misses, time.perf_counter()
        result: StepResult = await call_env(self.env.step, model_text)
        if isinstance(result, StepResult) and result.done is True and cache.hits + cache.misses == seen:
            cache.seconds += time.perf_counter() - started
            cache.misses += 1
        return result


class GuardedEnv(EnvWrapper):
    """Isolates every environment fault; see the module docstring for the exact semantics."""

    def __init__(self, env: AnyEnvironment, cfg: GuardConfig) -> None:
        super().__init__(env)
        self.cfg = cfg

    async def _attempt(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """One attempt with the timeout; converts every failure into :class:`_AttemptFailed`."""
        try:
            return await call_with_timeout(call, self.cfg.step_timeout_s)
        except CallTimeout as exc:
            raise _AttemptFailed("timeout", str(exc)) from None
        except Exception as exc:
            raise _AttemptFailed("exception", _describe(exc)) from None

    async def _guarded(
        self, call: Callable[[], Awaitable[Any]], validate: Callable[[Any], Any]
    ) -> tuple[Any, list[Fault]]:
        failures: list[Fault] = []
        attempts = self.cfg.retries + 1
        GUARD_STATS.calls += 1
        for attempt in range(1, attempts + 1):
            started = time.monotonic()
            try:
                return validate(await self._attempt(call)), failures
            except _AttemptFailed as failed:
                failures.append(Fault(kind=failed.kind, message=failed.message, attempts=attempt))
                GUARD_STATS.retries += attempt < attempts
                GUARD_STATS.fault_seconds += time.monotonic() - started
                if failed.kind == "timeout":
                    GUARD_STATS.timeouts += 1
                elif failed.kind == "exception":
                    GUARD_STATS.exceptions += 1
                else:
                    GUARD_STATS.malformed += 1
        GUARD_STATS.faults += 1
        return None, failures

    # -- validation ----------------------------------------------------------------------------
    def _check_text(self, obs: object, what: str) -> str:
        if not isinstance(obs, str):
            raise _AttemptFailed("malformed", f"{what} is {type(obs).__name__}, expected str")
        if len(obs) > self.cfg.max_observation_chars:
            raise _AttemptFailed(
                "malformed", f"{what} has {len(obs)} characters (limit {self.cfg.max_observation_chars})"
            )
        return str.__str__(obs)

    def _validate_step(self, value: object) -> StepResult:
        if problems := step_problems(value):
            raise _AttemptFailed(*problems[0])
        assert isinstance(value, StepResult)
        return StepResult(  # fault / retried_faults are the guard's to set, never the environment's
            observation=self._check_text(value.observation, "observation"),
            process_reward=float(value.process_reward),
            done=value.done,
            reward=float(value.reward),
            outcome=value.outcome,
            info=dict(value.info),
            tool_call=value.tool_call,
            malformed=value.malformed,
        )

    # -- the protocol --------------------------------------------------------------------------
    async def reset(self, task: Task) -> str:
        obs, failures = await self._guarded(
            lambda: call_env(self.env.reset, task), lambda v: self._check_text(v, "reset() result")
        )
        if obs is None:
            raise EnvResetError(failures[-1])  # its attempts: all of them
        return obs  # type: ignore[no-any-return]

    async def step(self, model_text: str) -> StepResult:
        result, failures = await self._guarded(
            lambda: call_env(self.env.step, model_text), self._validate_step
        )
        if result is None:
            last = failures[-1]  # its attempts: all of them
            action = parse_action(model_text)
            call = None
            if isinstance(action, ToolCallAction):  # a failed tool call: the tool metrics must see it
                GUARD_STATS.tool_faults += 1
                call = tool_call(action.name, action.args, False, last.message)
            return StepResult(self.cfg.fault_observation, self.cfg.fault_reward, tool_call=call, fault=last)
        if failures:
            result.retried_faults = list(failures)
        if result.tool_call is None and not result.malformed:
            result.tool_call = self._recorded_call(model_text, result)
        return result  # type: ignore[no-any-return]

    def _recorded_call(self, model_text: str, result: StepResult) -> ToolCall | None:
        """The tool call a turn made, from the parsed action, for an environment whose ``StepResult``
        carries none (every tool metric reads ``tool_call``): a call of one of its tools, ``ok`` unless
        the observation starts with ``error`` (the built-ins' convention). ``None`` for anything else."""
        action = parse_action(model_text)
        if not isinstance(action, ToolCallAction) or action.name not in {t.name for t in self.tools}:
            return None
        GUARD_STATS.tool_calls_recorded += 1
        failed = result.observation.lstrip().lower().startswith("error")
        return tool_call(action.name, action.args, not failed, result.observation)

    async def close(self) -> None:
        """Close the inner environment; errors and hangs are swallowed (nothing escapes)."""
        with contextlib.suppress(_AttemptFailed):
            await self._attempt(lambda: close_env(self.env))
