"""The orchestrator's rules on synthetic metric streams (no processes, no model)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import (
    BreakerConfig,
    CurriculumConfig,
    DriftConfig,
    ElasticConfig,
    ExplorationConfig,
    load_config,
)
from asyncrl.control import Exploration, RunState
from asyncrl.control.buckets import buckets_of_source, sample_in_bucket, weighted_choice
from asyncrl.control.directives import compose
from asyncrl.control.store import SQLiteStateStore, StateStore, make_state_store
from asyncrl.control.worker import WorkerControl
from asyncrl.orchestrator.alerts import Alert, AlertLog
from asyncrl.orchestrator.breaker import Breakers
from asyncrl.orchestrator.curriculum import Curriculum
from asyncrl.orchestrator.drift import Cusum, DriftMonitor, HackingMonitor
from asyncrl.orchestrator.elastic import ElasticController, FlowSample
from asyncrl.orchestrator.explore import ExplorationController
from asyncrl.orchestrator.governor import StalenessGovernor
from asyncrl.orchestrator.rules import Rules
from asyncrl.records import Group, Task
from asyncrl.telemetry.reports import (
    Decoded,
    GroupReport,
    GuardFigures,
    QueueStats,
    RewardFigures,
    RolloutFigures,
    StalenessFigures,
    TrainerFigures,
    TrainerReport,
    WorkerReport,
)


# -- curriculum ---------------------------------------------------------------------------------
def test_curriculum_raises_frontier_and_lowers_hopeless_and_converged() -> None:
    c = Curriculum(
        ["a:1", "a:2", "a:3", "a:4"], CurriculumConfig(window=40, min_episodes=10, floor=0.1, ceiling=1.0)
    )
    rng = random.Random(0)
    for _ in range(40):
        c.observe("a:1", True)  # converged
        c.observe("a:2", rng.random() < 0.3)  # low but non-zero: the frontier
        c.observe("a:3", False)  # hopeless
    w = c.weights()
    assert w["a:1"] == pytest.approx(0.1) and w["a:3"] == pytest.approx(0.1)
    assert w["a:2"] > 0.5
    assert w["a:4"] == 1.0  # unexplored: the ceiling until min_episodes
    # the window forgets: a hopeless bucket that becomes learnable rises again
    for _ in range(20):
        c.observe("a:3", True)
    assert c.weight("a:3") > 0.9


def test_the_curriculum_starts_on_the_buckets_the_initial_evaluation_put_in_the_band() -> None:
    c = Curriculum(
        ["a:0", "a:1", "a:2", "a:3", "a:4"],
        CurriculumConfig(window=40, min_episodes=10, floor=0.1, ceiling=1.0, start_floor=0.02),
    )
    line = c.start({"a:0": (8, 8), "a:1": (2, 8), "a:2": (0, 8), "a:3": (0, 0), "x:9": (1, 2)}, (0.15, 0.5))
    w = c.weights()
    assert w["a:1"] == pytest.approx(0.1 + 0.9 * 4 * 0.25 * 0.75)  # in the band: the rule at its prior
    assert w["a:0"] == w["a:2"] == 0.02  # solved / no success at the start: start_floor
    assert w["a:3"] == w["a:4"] == 1.0  # not played (or no episode): unexplored, the ceiling
    assert "x:9" not in w and c.measured("a:1") == 0.25 and c.measured("a:3") is None
    assert line == (
        "curriculum starts on a:1 (in the band 15%-50%); left out for now: a:2 (success under 15%); "
        "a:0 (success over 50%) — drawn at start_floor until their own episodes say otherwise"
    )
    for _ in range(10):  # a:2's own episodes: it moved into the band, and its window now speaks
        c.observe("a:2", len(c.outcomes["a:2"]) % 2 == 0)
    assert c.weight("a:2") == pytest.approx(1.0) and c.measured("a:2") == 0.5
    again = Curriculum(list(c.outcomes), c.c)
    again.restore(json.loads(json.dumps(c.state())))  # the prior survives a snapshot
    assert again.weights() == c.weights()


def test_a_run_seeds_its_curriculum_from_the_initial_evaluation_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncrl.orchestrator.run import Orchestrator

    cfg = load_config(None, ["env.min_difficulty=2", "env.max_difficulty=3"])
    (tmp_path / "initial_eval.json").write_text(json.dumps({"per_bucket": {"arithmetic:2": [3, 10]}}))
    orch = Orchestrator(cfg, tmp_path, display=False)
    orch.prepare()
    assert orch.rules.curriculum.prior == {"arithmetic:2": 0.3}
    out = capsys.readouterr().out
    assert "asyncrl: curriculum starts on arithmetic:2 (in the band 15%-50%)\n" in out  # nothing left out
    off = load_config(None, ["env.min_difficulty=2", "orchestrator.curriculum.start_from_eval=false"])
    other = tmp_path / "off"
    other.mkdir()
    (other / "initial_eval.json").write_text((tmp_path / "initial_eval.json").read_text())
    orch = Orchestrator(off, other, display=False)
    orch.prepare()
    assert orch.rules.curriculum.prior == {}


def test_weighted_choice_follows_weights_and_skips_zero() -> None:
    rng = random.Random(1)
    picks = [weighted_choice({"x:1": 3.0, "y:1": 1.0, "z:1": 0.0}, rng) for _ in range(4000)]
    assert picks.count("z:1") == 0
    assert 0.7 < picks.count("x:1") / len(picks) < 0.8
    assert weighted_choice({"x:1": 0.0}, rng) is None


def test_sample_in_bucket_matches_type_and_difficulty() -> None:
    from asyncrl.config import EnvConfig
    from asyncrl.envs import make_task_source

    src = make_task_source(EnvConfig(kind="python", min_difficulty=1, max_difficulty=3))
    buckets = buckets_of_source(src)
    assert len(buckets) == len(src.task_types)  # each template has one tier
    rng = random.Random(0)
    for bucket in buckets:
        task = sample_in_bucket(src, rng, bucket)
        assert f"{task.task_type}:{task.difficulty}" == bucket


# -- breakers -----------------------------------------------------------------------------------
def test_breaker_opens_after_n_same_kind_and_probes_with_backoff() -> None:
    b = Breakers(BreakerConfig(consecutive=3, backoff_s=10, backoff_factor=2, max_backoff_s=25, probes=2))
    assert b.observe("k:1", "exception", 0) == [] and b.observe("k:1", "timeout", 1) == []
    assert b.observe("k:1", "timeout", 2) == []  # mixed kinds do not add up
    alerts = b.observe("k:1", "timeout", 3)
    assert [a.kind for a in alerts] == ["breaker_open"] and b.state("k:1") == "open"
    assert b.observe("k:1", None, 4) == [] and b.state("k:1") == "open"  # stragglers ignored
    assert b.tick(12) == [] and [a.kind for a in b.tick(13)] == ["breaker_half_open"]
    # a failed probe re-opens with a doubled wait
    assert [a.kind for a in b.observe("k:1", "timeout", 14)] == ["breaker_open"]
    assert b.tick(14 + 19) == [] and b.tick(14 + 20)[0].kind == "breaker_half_open"
    # failed again: wait capped at max_backoff_s
    b.observe("k:1", "malformed", 40)
    assert b.tick(40 + 24) == [] and b.state("k:1") == "open" and b.tick(40 + 25)
    assert b.observe("k:1", None, 70) == []
    assert [a.kind for a in b.observe("k:1", None, 71)] == ["breaker_closed"] and b.state("k:1") == "closed"
    # healthy episodes in between reset the count; the wait is back to backoff_s
    for t, a in enumerate(["exception", "exception", None, "exception", "exception"]):
        assert b.observe("k:1", a, 80 + t) == []
    b.observe("k:1", "exception", 90)
    assert b.state("k:1") == "open" and b.b["k:1"].wait == 10


# -- drift --------------------------------------------------------------------------------------
def _stream(seed: int, n: int, jump_at: int | None = None, jump: float = 0.0) -> list[float]:
    """Group means of 8 Bernoulli(0.4) rewards (what a bucket produces), optionally shifted."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = 0.4 + (jump if jump_at is not None and i >= jump_at else 0.0)
        out.append(sum(rng.random() < p for _ in range(8)) / 8)
    return out


