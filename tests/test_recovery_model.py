"""Model checking of acknowledgement by fate (:mod:`asyncrl.trainer.intake`) with Hypothesis.

The real pieces — :class:`~asyncrl.transport.EmbeddedQueue`, :class:`~asyncrl.control.store.
SQLiteStateStore` (the ledger), :class:`~asyncrl.trainer.buffer.ReplayBuffer` and
:class:`~asyncrl.trainer.intake.Intake` — are driven by a rule-based state machine over random
interleavings of: a worker putting a group — one entry, whole (fresh, stale, with a non-finite member,
or smaller than ``group_size``: per-turn samples, agent sessions dropped as stale) —, one trainer iteration (lease, assemble, drop, train, checkpoint every
``checkpoint_every`` steps), a non-finite step, a crash of the trainer at any point (before the
checkpoint, after taking entries, between recording the trained fates and acknowledging them), and
the clock running past the lease. The queue's clock is a fake one, so leases expire exactly when
the machine says. Capacity is the smallest the config allows (:func:`asyncrl.config.min_queue_capacity`),
where back-pressure is tightest.

Checked after every rule:
* **never stuck**: when the queue is full, it holds an entry the live trainer does not (ready, or
  leased by a dead trainer and so ready after the lease) — the trainer can take it and move;
* the trainer holds at most :func:`asyncrl.config.max_trainer_held` un-acked entries (groups: a batch
  holds at most ``batch_size`` of them, each at least one sample);
* **nothing lost**: every accepted sample's id is in the ledger, or its group is still queued or
  dead-lettered;
* **nothing trained twice**: no id is committed (trained in a step a checkpoint covers) twice, and the
  ledger's ``trained`` rows are exactly the committed ids; no duplicate fate was ever recorded.
At the end of every example the run is **driven to completion** from the state reached: the clock
passes the lease, workers put fresh groups whenever the queue takes them, and the trainer must do
``2 × checkpoint_every + 1`` more steps within a bounded number of iterations.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time as real_time
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import asyncrl.transport.embedded as embedded
from asyncrl.config import max_trainer_held, min_queue_capacity
from asyncrl.control import RunState
from asyncrl.control.store import SQLiteStateStore
from asyncrl.records import Group, Task, Trajectory, Turn, members, new_id
from asyncrl.staleness import StalenessPolicy
from asyncrl.trainer.intake import Intake
from asyncrl.transport import EmbeddedQueue
from helpers import replay_buffer

B, LAG, LEASE = 4, 1, 10.0  # batch size, max staleness, lease seconds; group size G is drawn (2 or 4)
_FAST_TMP = (
    "/dev/shm" if Path("/dev/shm").is_dir() else None
)  # SQLite commits in memory: thousands per example


class FakeTime:
    """Stands in for the ``time`` module inside the embedded queue: ``time()`` is ours to move."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return real_time.monotonic()

    def sleep(self, s: float) -> None:
        pass


CLOCK = FakeTime()


def traj(group: str, version: int, reward: float = 1.0) -> Trajectory:
    return Trajectory(
        id=new_id(),
        task=Task(id="t", task_type="arithmetic"),
        turns=[
            Turn(role="env", token_ids=[1, 2]),
            Turn(role="model", token_ids=[3], logprobs=[-0.5], version=version),
        ],
        final_reward=reward,
        group_id=group,
    )


class SimTrainer:
    """The trainer loop of :mod:`asyncrl.trainer.process` with the learner replaced by a step counter."""

    def __init__(self, m: RecoveryMachine) -> None:
        self.m = m
        self.step = m.ckpt_step
        self.offset = max(0, m.published - self.step)  # versions never go back after a resume
        self.buffer = replay_buffer(
            B, StalenessPolicy.from_config("async", LAG, B, "drop"), capacity_steps=m.bs
        )
        self.intake = Intake(m.queue, m.state, pull_size=2 * B)  # as the trainer sizes it
        self.since_ckpt: list[str] = []

    @property
    def version(self) -> int:
        return self.step + self.offset

    def iterate(self, *, non_finite_step: bool = False, crash_mid_checkpoint: bool = False) -> bool:
        """One loop iteration; returns whether it trained a step. ``crash_mid_checkpoint``: stop between
        recording the trained fates and acknowledging them (the caller then crashes the trainer)."""
        self.intake.pull(self.buffer, timeout=0.0)
        groups, dropped = self.buffer.take(self.version, LAG)
        self.intake.settle((d.traj.id, d.reason, self.step, d.age) for d in dropped)
        if groups is None:
            return False
        batch = members(groups)
        if non_finite_step:
            self.intake.settle((t.id, "skipped", self.step, 0) for t in batch)
            return False
        ages = [self.version - (t.oldest_version() or 0) for t in batch]
        assert max(ages) <= LAG, ages  # rule 4: nothing older than the bound is trained
        self.intake.mark_trained(batch, self.step, ages)
        self.since_ckpt += [t.id for t in batch]
        self.step += 1
        self.m.published = max(self.m.published, self.version)
        if self.step % self.m.c == 0:
            self.checkpoint(crash_mid_checkpoint)
        return True

    def checkpoint(self, crash_mid: bool = False) -> None:
        # 1. the checkpoint is on disk: its weights hold every step since the last one
        self.m.ckpt_step = self.step
        for tid in self.since_ckpt:
            assert tid not in self.m.committed, f"{tid} trained in two checkpointed steps"
            self.m.committed.add(tid)
        self.since_ckpt = []
        # 2. fates, then acknowledgements
        acks = self.intake.record_trained()
        if not crash_mid:
            self.m.queue.ack(acks)


class RecoveryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="asyncrl-model-", dir=_FAST_TMP))
        self.accepted: set[str] = set()
        self.members: dict[str, list[str]] = {}
        """Group id -> its members' ids (what a queued or dead-lettered entry holds)."""
        self.committed: set[str] = set()
        self.ckpt_step = self.published = 0
        self.crashes = 0

    @initialize(c=st.integers(1, 3), bs=st.integers(1, 2), g=st.sampled_from([2, 4]))
    def setup(self, c: int, bs: int, g: int = 2) -> None:
        self.c, self.bs, self.G = c, bs, g
        self.capacity = min_queue_capacity(c, bs, B)  # the smallest transport.capacity the config accepts
        self.queue = EmbeddedQueue(
            self.dir / "queue.sqlite", capacity=self.capacity, lease_seconds=LEASE, busy_timeout_s=30.0
        )
        self.state = RunState(
            SQLiteStateStore(self.dir / "control.sqlite"),
            StalenessPolicy.from_config("async", LAG, B, "drop"),
            1,
        )
        self.trainer = SimTrainer(self)

    def teardown(self) -> None:
        try:
            if hasattr(self, "trainer"):
                self.drive_to_completion()
        finally:
            if hasattr(self, "queue"):
                self.queue.close()
                self.state.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- the world ------------------------------------------------------------------------------------
    def put_group(self, version: int, size: int, non_finite: int | None = None) -> bool:
        gid = new_id()
        trajs = [traj(gid, max(0, version), float("nan") if k == non_finite else 1.0) for k in range(size)]
        if not self.queue.put(Group.of(trajs[0].task, trajs, id=gid), timeout=0):
            return False  # back-pressure: the worker waits (tried again by a later rule)
        self.members[gid] = [t.id for t in trajs]
        self.accepted.update(self.members[gid])
        return True

    @rule(
        lag=st.integers(0, LAG + 2),
        members=st.integers(1, 4),
        non_finite=st.sampled_from([None, None, None, 0]),
    )
    def worker_puts(self, lag: int, members: int, non_finite: int | None) -> None:
        # members < G: a smaller group (per-turn samples, agent sessions dropped as stale)
        self.put_group(self.published - lag, min(members, self.G), non_finite)

    @rule(n=st.integers(1, 4))
    def trainer_iterates(self, n: int) -> None:
        for _ in range(n):
            self.trainer.iterate()

    @rule()
    def non_finite_step(self) -> None:
        self.trainer.iterate(non_finite_step=True)

    @rule()
    def trainer_killed(self) -> None:
        """kill -9: everything in memory is gone; the restart resumes from the last checkpoint."""
        self.crashes += 1
        self.trainer = SimTrainer(self)

    @rule()
    def trainer_killed_after_taking(self) -> None:
        self.trainer.intake.pull(self.trainer.buffer, timeout=0.0)
        self.trainer_killed()

    @rule()
    def trainer_killed_mid_checkpoint(self) -> None:
        """Steps up to a checkpoint, which records the trained fates, then dies before acknowledging."""
        for _ in range(4 * self.c):
            at_checkpoint = (self.trainer.step + 1) % self.c == 0
            if self.trainer.iterate(crash_mid_checkpoint=at_checkpoint) and at_checkpoint:
                break
        self.trainer_killed()

    @rule(seconds=st.sampled_from([1.0, LEASE + 0.1]))
    def clock_runs(self, seconds: float) -> None:
        CLOCK.now += seconds

    # -- invariants ------------------------------------------------------------------------------------
    def queued_ids(self) -> set[str]:
        """The samples of the groups still queued."""
        with sqlite3.connect(self.dir / "queue.sqlite") as db:
            rows = db.execute("SELECT group_id FROM entries").fetchall()
        return {tid for r in rows for tid in self.members[str(r[0])]}

    @invariant()
    def never_stuck(self) -> None:
        if not hasattr(self, "queue"):
            return
        held = self.trainer.intake.held()
        assert held <= max_trainer_held(self.c, self.bs, B), (held, self.c, self.bs)
        depth = self.queue.depth()
        if depth >= self.capacity:
            assert depth - held > 0, "the queue is full of entries the live trainer holds"

    @invariant()
    def nothing_lost_nothing_twice(self) -> None:
        if not hasattr(self, "queue"):
            return
        ledger = self.state.ids_with_fate()
        dead = {tid for d in self.queue.dead_letters() for tid in self.members[d.group_id]}
        assert self.accepted <= ledger | self.queued_ids() | dead, "an accepted trajectory vanished"
        assert self.state.tallies().duplicates == 0
        with sqlite3.connect(self.dir / "control.sqlite") as db:
            trained = {str(r[0]) for r in db.execute("SELECT traj_id FROM ledger WHERE fate='trained'")}
        assert trained == self.committed

    # -- liveness --------------------------------------------------------------------------------------
    def drive_to_completion(self) -> None:
        CLOCK.now += LEASE + 0.1  # leases of dead trainers expire
        goal = self.trainer.step + 2 * self.c + 1
        for _ in range(20 * (goal - self.trainer.step) + 20):
            if self.trainer.step >= goal:
                break
            while self.put_group(self.published, self.G):
                pass
            self.trainer.iterate()
            CLOCK.now += 0.5
        assert self.trainer.step >= goal, (
            f"stuck at step {self.trainer.step} (goal {goal}): depth {self.queue.depth()}/{self.capacity}, "
            f"held {self.trainer.intake.held()}, buffered {len(self.trainer.buffer)}, "
            f"fates {self.state.fate_counts()}, groups {[len(g) for g in self.trainer.buffer._groups.values()]}"
        )
        self.nothing_lost_nothing_twice()


