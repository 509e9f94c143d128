"""Issue 20 (recovery that never hangs), the fast checks of the default run: bad config files get one
clear error, a non-finite sample costs one sample, a corrupt version is reported so the trainer can
publish again, the stall watchdog alerts, bytes written into the queue from outside are not counted
as lost. The model check of acknowledgement by fate is ``test_recovery_model.py``; the crash-point
sweep is in the fault suite (``make test-faults``)."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.control import RunState
from asyncrl.orchestrator.alerts import AlertLog
from asyncrl.orchestrator.run import Orchestrator
from asyncrl.records import Group, Task, Trajectory, Turn, members, new_id
from asyncrl.staleness import StalenessPolicy
from asyncrl.telemetry.reports import QueueStats
from helpers import TINY_RUN, replay_buffer, wait_for


def test_config_file_not_utf8_or_a_directory_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 9.*save it as UTF-8"):
        load_config(bad)
    with pytest.raises(ConfigError, match="is a directory; give the path of a YAML file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def _traj(group: str, reward: float = 1.0, logprob: float = -0.5) -> Trajectory:
    return Trajectory(
        id=new_id(),
        task=Task(id="t", task_type="arithmetic"),
        turns=[
            Turn(role="env", token_ids=[1]),
            Turn(role="model", token_ids=[2], logprobs=[logprob], version=0),
        ],
        final_reward=reward,
        group_id=group,
    )


def _group() -> Group:
    """A one-sample group, as a worker puts it."""
    t = _traj("")
    return Group.of(t.task, [t])


def test_a_non_finite_sample_is_dropped_alone_and_its_group_still_trains() -> None:
    buf = replay_buffer(8, StalenessPolicy.from_config("async", 2, 8, "drop"))
    for g in ("a", "b"):
        trajs = [
            _traj(g, reward=float("nan"))
            if g == "a" and k == 1
            else _traj(g, logprob=float("-inf") if g == "b" and k == 3 else -0.5)
            for k in range(4)
        ]
        buf.add(Group.of(trajs[0].task, trajs, id=g))
    batch, dropped = buf.take(0, 2)
    assert [d.reason for d in dropped] == ["dropped_non_finite", "dropped_non_finite"]
    assert batch is None  # 6 finite samples < batch of 8: the groups (4 - 1 each) wait
    trajs = [_traj("c") for _ in range(4)]
    buf.add(Group.of(trajs[0].task, trajs, id="c"))
    batch, dropped = buf.take(0, 2)
    assert batch is not None and len(members(batch)) >= 8 and not dropped
    assert {g.id for g in batch} >= {"a", "b"}  # the two groups with a bad member were trained
    assert all(
        t.reward_components.get("group_dropped") == 1.0
        for g in batch
        if g.id in ("a", "b")
        for t in g.members
    )


def test_a_worker_reports_a_corrupt_version_atomically(tmp_path: Path) -> None:
    state = RunState.open(load_config(None, []), tmp_path)
    assert state.corrupt_version() is None
    for v in (5, 7, 6):  # out of order, as two workers may report
        state.report_corrupt(v)
    assert state.corrupt_version() == 7  # the highest corrupt version: the trainer publishes v8+
    assert state.store.get("weights_corrupt") == 8  # stored + 1, so that 0 means none
    state.close()


def test_the_watchdog_alerts_when_nothing_moves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(None, ["orchestrator.watchdog_s=0.2"])
    state = RunState.open(cfg, tmp_path)
    queue = QueueStats(put_total=5.0, depth=3.0, ready=0.0, capacity=8.0)
    orch: Any = SimpleNamespace(
        cfg=cfg,
        state=state,
        run_dir=tmp_path,
        rules=SimpleNamespace(alerts=AlertLog(tmp_path / "alerts.jsonl", cfg.telemetry.recent_alerts)),
        live=SimpleNamespace(queue=queue),
        _progress=None,
        _progress_at=time.time(),
        _stall_alerted=time.time(),
    )
    Orchestrator._watchdog(orch)  # first sight: progress recorded
    time.sleep(0.25)
    Orchestrator._watchdog(orch)
    alerts = [json.loads(line) for line in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["kind"] for a in alerts] == ["stall"] and alerts[0]["evidence"]["queue_depth"] == 3
    assert "has not moved for" in capsys.readouterr().err
    state.announce_version(1)  # a version moved: no alert
    time.sleep(0.25)
    Orchestrator._watchdog(orch)
    assert len((tmp_path / "alerts.jsonl").read_text().splitlines()) == 1
    state.close()


def test_queue_depth_reaches_the_orchestrator_through_its_own_handle(tmp_path: Path) -> None:
    """One route: the watermarks, the display and the watchdog read the queue the orchestrator read
    this tick, whatever the trainer's last report said about it."""
    from asyncrl.telemetry.reports import TrainerReport
    from asyncrl.transport import make_queue

    small = [
        "trainer.batch_size=1",
        "trainer.checkpoint_every=1",
        "trainer.buffer_steps=1",
        "rollout.group_size=1",
    ]
    cfg = load_config(None, ["transport.capacity=4", *small])
    orch = Orchestrator(cfg, tmp_path, display=False)
    orch.live.trainer = TrainerReport(queue=QueueStats(ready=0.0, capacity=4.0))  # a stale report: empty
    queue = make_queue(cfg.transport, tmp_path)
    for _ in range(4):
        assert queue.put(_group(), timeout=1)
    orch._read_queue()
    orch._watermarks()
    assert orch.live.queue.ready == 4 and orch.live.queue.put_total == 4 and orch.state.paused()
    got = queue.get_batch(4, timeout=1)
    queue.ack([d.entry_id for d in got])
    orch._read_queue()
    orch._watermarks()
    assert orch.live.queue.ready == 0 and not orch.state.paused()
    queue.close()
    orch._queue.close()
    orch._merged.close()
    orch.state.close()