_DRIFT = {k: getattr(DriftConfig(), k) for k in ("warmup", "k", "h", "min_std")}


def false_positive_rate(seeds: int = 200, n: int = 300) -> float:
    fired = 0
    for s in range(seeds):
        c = Cusum(**_DRIFT)
        fired += any(c.update(x) is not None for x in _stream(s, n))
    return fired / seeds


def detection_delays(seeds: int = 100, n: int = 300, at: int = 100, jump: float = 0.3) -> list[int]:
    delays = []
    for s in range(seeds):
        c = Cusum(**_DRIFT)
        for i, x in enumerate(_stream(s, n, at, jump)):
            if c.update(x) is not None:
                delays.append(i - at)
                break
    return delays


def test_drift_quiet_on_stationary_streams() -> None:
    assert false_positive_rate(seeds=100) <= 0.05


def test_drift_fires_on_an_injected_jump_and_downweights() -> None:
    delays = detection_delays(seeds=50)
    assert len(delays) == 50 and all(0 <= d <= 40 for d in delays)
    m = DriftMonitor(DriftConfig(downweight=0.5, hold_s=30))
    alerts = [a for t, x in enumerate(_stream(3, 200, 100, 0.3)) for a in m.observe("b:1", x, float(t))]
    assert alerts and alerts[0].kind == "reward_drift" and alerts[0].evidence["direction"] == "up"
    fired_at = float(alerts[0].evidence["points"] - 1)
    assert m.factors(fired_at + 1) == {"b:1": 0.5} and m.factors(fired_at + 31) == {}


