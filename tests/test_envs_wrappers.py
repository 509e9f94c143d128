"""Latency, fault injection and the guard: nothing an environment does escapes the guard."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import statistics
import time
from collections.abc import Coroutine
from typing import Any

import msgspec
import pytest

from asyncrl.config import (
    ConstantLatencyConfig,
    EnvConfig,
    FaultConfig,
    GuardConfig,
    LatencyConfig,
    LognormalLatencyConfig,
    NoLatencyConfig,
    ParetoLatencyConfig,
)
from asyncrl.envs import (
    CalculatorEnv,
    EnvResetError,
    FaultWrapper,
    GuardedEnv,
    LatencyWrapper,
    StepResult,
    Tool,
    make_env,
    make_task_source,
)
from asyncrl.records import Fault, Task, ToolCall
from asyncrl.telemetry.reports import GuardFigures

TASK = Task(id="t", task_type="x")
FAST = GuardConfig(step_timeout_s=0.3, retries=1, fault_reward=-0.2, fault_observation="[tool error]")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run without waiting for abandoned environment calls at shutdown (unlike asyncio.run)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


class Scripted:
    """Async env whose step behaviour is a function of the attempt number."""

    def __init__(self, behaviour: Any, reset_behaviour: Any = None) -> None:
        self.tools = [Tool("t", "test tool")]
        self.behaviour = behaviour
        self.reset_behaviour = reset_behaviour
        self.calls = 0
        self.reset_calls = 0

    async def reset(self, task: Task) -> str:
        self.reset_calls += 1
        if self.reset_behaviour is not None:
            return await self.reset_behaviour(self.reset_calls)  # type: ignore[no-any-return]
        return "prompt"

    async def step(self, model_text: str) -> StepResult:
        self.calls += 1
        return await self.behaviour(self.calls)  # type: ignore[no-any-return]


async def good(_: int) -> StepResult:
    return StepResult(observation="fine", process_reward=0.1)


async def raises(_: int) -> StepResult:
    raise ValueError("boom")


async def system_exit(_: int) -> StepResult:
    raise SystemExit(3)


async def cancelled(_: int) -> StepResult:
    raise asyncio.CancelledError()


async def hangs(_: int) -> StepResult:
    await asyncio.Event().wait()
    raise AssertionError


async def hangs_ignoring_cancel(_: int) -> StepResult:
    for _ in range(100):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue
    raise AssertionError


async def non_str(_: int) -> Any:
    return StepResult(observation=None)  # type: ignore[arg-type]


async def huge(_: int) -> Any:
    return StepResult(observation="x" * 100_000)


async def not_a_result(_: int) -> Any:
    return {"observation": "hi"}


async def nan_reward(_: int) -> Any:
    return StepResult(observation="x", done=True, reward=float("nan"), outcome="success")


async def inf_process(_: int) -> Any:
    return StepResult(observation="x", process_reward=-math.inf)


async def string_reward(_: int) -> Any:
    return StepResult(observation="x", process_reward="0.5")  # type: ignore[arg-type]


async def bad_outcome(_: int) -> Any:
    return StepResult(observation="x", done=True, outcome="great")


async def done_without_outcome(_: int) -> Any:
    return StepResult(observation="x", done=True)


@pytest.mark.parametrize(
    ("behaviour", "kind", "fragment"),
    [
        (raises, "exception", "ValueError: boom"),
        (system_exit, "exception", "SystemExit"),
        (cancelled, "exception", "CancelledError"),
        (hangs, "timeout", "0.3s"),
        (hangs_ignoring_cancel, "timeout", "0.3s"),
        (non_str, "malformed", "NoneType"),
        (huge, "malformed", "100000 characters"),
        (not_a_result, "malformed", "dict"),
        (nan_reward, "bad_reward", "nan"),
        (inf_process, "bad_reward", "inf"),
        (string_reward, "bad_reward", "str"),
        (bad_outcome, "malformed", "great"),
        (done_without_outcome, "malformed", "outcome"),
    ],
)
def test_every_failure_becomes_a_fault_observation(behaviour: Any, kind: str, fragment: str) -> None:
    env = Scripted(behaviour)
    guard = GuardedEnv(env, FAST)

    async def go() -> StepResult:
        await guard.reset(TASK)
        return await guard.step("<answer>1</answer>")

    started = time.monotonic()
    res = run(go())
    assert time.monotonic() - started < 2.0
    assert res.observation == "[tool error]" and res.process_reward == -0.2 and not res.done
    fault = res.fault
    assert isinstance(fault, Fault) and fault.kind == kind and fault.attempts == 2
    assert fragment in fault.message
    assert env.calls == 2  # one retry, re-sending the same text


def test_retry_recovers_and_records_the_failure() -> None:
    async def flaky(call: int) -> StepResult:
        if call == 1:
            raise RuntimeError("transient")
        return StepResult(observation="ok", process_reward=0.5)

    guard = GuardedEnv(Scripted(flaky), FAST)
    res = run(guard.step("x"))
    assert res.observation == "ok" and res.process_reward == 0.5
    assert [f.kind for f in res.retried_faults] == ["exception"]


def test_malformed_passes_the_guard_and_faults_are_the_guards_alone() -> None:
    """``StepResult.malformed`` reaches the runner; a non-bool is itself malformed; a ``fault`` the
    environment sets is not believed (only the guard reports faults)."""

    async def says_malformed(call: int) -> StepResult:
        return StepResult(observation="?", malformed=True)

    async def claims_a_fault(call: int) -> StepResult:
        return StepResult(observation="fine", fault=Fault(kind="timeout", message="made up", attempts=1))

    async def bad_flag(call: int) -> StepResult:
        return StepResult(observation="?", malformed="yes")  # type: ignore[arg-type]

    res = run(GuardedEnv(Scripted(says_malformed), FAST).step("x"))
    assert res.malformed and res.fault is None
    res = run(GuardedEnv(Scripted(claims_a_fault), FAST).step("x"))
    assert res.observation == "fine" and res.fault is None
    res = run(GuardedEnv(Scripted(bad_flag), FAST).step("x"))
    assert res.fault is not None and res.fault.kind == "malformed" and "malformed is str" in res.fault.message


def test_zero_retries_means_one_attempt() -> None:
    env = Scripted(raises)
    res = run(GuardedEnv(env, GuardConfig(step_timeout_s=1, retries=0)).step("x"))
    assert env.calls == 1 and res.fault.attempts == 1


def test_valid_results_are_rebuilt_with_plain_floats() -> None:
    class Real(float):
        pass

    async def odd(_: int) -> StepResult:
        call = ToolCall(name="t", arguments="", ok=True)
        return StepResult(
            observation="fine",
            process_reward=Real(0.25),
            done=True,
            reward=1,
            outcome="success",
            tool_call=call,
        )

    res = run(GuardedEnv(Scripted(odd), FAST).step("x"))
    assert type(res.process_reward) is float and type(res.reward) is float and res.reward == 1.0
    assert res.done and res.outcome == "success" and res.tool_call is not None


@pytest.mark.parametrize(
    ("behaviour", "kind"), [(raises, "exception"), (hangs, "timeout"), (non_str, "malformed")]
)
def test_reset_failure_raises_env_reset_error(behaviour: Any, kind: str) -> None:
    async def reset_fail(call: int) -> Any:
        if behaviour is non_str:
            return 42
        return await behaviour(call)

    env = Scripted(good, reset_behaviour=reset_fail)
    with pytest.raises(EnvResetError) as info:
        run(GuardedEnv(env, FAST).reset(TASK))
    assert info.value.fault.kind == kind and info.value.fault.attempts == 2 and env.reset_calls == 2


def test_reset_recovers_on_retry() -> None:
    async def once(call: int) -> str:
        if call == 1:
            raise OSError("flaky")
        return "prompt"

    assert run(GuardedEnv(Scripted(good, reset_behaviour=once), FAST).reset(TASK)) == "prompt"


class SyncEnv:
    """A synchronous environment (plain def), optionally blocking."""

    def __init__(self, block_s: float = 0.0, fail: bool = False) -> None:
        self.tools: list[Tool] = []
        self.block_s = block_s
        self.fail = fail

    def reset(self, task: Task) -> str:
        return "sync prompt"

    def step(self, model_text: str) -> StepResult:
        time.sleep(self.block_s)  # blocks its thread, never the event loop
        if self.fail:
            raise KeyboardInterrupt("sync interrupt")
        return StepResult(observation=model_text.upper())


def test_sync_env_is_supported() -> None:
    guard = GuardedEnv(SyncEnv(), FAST)
    assert run(guard.reset(TASK)) == "sync prompt"
    assert run(guard.step("abc")).observation == "ABC"


def test_sync_env_blocking_times_out_without_blocking_the_loop() -> None:
    guard = GuardedEnv(SyncEnv(block_s=5.0), FAST)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async def go() -> StepResult:
        t = asyncio.ensure_future(ticker())
        res = await guard.step("x")
        t.cancel()
        return res

    started = time.monotonic()
    res = run(go())
    assert time.monotonic() - started < 1.5
    assert res.fault.kind == "timeout" and ticks > 20  # the loop kept running


def test_sync_env_base_exception_is_contained() -> None:
    res = run(GuardedEnv(SyncEnv(fail=True), FAST).step("x"))
    assert res.fault.kind == "exception" and "KeyboardInterrupt" in res.fault.message


def test_close_never_raises() -> None:
    class BadClose(SyncEnv):
        def close(self) -> None:
            raise RuntimeError("close failed")

    run(GuardedEnv(BadClose(), FAST).close())
    run(GuardedEnv(SyncEnv(), FAST).close())  # no close() at all


# ---------------------------------------------------------------------------------------------
# Fault injection
# ---------------------------------------------------------------------------------------------
def test_fault_wrapper_rates_and_guard_absorbs_them() -> None:
    faults = FaultConfig(exception_rate=0.2, hang_rate=0.1, malformed_rate=0.2)
    inner = Scripted(good)
    guard = GuardedEnv(
        FaultWrapper(inner, faults, random.Random(0)), GuardConfig(step_timeout_s=0.05, retries=0)
    )

    async def go() -> list[StepResult]:
        return [await guard.step("x") for _ in range(300)]

    results = run(go())
    kinds = [r.fault.kind if r.fault is not None else "ok" for r in results]
    share = {
        k: kinds.count(k) / len(kinds) for k in ("ok", "exception", "timeout", "malformed", "bad_reward")
    }
    assert abs(share["exception"] - 0.2) < 0.07
    assert abs(share["timeout"] - 0.1) < 0.05
    assert abs(share["malformed"] + share["bad_reward"] - 0.2) < 0.07
    assert abs(share["ok"] - 0.5) < 0.08
    assert inner.calls == kinds.count("ok")  # faults replace the inner step


def test_fault_wrapper_injects_each_malformed_kind() -> None:
    w = FaultWrapper(Scripted(good), FaultConfig(malformed_rate=1.0), random.Random(1))
    guard = GuardedEnv(w, GuardConfig(step_timeout_s=1, retries=0))

    async def go() -> set[str]:
        return {(await guard.step("x")).fault.kind for _ in range(60)}  # type: ignore[union-attr]

    assert run(go()) == {"malformed", "bad_reward"}


# ---------------------------------------------------------------------------------------------
# Latency
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cfg", "expected_median"),
    [
        (ConstantLatencyConfig(seconds=0.3), 0.3),
        (LognormalLatencyConfig(seconds=0.5, sigma=1.0), 0.5),
        (ParetoLatencyConfig(seconds=0.2, alpha=1.5), 0.2 * 2 ** (1 / 1.5)),
        (NoLatencyConfig(), 0.0),
    ],
)
def test_latency_median(cfg: LatencyConfig, expected_median: float) -> None:
    w = LatencyWrapper(Scripted(good), cfg, random.Random(0))
    samples = [w.sample_delay() for _ in range(20000)]
    assert statistics.median(samples) == pytest.approx(expected_median, rel=0.05, abs=1e-9)
    assert max(samples) <= getattr(cfg, "max_seconds", 0.0)


def test_latency_is_capped() -> None:
    cfg = ParetoLatencyConfig(seconds=1.0, alpha=0.2, max_seconds=2.0)
    w = LatencyWrapper(Scripted(good), cfg, random.Random(0))
    samples = [w.sample_delay() for _ in range(5000)]
    assert max(samples) == 2.0 and min(samples) >= 1.0


def test_latency_really_sleeps_and_is_added_to_the_tool_call() -> None:
    env = CalculatorEnv()
    task = make_task_source(EnvConfig(kind="calculator")).sample(random.Random(0))
    w = LatencyWrapper(env, ConstantLatencyConfig(seconds=0.1), random.Random(0))

    async def go() -> StepResult:
        await w.reset(task)
        return await w.step("<tool>calc(1+1)</tool>")

    started = time.monotonic()
    res = run(go())
    assert time.monotonic() - started >= 0.1
    assert res.tool_call is not None and res.tool_call.latency_s >= 0.1


def test_make_env_stacks_the_wrappers() -> None:
    cfg = EnvConfig(
        kind="calculator",
        latency=ConstantLatencyConfig(seconds=0.01),
        faults=FaultConfig(exception_rate=0.3),
        guard=GuardConfig(step_timeout_s=1.0, retries=5),
    )
    env = make_env(cfg, rng_seed=0)
    assert isinstance(env, GuardedEnv) and isinstance(env.env, FaultWrapper)
    assert isinstance(env.env.env, LatencyWrapper) and isinstance(env.env.env.env, CalculatorEnv)
    assert [t.name for t in env.tools] == ["calc"]
    task = make_task_source(cfg).sample(random.Random(0))

    async def go() -> list[StepResult]:
        await env.reset(task)
        return [await env.step(t) for t in CalculatorEnv.solve(task)]

    results = run(go())
    assert results[-1].outcome == "success"  # 6 attempts per step absorb a 30% fault rate
    plain = make_env(EnvConfig(kind="calculator"), rng_seed=0)
    assert isinstance(plain.env, CalculatorEnv)


def test_guard_counts_faults_and_a_failed_tool_call_counts_as_a_failed_tool_call() -> None:
    """30% raising tool calls: the tool metrics show ~70% success, not 100%, and the guard's counts
    (faults, retries, timeouts by kind) say what happened."""

    from asyncrl.envs.wrappers import GUARD_STATS
    from asyncrl.records import Trajectory, Turn
    from asyncrl.telemetry.lifecycle import batch_stats

    async def tool_ok(_: int) -> StepResult:
        return StepResult(observation="3", tool_call=ToolCall(name="calc", arguments="1+2", ok=True))

    before = dataclasses.replace(GUARD_STATS)
    guard = GuardedEnv(
        FaultWrapper(Scripted(tool_ok), FaultConfig(exception_rate=0.3), random.Random(0)),
        GuardConfig(step_timeout_s=0.3, retries=0),
    )

    async def go() -> list[StepResult]:
        return [await guard.step("<tool>calc(1+2)</tool>") for _ in range(200)]

    results = run(go())
    failed = sum(r.fault is not None for r in results)
    assert 0.2 < failed / 200 < 0.4
    assert all(r.tool_call is not None for r in results)
    bad = [r.tool_call for r in results if r.fault is not None]
    assert all(c is not None and not c.ok and c.name == "calc" and c.error for c in bad)
    turns = [Turn(role="model", token_ids=[1], logprobs=[0.0], tool_call=r.tool_call) for r in results]
    traj = Trajectory(id="t", task=Task(id="x", task_type="calc"), turns=turns)
    assert batch_stats([], [traj])["tools/success_rate"] == pytest.approx(1 - failed / 200)
    delta = {k: getattr(GUARD_STATS, k) - v for k, v in dataclasses.asdict(before).items()}
    assert delta["calls"] == 200 and delta["faults"] == failed and delta["exceptions"] == failed
    assert delta["tool_faults"] == failed and delta["retries"] == 0 and delta["timeouts"] == 0
    reported = msgspec.convert(dataclasses.asdict(GUARD_STATS), GuardFigures)  # as the worker reports them
    assert reported.flat()["guard/faults"] == GUARD_STATS.faults


def test_guard_counts_retries_and_timeouts() -> None:

    from asyncrl.envs.wrappers import GUARD_STATS

    async def hang_once(call: int) -> StepResult:
        if call == 1:
            await asyncio.sleep(5)
        return StepResult(observation="ok")

    before = dataclasses.replace(GUARD_STATS)
    res = run(GuardedEnv(Scripted(hang_once), FAST).step("<answer>1</answer>"))
    assert res.observation == "ok" and res.tool_call is None
    assert GUARD_STATS.retries - before.retries == 1 and GUARD_STATS.timeouts - before.timeouts == 1
    assert GUARD_STATS.faults == before.faults  # recovered on the retry
    assert GUARD_STATS.fault_seconds - before.fault_seconds >= 0.29