@pytest.mark.redis
def test_bytes_added_to_the_redis_stream_from_outside_are_not_counted_as_lost(tmp_path: Path) -> None:
    import redis

    from asyncrl.transport.redis_backend import RedisQueue

    try:
        redis.Redis().ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    q = RedisQueue("redis://127.0.0.1:6379/0", tmp_path, capacity=8, lease_seconds=5, socket_timeout_s=30.0)
    try:
        assert q.put(_group(), timeout=1)
        q._client().xadd(q.stream_key, {"id": "outsider", "data": b"\x00garbage"})
        got = q.get_batch(8, timeout=1)
        q.ack([d.entry_id for d in got])
        s = q.stats()
        assert s.dead_letters == 1 and s.dead_letters_foreign == 1
        assert s.samples_in == s.samples_acked == 1 and s.samples_dead == 0  # the outsider holds no sample
    finally:
        c = q._client()
        for key in c.scan_iter(f"{q.prefix}*"):
            c.delete(key)
        q.close()


# ---- a sample of the crash-point sweep (the whole sweep: test_faults.py, `make test-faults`) ---------
_wait = functools.partial(wait_for, every=0.05)

TINY = [
    *TINY_RUN,
    "env.heldout_size=8",
    "trainer.batch_size=16",
    "trainer.total_steps=6",
    "telemetry.eval_every=0",
    "control.max_staleness=2",
]


@pytest.mark.slow
@pytest.mark.timeout(900)  # about a minute on an idle 2-core machine; far longer while others share it
def test_sweep_sample_trainer_killed_before_a_checkpoint_then_three_corrupt_versions(tmp_path: Path) -> None:
    """The two hangs of issue 20 on the embedded backends, in one short run: kill -9 the trainer one step
    before a checkpoint (its leased and trained entries are redelivered and partly stale), then corrupt
    max_staleness + 1 = 3 versions in a row as they appear. The run must finish with nothing lost,
    nothing trained twice and versions strictly increasing."""
    import os
    import signal
    import threading

    from asyncrl.jobs.train import train

    cfg = load_config(None, [*TINY, f"run_root={tmp_path / 'runs'}", f"cache_dir={tmp_path / 'cache'}"])
    out: dict[str, Any] = {}
    th = threading.Thread(
        target=lambda: out.update(s=train(cfg, display=False, eval_limit=4)[1]), daemon=True
    )
    th.start()
    _wait(lambda: any((tmp_path / "runs").glob("*/pids.json")), 300, "the run to start")
    run_dir = next((tmp_path / "runs").glob("*/pids.json")).parent
    state = RunState.open(cfg, run_dir)
    _wait(
        lambda: state.version() >= 3,
        300,
        "version 3 (one step before the checkpoint at 4; the last was at 2)",
    )
    os.kill(json.loads((run_dir / "pids.json").read_text())["trainer"], signal.SIGKILL)
    _wait(lambda: state.tallies().resumes >= 1, 120, "the trainer to resume from its checkpoint")
    first, bad = state.version() + 1, []
    while len(bad) < 3 and th.is_alive():  # corrupt the next three versions, republished ones included
        for d in sorted((run_dir / "weights").glob("v*")):
            v = int(d.name[1:])
            if v >= first and v not in bad and (d / "model.safetensors").exists():
                (d / "model.safetensors").write_bytes(b"corrupt")
                bad.append(v)
        time.sleep(0.001)
    th.join(300)
    assert not th.is_alive(), "the run hung"
    s = out["s"]
    assert s["trainer_steps"] == 6 and s["samples_trained"] == 6 * 16, s
    assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0, s
    versions = [
        json.loads(p.read_text()) for p in (run_dir / "weights").glob("v*/manifest.json")
    ]  # publication order = created_at
    order = [m["version"] for m in sorted(versions, key=lambda m: m["created_at"])]
    assert order == sorted(set(order)), order
    assert len(bad) == 3
    # a worker met the corrupt versions and reported the highest (stored + 1); the trainer re-publishes
    # when that was its newest version — unless it had already published past it (its remaining steps
    # trained on data already queued), when no re-publication is needed
    reported, tallies = state.corrupt_version(), state.tallies()
    assert reported in bad, (bad, tallies)
    assert tallies.versions_republished >= 1 or reported < max(order), (bad, order, tallies)
    state.close()


def test_a_follower_reports_when_no_retained_version_is_valid() -> None:
    """Retention keeps ``weights.keep`` versions: if all of them are corrupt, ``load_latest`` finds nothing;
    the follower must still report the newest (found by the sweep sample: it waited silently)."""
    from asyncrl.rollout.worker import WeightFollower

    calls: list[str] = []
    store: Any = SimpleNamespace(
        latest_version=lambda: 7,
        load_latest=lambda: calls.append("load"),  # returns None: nothing valid
    )
    engine: Any = SimpleNamespace(version=3)
    reported: list[int] = []
    follower = WeightFollower(store, engine, None, "rollout-0", reported.append)
    follower.refresh()
    follower.refresh()  # remembered: not loaded or reported again
    assert reported == [7] and calls == ["load"] and engine.version == 3
    assert follower.newest_valid() == 3