def test_reward_hacking_flagged_only_when_heldout_does_not_follow() -> None:
    h = HackingMonitor(DriftConfig(hacking_window=6, hacking_rise=0.1))
    honest = [a for i in range(6) for a in h.observe(0.2 + 0.05 * i, 0.3 + 0.05 * i)]
    assert honest == []
    hacked = [a for i in range(6) for a in h.observe(0.2 + 0.05 * i, 0.3 - 0.01 * i)]
    assert [a.kind for a in hacked] == ["reward_hacking"]


# -- staleness runaway, exploration, elastic -------------------------------------------------------
def test_staleness_runaway_tightens_then_relaxes() -> None:
    gc = load_config(
        None, ["orchestrator.governor.window=3", "orchestrator.governor.fill_window=100"]
    ).orchestrator.governor
    g = StalenessGovernor(max_staleness=2, sync_every=2, gc=gc)
    cur, sync = 2, 2
    for age in (2.5, 2.7, 3.0):
        g.observe_age(age)
    cur, sync, alerts = g.step(cur, sync, 0.5)
    assert (cur, sync) == (1, 1) and alerts[0].kind == "staleness_runaway"
    g.observe_age(0.5)
    cur, sync, alerts = g.step(cur, sync, 0.5)
    assert cur == 2 and alerts[0].kind == "staleness_recovered"


def test_exploration_rises_without_signal_and_falls_back() -> None:
    x = ExplorationController(
        ExplorationConfig(
            adaptive=True, max_temperature_jitter=0.1, max_exploration_rate=0.1, step=0.05, window=4
        ),
        0.0,
        0.0,
    )
    for _ in range(12):
        x.observe([1.0, 1.0, 1.0])
    assert x.settings() == Exploration(temperature_jitter=0.1, exploration_rate=0.1)
    for _ in range(4):
        x.observe([0.0, 1.0, 1.0])
    assert x.jitter == pytest.approx(0.05)