def test_acknowledge_by_fate_never_deadlocks_loses_or_trains_twice() -> None:
    with mock.patch.object(embedded, "time", CLOCK):
        run_state_machine_as_test(
            RecoveryMachine,
            settings=settings(
                max_examples=int(os.environ.get("ASYNCRL_MODEL_EXAMPLES", "120")),
                stateful_step_count=40,
                deadline=None,
                phases=[
                    p for p in Phase if p != Phase.shrink or not os.environ.get("ASYNCRL_MODEL_NOSHRINK")
                ],
                suppress_health_check=list(HealthCheck),
            ),
        )


def test_the_model_finds_the_old_deadlock(monkeypatch: Any) -> None:
    """Teeth: with drops held un-acknowledged until the next checkpoint (the old rule), a run of stale
    samples fills the queue with entries only the trainer holds, and no batch (so no checkpoint) comes."""

    def settle_at_checkpoint(self: Intake, rows: Any) -> None:
        self.done_ids.update(r[0] for r in rows)  # fate known, entries kept for the next checkpoint

    monkeypatch.setattr(Intake, "settle", settle_at_checkpoint)
    with mock.patch.object(embedded, "time", CLOCK):
        m = RecoveryMachine()
        m.setup(c=3, bs=1)
        try:
            for _ in range(3 * m.capacity):
                m.put_group(m.published - LAG - 1, m.G)  # stale: dropped on arrival
                m.trainer.iterate()
            assert m.queue.depth() >= m.capacity
            assert m.queue.depth() - m.trainer.intake.held() == 0  # stuck: nothing the trainer can take
        finally:
            m.queue.close()
            m.state.close()
            shutil.rmtree(m.dir, ignore_errors=True)


def test_the_bound_counts_groups_of_one_sample() -> None:
    """Entries are groups, and a group may hold a single sample (its mates dropped as non-finite or
    stale, a small per-call group): a batch then takes ``batch_size`` entries. The trainer holds up to
    ``(checkpoint_every − 1 + buffer_steps) × batch_size`` entries — beyond what groups of ``G`` would
    fill — and the capacity the config requires counts that."""
    with mock.patch.object(embedded, "time", CLOCK):
        m = RecoveryMachine()
        m.setup(c=2, bs=1, g=4)
        try:
            for _ in range(B):
                m.put_group(m.published, 1)
            m.trainer.iterate()  # a batch of 4 one-sample groups: 4 entries held until the checkpoint
            assert m.trainer.step == 1
            for _ in range(B):
                m.put_group(m.published, 1, non_finite=None)
            m.trainer.intake.pull(m.trainer.buffer, timeout=0.0)  # 4 more wait in the buffer
            held = m.trainer.intake.held()
            assert held == (m.c - 1 + m.bs) * B > (m.c - 1 + m.bs) * B // m.G, held
            assert held <= max_trainer_held(m.c, m.bs, B)
            m.never_stuck()
            m.drive_to_completion()
        finally:
            m.queue.close()
            m.state.close()
            shutil.rmtree(m.dir, ignore_errors=True)
