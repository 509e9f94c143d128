"""Plain helpers and constants shared by several test files (shared fixtures: ``conftest.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.envs.base import AnyEnvironment, StepResult, call_env
from asyncrl.records import Task
from asyncrl.telemetry.reports import GroupReport

TINY_RUN = [  # the core of a small, quick training run; each file adds its sizes (held-out, batch, steps)
    "model.max_context=256",
    "env.latency.kind=constant",
    "env.latency.seconds=0.002",
    "rollout.group_size=8",
    "rollout.concurrent_episodes=32",
    "rollout.sampling.max_new_tokens=16",
    "trainer.checkpoint_every=2",
    "trainer.sft.steps=30",
    "trainer.sft.num_demos=200",
    "telemetry.log_every_s=0.5",
    "telemetry.tensorboard=false",
]


TWO_STEPS = [  # a two-step run of a model the test brings: the least that trains, publishes and evaluates
    "env.kind=calculator",
    "env.heldout_size=2",
    "env.max_turns=2",
    "rollout.group_size=2",
    "rollout.concurrent_episodes=4",
    "rollout.sampling.max_new_tokens=16",
    "trainer.batch_size=4",
    "trainer.total_steps=2",
    "trainer.sft.steps=1",
    "trainer.sft.batch_size=2",
    "trainer.sft.num_demos=2",
    "telemetry.eval_every=0",
    "telemetry.tensorboard=false",
]

TINY_MODEL = [  # the smallest char model the tests train (one layer, hidden size 32)
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
]


def wait_for(pred: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> None:
    """Poll ``pred`` every ``every`` seconds until it is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def calc_task() -> Task:
    """One calculator task (3 × 4 + 5 = 17)."""
    return Task(
        id="t",
        task_type="arithmetic",
        difficulty=2,
        payload={
            "prompt": "Ann has 3 bags of 4 pens. She gets 5 more. How many pens?",
            "start": 3,
            "steps": [["*", 4], ["+", 5]],
            "answer": "17",
        },
    )


def replay_buffer(batch_size: int, staleness: Any, **kw: Any) -> Any:
    """The trainer's replay buffer (``ReplayBuffer.of`` on the default config: ``trainer.buffer_*``, seed 0)
    for batches of ``batch_size`` samples; ``kw`` overrides its fields."""
    import dataclasses

    from asyncrl.config import RunConfig
    from asyncrl.trainer.buffer import ReplayBuffer

    buffer = ReplayBuffer.of(RunConfig(), staleness)
    return dataclasses.replace(buffer, batch_size=batch_size, **kw)


def free_port() -> int:
    """A TCP port free on the loopback address now (a trainer group's rendezvous in tests)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fault_row(fault: str, s: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One row of docs/reliability.md's fault table from a run's ``summary.json``, appended to
    ``$ASYNCRL_FAULTS_REPORT`` when it is set (``bench/faults_table.py`` renders them)."""
    import json
    import os

    row = {
        "fault": fault,
        "completed": True,
        "produced": s["samples_accepted"],
        "trained": s["samples_trained"],
        "dropped_stale": s["samples_dropped_stale"],
        "dropped_other": s["samples_dropped_other"],
        "dead_lettered": s["dead_letters"],
        "left_in_queue": s["samples_left_in_queue"],
        "lost": s["lost_trajectories"],
        "trained_twice": s["duplicates_recorded"],
        "versions_monotone": True,
        **extra,
    }
    report = os.environ.get("ASYNCRL_FAULTS_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def run_texts_sync(env: AnyEnvironment, task: Task, texts: Sequence[str]) -> list[StepResult]:
    """Reset ``env`` on ``task`` and feed it ``texts`` (until done)."""

    async def go() -> list[StepResult]:
        await call_env(env.reset, task)
        results = []
        for text in texts:
            res = await call_env(env.step, text)
            results.append(res)
            if res.done:
                break
        return results

    return asyncio.run(go())


def training_group(bucket: str, rewards: list[float]) -> GroupReport:
    """The ``rollout/group`` report of a finished training group of ``bucket`` (success: reward > 0)."""
    outcomes = ["success" if r > 0 else "failure" for r in rewards]
    return GroupReport(
        bucket=bucket,
        started=0.0,
        heldout=False,
        outcomes=outcomes,
        rewards=rewards,
        anomalies=[None] * len(rewards),
    )