def test_elastic_adds_when_trainer_starves_and_removes_when_queue_overflows() -> None:
    e = ElasticController(ElasticConfig(min_workers=1, max_workers=3, cooldown_s=10, window=3))
    starving = FlowSample(production=5, consumption=5, fill=0.0, busy=0.2, staleness=0.5, staleness_limit=2)
    assert [e.observe(starving, 1, t)[0] for t in range(3)] == [0, 0, 1]
    assert e.observe(starving, 2, 4)[0] == 0  # cooldown
    overflow = FlowSample(production=20, consumption=5, fill=0.9, busy=1.0, staleness=1.0, staleness_limit=2)
    decisions = [e.observe(overflow, 2, 20 + t) for t in range(3)]
    assert [d for d, _ in decisions] == [0, 0, -1]
    alert = decisions[-1][1][0]
    assert alert.kind == "scale_down" and "overflowing" in alert.evidence["reason"]
    assert [e.observe(overflow, 1, 40 + t)[0] for t in range(3)] == [0, 0, 0]  # at min_workers


# -- directives, load balancing ------------------------------------------------------------------
def test_compose_zeroes_open_and_floors_half_open() -> None:
    d = compose({"a:1": 1.0, "a:2": 0.6, "a:3": 0.8}, {"a:2": 0.5}, ["a:1"], ["a:3"], 0.1, None, 0.0, [], [])
    assert d.weights == {"a:1": 0.0, "a:2": 0.3, "a:3": 0.1}


def test_worker_control_skips_open_buckets_and_balances_by_steps(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        ["env.kind=calculator", "env.min_difficulty=2", "env.max_difficulty=3", "control.refresh_s=1e-6"],
    )
    st = RunState.open(cfg, tmp_path)
    from asyncrl.envs import make_task_source

    wc = WorkerControl(cfg, st, "rollout-0", make_task_source(cfg.env), curriculum=True)
    st.publish_directives(
        compose(
            {"arithmetic:2": 1.0, "arithmetic:3": 1.0},
            {},
            ["arithmetic:3"],
            [],
            0.1,
            None,
            0.0,
            ["rollout-0", "rollout-1"],
            [],
        ),
    )
    rng = random.Random(0)
    assert {wc.next_task(rng)[0].difficulty for _ in range(50)} == {2}
    group_steps = cfg.rollout.group_size * cfg.env.max_turns
    other = WorkerControl(cfg, st, "rollout-1", make_task_source(cfg.env), curriculum=True)
    other.publish_load(group_steps, force=True)  # rollout-1 runs one group
    assert wc.may_take(0) and wc.may_take(group_steps) and wc.may_take(2 * group_steps - 1)
    wc._loads_at = 0.0
    assert not wc.may_take(2 * group_steps)  # two groups ahead of the least-loaded worker: wait
    st.publish_directives(dataclasses.replace(st.directives(), retire=["rollout-0"]))
    assert wc.retiring()


