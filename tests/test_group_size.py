"""Adaptive group size (``rollout.adaptive_group_size``): buckets of rare success get larger groups.

(The worker test also covers the per-bucket temperature of :mod:`asyncrl.orchestrator.temperature`.)

The rule (the orchestrator's curriculum), the directive the workers follow, the ticket that admits and
plays that many episodes, and a rollout worker on a tiny built model whose groups come out that large,
each whole as one queue record.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from asyncrl.config import RunConfig, load_config
from asyncrl.control import RunState
from asyncrl.control.admission import Admission
from asyncrl.control.directives import Directives
from asyncrl.learning_signal import group_size_for, signal_share
from asyncrl.orchestrator.curriculum import Curriculum
from asyncrl.orchestrator.rules import Rules
from asyncrl.records import Group, Task, Trajectory, Turn
from asyncrl.rollout.runners import FlatRunner
from helpers import TINY_MODEL, training_group, wait_for


def _cfg(*extra: str) -> RunConfig:
    return load_config(None, ["rollout.group_size=4", "trainer.batch_size=8", *extra])


def _curriculum(successes: dict[str, tuple[int, int]]) -> Curriculum:
    c = Curriculum(sorted(successes), _cfg().orchestrator.curriculum)
    for bucket, (wins, n) in successes.items():
        for i in range(n):
            c.observe(bucket, i < wins)
    return c


def test_rare_buckets_get_the_smallest_size_that_gives_half_the_groups_a_difference() -> None:
    c = _curriculum(
        {
            "rare:1": (2, 32),  # 6 %: G = 12
            "rarest:2": (1, 64),  # 1.6 %: the bound
            "none:3": (0, 32),  # no success: no size helps
            "band:4": (8, 32),  # 25 %: in the band, the configured size
            "new:5": (1, 15),  # fewer than min_episodes: not measured yet
            "easy:6": (29, 32),  # 91 %: mostly solved, not rare (7 members would give half a difference)
        }
    )
    sizes = c.group_sizes(base=4, most=32, band_low=0.15)
    g = group_size_for(2 / 32, 0.5)
    assert g is not None and sizes == {"rare:1": g, "rarest:2": 32}
    assert signal_share(2 / 32, g) >= 0.5 > signal_share(2 / 32, g - 1)  # the smallest such size
    assert c.group_sizes(base=16, most=32, band_low=0.15) == {"rarest:2": 32}  # never below the base


def test_the_orchestrator_publishes_the_sizes_only_when_switched_on() -> None:
    rare = [training_group("calc:1", [1.0] + [0.0] * 15), training_group("calc:1", [0.0] * 16)]  # 1 of 32
    on = Rules(_cfg("rollout.adaptive_group_size=true", "control.max_staleness=3"), None, buckets=["calc:1"])
    off = Rules(_cfg(), None, buckets=["calc:1"])
    for rules in (on, off):
        rules.feed(list(rare))
    want = group_size_for(1 / 32, 0.5)
    assert on.directives([], []).group_sizes == {"calc:1": want}
    assert on.metrics()["curriculum/group_size/calc:1"] == want
    assert off.directives([], []).group_sizes == {}
    # no larger than the staleness budget's slack (max_staleness x batch_size), or it is never admitted
    tight = Rules(
        _cfg("rollout.adaptive_group_size=true", "control.max_staleness=1"), None, buckets=["calc:1"]
    )
    sync = Rules(_cfg("rollout.adaptive_group_size=true", "control.mode=sync"), None, buckets=["calc:1"])
    for rules in (tight, sync):
        rules.feed(list(rare))
    assert want > 8 and tight.directives([], []).group_sizes == {"calc:1": 8}  # 1 x batch_size 8
    assert sync.directives([], []).group_sizes == {}  # sync: groups stay at group_size


def _episode(group: str, k: int) -> Trajectory:
    turns = [Turn(role="env", token_ids=[1]), Turn(role="model", token_ids=[2], logprobs=[-0.1], version=0)]
    return Trajectory(id=f"{group}-{k}", task=Task(id="t", task_type="unit"), turns=turns, group_id=group)


def test_a_ticket_admits_budgets_and_plays_its_own_size(tmp_path: Path) -> None:
    cfg = _cfg("env.max_turns=2")
    state = RunState.open(cfg, tmp_path)
    admission = Admission(state, "rollout-0", 4, 2)
    ticket = admission.admit(0, size=9)
    assert ticket is not None and ticket.size == 9
    assert state.store.get("admitted") == 9 and admission.load == 18 and admission.episodes == 9
    played: list[int] = []

    async def play(t: object, task: Task, gid: str, prefix: object = None) -> list[Trajectory]:
        played.append(1)
        return [_episode(gid, len(played))]

    group = asyncio.run(FlatRunner(play).run(ticket, Task(id="t", task_type="unit")))
    assert len(played) == 9 and len(group.members) == 9
    ticket.deliver(group)
    assert state.store.get("inflight:rollout-0") == 0 and state.store.get("released") == 0
    assert admission.episodes == 0


def test_a_worker_on_a_tiny_model_plays_the_bucket_size_whole_at_its_temperature(tmp_path: Path) -> None:
    """The directives' ``group_sizes`` and ``temperature_factors`` (:mod:`asyncrl.orchestrator.temperature`)
    reach the episodes a real worker plays."""
    from asyncrl.policy import Policy
    from asyncrl.rollout.worker import RolloutWorker
    from asyncrl.transport import make_queue
    from asyncrl.weights import make_weight_store, publish_policy

    cfg = _cfg(
        *TINY_MODEL,
        "rollout.adaptive_group_size=true",
        "rollout.concurrent_episodes=8",
        "rollout.sampling.max_new_tokens=4",
        "env.max_difficulty=2",
        "orchestrator.drift.heldout_rate=0",
    )
    policy = Policy.build(cfg.model)
    policy.save(tmp_path / "initial_policy")
    publish_policy(make_weight_store(cfg.weights, tmp_path), 0, policy, step=0, canary=cfg.weights.canary)
    state = RunState.open(cfg, tmp_path)
    state.begin(resume=False)
    worker = RolloutWorker(cfg, tmp_path, 0)
    sizes = {b: 11 for b in worker.control.buckets}  # every bucket: 11 episodes, above the cap of 8
    hot = {b: 1.3 for b in worker.control.buckets}
    state.publish_directives(Directives(group_sizes=sizes, temperature_factors=hot, at=time.time()))
    thread = threading.Thread(target=asyncio.run, args=(worker.run(),), daemon=True)
    thread.start()
    queue = make_queue(cfg.transport, tmp_path)
    try:
        wait_for(lambda: queue.stats().put_total >= 2, 300, "two groups in the queue")
    finally:
        state.request_stop()
        thread.join(60)
    groups: list[Group] = [d.group for d in queue.get_batch(10, timeout=1.0, consumer="trainer")]
    assert len(groups) >= 2
    assert all(g.episodes == 11 and len({t.group_id for t in g.members}) == 1 for g in groups)
    base = cfg.rollout.sampling.temperature
    assert {t.sampling.temperature for g in groups for t in g.members} == {1.3 * base}
    # every ticket admitted 11 episodes: delivered whole, or given back whole when the stop cancelled it
    assert state.store.get("admitted") == 11 * int(queue.stats().put_total) + state.store.get("released")


def _train_under_the_budget(state: RunState, group: int, batch: int, steps: int, credit: bool) -> int:
    """Workers admit groups of ``group`` whenever the budget allows (at the newest version); the trainer
    takes whole groups until it holds ``batch`` samples, trains and publishes. Returns the steps trained
    before the queue stayed short of a batch with nothing admissible (a stall)."""
    queue: list[int] = []  # the version each queued group was admitted at
    for step in range(steps):
        while state.admit("rollout-0", group, state.version()):
            state.delivered("rollout-0", group)
            queue.append(state.version())
        taken = 0
        while queue and taken < batch:
            assert step - queue.pop(0) <= state.effective_max_staleness()  # rule 1 still bounds the age
            taken += group
        if taken < batch:
            return step
        if credit:
            state.record_beyond_batch(taken - batch)
        state.announce_version(step + 1)
    return steps


def test_batches_of_whole_large_groups_never_stall_the_staleness_budget(tmp_path: Path) -> None:
    """Measured on SmolLM2 (docs/benchmarks.md, rg-answer with the levers): groups of 23 against
    ``batch_size`` 16 stalled a run at step 6 — each batch took more than the budget credits a version,
    the excess accumulated until no group fitted, the queue stayed empty and nothing trained. The trainer
    returns a batch's episodes beyond ``batch_size`` to the budget (:meth:`RunState.record_beyond_batch`)."""
    cfg = _cfg("trainer.batch_size=16", "control.max_staleness=2")
    assert (
        _train_under_the_budget(RunState.open(cfg, tmp_path / "a"), 23, 16, 48, credit=False) == 4
    )  # stalls at its fifth step
    assert _train_under_the_budget(RunState.open(cfg, tmp_path / "b"), 23, 16, 48, credit=True) == 48
    state = RunState.open(cfg, tmp_path / "c")
    state.record_beyond_batch(0)
    state.record_beyond_batch(-3)  # a short last batch: nothing to return
    assert state.store.get("beyond_batch") == 0