# -- state store, alerts, snapshot ------------------------------------------------------------------
def test_state_store_documents_and_factory(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    st = make_state_store(cfg, tmp_path)
    assert isinstance(st, StateStore) and st.get_doc("x") is None
    st.put_doc("x", {"a": [1, 2], "b": {"c": 0.5}})
    assert SQLiteStateStore(tmp_path / "control.sqlite").get_doc("x") == {"a": [1, 2], "b": {"c": 0.5}}


def test_alert_log_writes_jsonl(tmp_path: Path) -> None:
    log = AlertLog(tmp_path / "alerts.jsonl", keep=8)
    log.emit(Alert("breaker_open", "a:1", {"anomaly": "timeout"}, "bucket not sampled"))
    row = json.loads((tmp_path / "alerts.jsonl").read_text())
    assert {"time", "kind", "bucket", "evidence", "action"} <= set(row) and row["kind"] == "breaker_open"
    assert log.metrics()["alerts/breaker_open"] == 1.0


def _group(
    bucket: str, rewards: list[float], anomalies: list[str | None], heldout: bool = False
) -> GroupReport:
    outcomes = ["success" if r > 0 else "failure" for r in rewards]
    return GroupReport(
        bucket=bucket, started=0.0, heldout=heldout, rewards=rewards, outcomes=outcomes, anomalies=anomalies
    )


def test_rules_snapshot_roundtrip_restores_the_same_state() -> None:
    cfg = load_config(None, ["orchestrator.breaker.consecutive=2", "orchestrator.drift.warmup=3"])
    rules = Rules(cfg, None, buckets=["arithmetic:2", "arithmetic:3"])
    reports: list[Decoded] = [_group("arithmetic:2", [1.0, 0.0, 1.0, 0.0], [None] * 4) for _ in range(5)]
    reports += [_group("arithmetic:3", [0.0] * 4, ["timeout"] * 4)]
    reports += [TrainerReport(role="trainer", reward=RewardFigures(mean=0.4))]
    reports += [_group("arithmetic:2", [1.0, 1.0, 0.0, 0.0], [None] * 4, heldout=True)]
    alerts = rules.feed(reports, now=100.0)
    assert [a.kind for a in alerts] == ["breaker_open"] and rules.breakers.state("arithmetic:3") == "open"
    saved = json.loads(json.dumps(rules.snapshot()))
    fresh = Rules(cfg, None, buckets=["arithmetic:2", "arithmetic:3"])
    fresh.restore(saved)
    assert json.loads(json.dumps(fresh.snapshot())) == saved
    assert fresh.directives([], [], now=101.0).weights["arithmetic:3"] == 0.0


# -- the orchestrator applies scaling decisions ---------------------------------------------------
class FakeLauncher:
    def __init__(self) -> None:
        self.procs: dict[str, int | None] = {}

    def start(self, name: str, target: object, *args: object) -> None:
        self.procs[name] = None

    def exitcode(self, name: str) -> int | None:
        return self.procs[name]

    def pid(self, name: str) -> int | None:
        return None

    def stop(self, name: str, timeout: float = 10.0) -> None:
        self.procs[name] = 0

    def names(self) -> list[str]:
        return list(self.procs)


def _feed_flow(
    orch: Any, ready: float, busy: float, episodes_per_tick: float, trained_per_tick: float
) -> None:
    import time

    for i in range(1, 5):
        orch.live.queue = QueueStats(ready=ready)
        orch.live.trainer = TrainerReport(
            trainer=TrainerFigures(
                busy_seconds=busy * i, idle_seconds=(1 - busy) * i, samples_trained=trained_per_tick * i
            ),
            staleness=StalenessFigures(mean=0.5),
        )
        orch.live.workers = {
            "rollout-0": WorkerReport(rollout=RolloutFigures(episodes=episodes_per_tick * i))
        }
        time.sleep(0.02)
        orch._scale()


def test_orchestrator_starts_a_worker_when_starving_and_retires_one_on_overflow(tmp_path: Path) -> None:
    from asyncrl.orchestrator.run import Orchestrator

    cfg = load_config(
        None,
        [
            "orchestrator.elastic.enabled=true",
            "orchestrator.elastic.window=2",
            "orchestrator.elastic.cooldown_s=0",
            "orchestrator.elastic.max_workers=2",
            "telemetry.log_every_s=0.01",
        ],
    )
    orch = Orchestrator(cfg, tmp_path, display=False)
    fake = FakeLauncher()
    orch.launcher = fake  # type: ignore[assignment]
    orch._start = lambda name, resume_trainer=True: fake.start(name, None)  # type: ignore[method-assign]
    for name in orch.workers:
        orch._start(name)
    _feed_flow(orch, ready=0, busy=0.2, episodes_per_tick=8, trained_per_tick=8)  # trainer starving
    assert orch.workers == ["rollout-0", "rollout-1"] and "rollout-1" in fake.names()
    cap = cfg.transport.capacity
    _feed_flow(orch, ready=0.9 * cap, busy=1.0, episodes_per_tick=40, trained_per_tick=8)  # queue overflowing
    assert orch.workers == ["rollout-0"] and orch.retiring == ["rollout-1"]
    orch._apply_rules([])
    assert orch.state.directives().retire == ["rollout-1"]
    kinds = [json.loads(x)["kind"] for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert kinds == ["scale_up", "scale_down"]
    fake.procs["rollout-1"] = 0  # the retired worker delivered its groups and exited
    orch._supervise()
    assert orch.retiring == [] and "rollout-1" not in orch.restarts and fake.procs["rollout-1"] == 0
    orch._merged.close()


# -- early termination (waste) and bucket-confined faults --------------------------------------------
def test_early_termination_after_k_consecutive_invalid_actions() -> None:
    import asyncio

    from asyncrl.config import EnvConfig
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.envs import make_env
    from asyncrl.records import SamplingParams
    from asyncrl.rollout.episode import EpisodeSettings, run_episode
    from helpers import calc_task
    from test_episode import TEMPLATE, ScriptedEngine

    def play(texts: list[str], k: int) -> Any:
        async def go() -> Any:
            batcher = TurnBatcher(ScriptedEngine(texts), max_batch=64, max_wait_s=0.02)
            turns: list[int] = []
            s = EpisodeSettings(
                6,
                512,
                SamplingParams(max_new_tokens=40),
                early_stop_invalid=k,
                on_turn=lambda: turns.append(1),
            )
            try:
                (traj,) = await run_episode(calc_task(), make_env(EnvConfig(), 0), batcher, TEMPLATE, s)
                return traj, len(turns)
            finally:
                batcher.close()

        return asyncio.run(go())

    traj, calls = play(["nonsense"] * 6, k=3)
    assert traj.outcome == "early_stopped" and sum(t.role == "model" for t in traj.turns) == 3 and calls == 3
    traj, _ = play(
        ["nonsense", "nonsense", "<tool>calc(3*4)</tool>", "nonsense", "nonsense"] + ["x"] * 3, k=3
    )
    assert (
        traj.outcome == "early_stopped" and sum(t.role == "model" for t in traj.turns) == 6 - 0
    )  # a valid action resets the count
    traj, _ = play(["nonsense"] * 6, k=0)
    assert traj.outcome == "truncated"


def test_fault_wrapper_confined_to_bucket_and_switch(tmp_path: Path) -> None:
    import asyncio

    from asyncrl.config import EnvConfig, FaultConfig
    from asyncrl.envs import FaultWrapper, make_raw_env

    switch = tmp_path / "on"

    async def faulty(difficulty: int) -> bool:
        w = FaultWrapper(
            make_raw_env(EnvConfig()),
            FaultConfig(exception_rate=1.0, task_types=["arithmetic:3"], switch_file=str(switch)),
            random.Random(0),
        )
        await w.reset(
            Task(
                id="t",
                task_type="arithmetic",
                difficulty=difficulty,
                payload={"prompt": "p", "start": 1, "steps": [], "answer": "1"},
            )
        )
        return w.active()

    assert not asyncio.run(faulty(3))  # switch off
    switch.touch()
    assert asyncio.run(faulty(3)) and not asyncio.run(faulty(2))


# -- the curriculum steers the replay buffer; alerts reach the live display ---------------------------
def test_buffer_follows_curriculum_bucket_weights() -> None:
    from asyncrl.records import Trajectory, Turn
    from asyncrl.staleness import StalenessPolicy
    from helpers import replay_buffer

    def one(i: int, difficulty: int) -> Trajectory:
        turns = [
            Turn(role="env", token_ids=[1]),
            Turn(role="model", token_ids=[2], logprobs=[-0.1], version=0),
        ]
        task = Task(id=f"t{i}", task_type="arithmetic", difficulty=difficulty)
        return Trajectory(id=f"x{i}-{difficulty}", task=task, turns=turns, group_id=f"g{i}-{difficulty}")

    b = replay_buffer(
        batch_size=4,
        staleness=StalenessPolicy.from_config("async", 9, 4, "drop"),
        task_mix={"arithmetic:2": 0.75, "arithmetic:3": 0.25},  # the control document's weights
    )
    for i in range(8):
        t = one(i, 2 if i % 2 else 3)  # equal supply of both buckets
        b.add(Group.of(t.task, [t]))
    batch, _ = b.take(version=0)
    assert batch is not None and sorted(g.task.difficulty for g in batch) == [2, 2, 2, 3]


def test_live_display_shows_alerts_breakers_and_curriculum(tmp_path: Path) -> None:
    from rich.console import Console

    from asyncrl.orchestrator.run import Orchestrator, _render

    orch = Orchestrator(load_config(None, []), tmp_path, display=False)
    orch.rules.feed([_group("arithmetic:3", [0.0] * 8, ["timeout"] * 8)], now=1.0)
    console = Console(record=True, width=160)
    console.print(_render(orch))
    text = console.export_text()
    assert "breaker_open arithmetic:3" in text and "breakers open" in text and "curriculum" in text
    orch._merged.close()


def _guard_row(pid: int, calls: float, failed: float, **more: float) -> WorkerReport:
    guard = GuardFigures(calls=calls, exceptions=failed, faults=failed, **more)
    return WorkerReport(role="rollout-0", pid=pid, guard=guard)


def test_env_fault_rate_alert_fires_once_per_excursion_and_counts_restarted_workers() -> None:
    from asyncrl.orchestrator.breaker import FaultRateMonitor

    cfg = load_config(
        None, ["orchestrator.breaker.fault_rate_alert=0.2", "orchestrator.breaker.fault_rate_window=50"]
    )
    rules = Rules(cfg, None, buckets=["arithmetic:2"])
    assert rules.feed([_guard_row(1, 40, 20)], now=1.0) == []  # under one window of attempts: no verdict
    alerts = rules.feed([_guard_row(1, 100, 30)], now=2.0)  # 30% of 100 attempts failed
    assert [a.kind for a in alerts] == ["env_faults"] and alerts[0].evidence["fault_rate"] == pytest.approx(
        0.3
    )
    assert rules.feed([_guard_row(1, 200, 60)], now=3.0) == []  # still above: no second alert
    # the worker restarts (new pid, counts from zero): the old process's counts still count
    assert rules.env_totals().calls == 200
    assert rules.feed([_guard_row(2, 100, 0)], now=4.0) == []  # healthy window: the excursion ends
    assert [a.kind for a in rules.feed([_guard_row(2, 200, 40)], now=5.0)] == ["env_faults"]
    assert rules.alerts.counts["env_faults"] == 2
    off = FaultRateMonitor(0.0, 10)
    assert off.observe(GuardFigures(calls=100, exceptions=100), 1.0) == []  # 0 disables


def test_fault_summary_says_when_hangs_stretched_the_run(tmp_path: Path) -> None:
    from rich.console import Console

    from asyncrl.orchestrator.breaker import fault_summary
    from asyncrl.orchestrator.run import Orchestrator, _render

    totals = GuardFigures(calls=100.0, faults=10.0, retries=10.0, timeouts=12.0, fault_seconds=120.0)
    s = fault_summary(totals, env_seconds=150.0, step_timeout_s=10.0)
    assert s["timeouts"] == 12 and s["retries"] == 10 and s["fault_rate"] == pytest.approx(12 / 110)
    assert "hangs stretched the run's wall time" in s["note"] and "80%" in s["note"]
    assert fault_summary(GuardFigures(calls=100.0), env_seconds=10.0, step_timeout_s=10.0)["note"] == ""
    orch = Orchestrator(load_config(None, []), tmp_path, display=False)
    orch.rules.feed([_guard_row(1, 100, 30, retries=5, timeouts=4)], now=1.0)
    console = Console(record=True, width=160)
    console.print(_render(orch))
    text = console.export_text()
    assert "env faults (calculator)" in text and "30 faults, 5 retries, 4 timeouts" in text, text
    orch._merged.close()


def test_the_stall_watchdog_fires_under_no_display_despite_the_progress_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--no-display`` prints a progress line every ``progress_every_s``; printing it is not progress, so a
    run whose version and accepted count stand still for ``watchdog_s`` still gets its ``stall`` alert."""
    from asyncrl.orchestrator.run import Orchestrator

    cfg = load_config(None, ["orchestrator.watchdog_s=30", "telemetry.progress_every_s=1"])
    orch = Orchestrator(cfg, tmp_path, display=False)
    orch._watchdog()  # the first tick records where the run stands
    assert orch.rules.alerts.counts.get("stall", 0) == 0
    orch._progress_at -= 60  # nothing moved for a minute (and no stall alerted) ...
    orch._stall_alerted -= 60
    orch._printed_at -= 60
    orch._plain_progress()  # ... while the progress line was printed
    orch._watchdog()
    assert orch.rules.alerts.counts.get("stall", 0) == 1
    assert "has not moved for 60 s" in capsys.readouterr().err
    orch._merged.close()
