"""Fault-injection suite (marker ``faults``; run with ``make test-faults``, not in the default run).

Every test runs a small training job on the Redis backends — trajectory queue on Redis Streams and
the shared weight store with its pointer in Redis — against a private redis-server (AOF on,
``appendfsync always``), injects one fault mid-run, and checks the promises:

* the run completes (every trainer step done);
* **lost = 0**: accepted = trained + dropped + left in the queue + dead-lettered;
* **nothing trained twice**: no second fate was ever recorded for a trajectory id, and the number
  of ``trained`` ledger rows equals ``trainer_steps x batch_size``;
* the published version sequence is strictly increasing in publication order;
* time to recover: from the fault until the pipeline moved again end to end (the queue accepted
  a new trajectory *and* a new weight version was published).

The orchestrator-kill row runs the job as an ``asyncrl train`` process with the orchestrator's state in
Redis too (``control.state.kind=redis``), kills that process alone and resumes with ``--resume``.

With ``ASYNCRL_FAULTS_REPORT=path.jsonl`` each test appends its row; ``bench/faults_table.py``
turns the rows into the table in ``docs/reliability.md``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import helpers
from asyncrl.config import RunConfig, load_config
from asyncrl.control import RunState
from asyncrl.jobs.train import train
from helpers import TINY_RUN
from redis_server import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

STEPS, BATCH = 16, 16
wait_for = functools.partial(helpers.wait_for, every=0.1)

TINY = [
    *TINY_RUN,
    "env.heldout_size=8",
    f"trainer.batch_size={BATCH}",
    f"trainer.total_steps={STEPS}",
    "transport.kind=redis",
    "transport.capacity=256",
    "transport.lease_seconds=5",
    "weights.kind=shared",
    "weights.keep=1000",
]


class Job:
    """A training job in a background thread, with probes for the fault tests."""

    def __init__(self, tmp: Path, cache: Path, server: RedisServer, *extra: str) -> None:
        self.server = server
        self.cfg: RunConfig = load_config(
            None,
            [
                *TINY,
                f"run_root={tmp / 'runs'}",
                f"cache_dir={cache}",
                f"transport.redis_url={server.url}",
                f"weights.redis_url={server.url}",
                f"weights.path={tmp / 'shared-weights'}",
                *extra,
            ],
        )
        self.out: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.run_dir = self._wait_run_dir(tmp / "runs")
        self.state = RunState.open(self.cfg, self.run_dir)

    def _run(self) -> None:
        try:
            self.out["run_dir"], self.out["summary"] = train(self.cfg, display=False, eval_limit=4)
        except BaseException as exc:
            self.out["error"] = exc

    def _wait_run_dir(self, root: Path) -> Path:
        wait_for(lambda: any(root.glob("*/pids.json")) or "error" in self.out, 600, "the run to start")
        assert "error" not in self.out, self.out["error"]
        return next(root.glob("*/pids.json")).parent

    def pids(self) -> dict[str, int]:
        return dict(json.loads((self.run_dir / "pids.json").read_text()))

    def put_total(self) -> int | None:
        """Queue-wide accepted count, read straight from Redis (None while Redis is unreachable)."""
        from asyncrl.transport.redis_backend import key_prefix

        try:
            c = self.server.client(socket_timeout=1, socket_connect_timeout=1)
            value = c.hget(f"{key_prefix(self.run_dir)}:counters", "put_total")
            c.close()
            return int(value or 0)
        except Exception:
            return None

    def recovery_seconds(self, fault_at: float, published_before: int, put_before: int) -> float:
        """Seconds from ``fault_at`` until a new trajectory was accepted and a new version published."""
        seen_put = seen_pub = None
        end = time.time() + 300
        while time.time() < end and (seen_put is None or seen_pub is None):
            now = time.time()
            if seen_put is None and (self.put_total() or 0) > put_before:
                seen_put = now
            if seen_pub is None and self.state.tallies().versions_published > published_before:
                seen_pub = now
            if seen_pub is not None and seen_put is None and self.state.trainer_finished():
                seen_put = now  # the run finished from what was queued
            time.sleep(0.1)
        assert seen_put is not None and seen_pub is not None, "the pipeline did not move again"
        return max(seen_put, seen_pub) - fault_at

    def finish(self) -> dict[str, Any]:
        self.thread.join(600)
        assert not self.thread.is_alive(), "the run did not finish"
        assert "error" not in self.out, self.out.get("error")
        return dict(self.out["summary"])


def published_in_order(weights_root: Path) -> list[int]:
    """Versions ordered by when their snapshot was published (manifest ``created_at``)."""
    manifests = [json.loads(p.read_text()) for p in weights_root.glob("v*/manifest.json")]
    return [m["version"] for m in sorted(manifests, key=lambda m: m["created_at"])]


def check_promises(job: Job, s: dict[str, Any], fault: str, recover_s: float) -> dict[str, Any]:
    steps = job.cfg.trainer.total_steps
    assert s["trainer_steps"] == steps, s
    fates = job.state.fate_counts()
    assert fates.get("trained", 0) == s["samples_trained"], (fates, s)
    if job.cfg.rollout.tree.enabled:
        # a tree's later leaves can be sampled at a newer version than its first ones, so after a
        # restart a group can lose only some members to staleness; a batch takes whole groups, so
        # it may then overshoot batch_size by up to group_size - 1 (config.max_trainer_held)
        overshoot = steps * (job.cfg.rollout.group_size - 1)
        assert steps * BATCH <= s["samples_trained"] <= steps * BATCH + overshoot, s
    else:  # a flat group is sampled at one version: it is dropped whole or kept whole
        assert s["samples_trained"] == steps * BATCH, s
    assert s["duplicates_recorded"] == 0, s  # no second fate for any trajectory id
    assert s["lost_trajectories"] == 0, s
    order = published_in_order(Path(job.cfg.weights.path or "") / job.run_dir.name)
    assert order == sorted(order) and len(set(order)) == len(order), order
    assert order[-1] == s["last_version"], (order, s)
    return helpers.fault_row(
        fault,
        s,
        versions=len(order),
        restarts=", ".join(f"{k}×{v}" for k, v in sorted(s["restarts"].items())) or "none",
        recover_s=round(recover_s, 1),
        rl_seconds=round(s["rl_seconds"], 1),
    )


def inject_after_progress(job: Job, min_version: int = 4) -> tuple[float, int, int]:
    wait_for(lambda: job.state.version() >= min_version, 600, f"version {min_version}")
    return time.time(), job.state.tallies().versions_published, job.put_total() or 0


# ---- the faults --------------------------------------------------------------------------------------
def test_kill9_rollout_worker(tmp_path: Path, cache_dir: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        job = Job(tmp_path, cache_dir, server, "rollout.num_workers=2")
        fault_at, pub, put = inject_after_progress(job)
        victim = job.pids()["rollout-0"]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: job.pids().get("rollout-0") not in (None, victim), 120, "rollout-0 to restart")
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        assert s["restarts"].get("rollout-0", 0) >= 1
        check_promises(job, s, "kill -9 a rollout worker", recover)
    finally:
        server.stop()


def test_kill9_trainer(tmp_path: Path, cache_dir: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        job = Job(tmp_path, cache_dir, server)
        fault_at, pub, put = inject_after_progress(job)
        os.kill(job.pids()["trainer"], signal.SIGKILL)
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        assert s["restarts"].get("trainer", 0) >= 1
        assert job.state.tallies().resumes >= 1  # it restarted from a checkpoint
        check_promises(job, s, "kill -9 the trainer", recover)
    finally:
        server.stop()


def test_redis_server_crash_and_restart_with_aof(tmp_path: Path, cache_dir: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True)
    try:
        job = Job(tmp_path, cache_dir, server)
        fault_at, pub, put = inject_after_progress(job)
        server.restart(down_s=2.0, kill=True)  # SIGKILL: a crash, not a clean shutdown
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        check_promises(job, s, "redis-server killed (-9), restarted 2 s later (AOF)", recover)
    finally:
        server.stop()


def test_redis_connections_dropped_for_three_seconds(tmp_path: Path, cache_dir: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        job = Job(tmp_path, cache_dir, server)
        fault_at, pub, put = inject_after_progress(job)
        admin = server.client()
        killed = 0
        end = time.time() + 3.0
        while time.time() < end:  # every client connection is cut, again and again, for 3 s
            killed += int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            time.sleep(0.1)
        admin.close()
        assert killed > 0
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        check_promises(job, s, "all Redis connections cut repeatedly for 3 s (CLIENT KILL)", recover)
    finally:
        server.stop()


class ProcJob(Job):
    """The job as an ``asyncrl train`` process (so its orchestrator can be killed alone), state in Redis."""

    def __init__(self, tmp: Path, cache: Path, server: RedisServer, *extra: str) -> None:
        from asyncrl.config import apply_overrides
        from asyncrl.control.store.redis_backend import RedisStateStore

        self.server = server
        sets = [
            *TINY,
            f"run_root={tmp / 'runs'}",
            f"cache_dir={cache}",
            f"transport.redis_url={server.url}",
            f"weights.redis_url={server.url}",
            f"weights.path={tmp / 'shared-weights'}",
            "control.state.kind=redis",
            f"control.state.redis_url={server.url}",
            *extra,
        ]
        self.cfg = load_config(None, sets)
        self.cfg_file = tmp / "job.yaml"
        self.cfg_file.write_text(json.dumps(apply_overrides({}, sets)))  # JSON is YAML
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.log = (tmp / "job.log").open("w")
        self.out = {}
        self.procs = [self._train(str(self.cfg_file))]
        self.run_dir = self._wait_run_dir(tmp / "runs")
        self.state = RunState(
            RedisStateStore(server.url, self.run_dir),
            self.cfg.staleness_policy(),
            self.cfg.trainer.sync_every,
        )

    def _train(self, *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "asyncrl.cli", "train", *args, "--no-display", "--eval-limit", "4"]
        return subprocess.Popen(
            cmd, start_new_session=True, stdout=self.log, stderr=subprocess.STDOUT, env=self.env
        )

    def resume(self) -> None:
        self.procs.append(self._train("--resume", str(self.run_dir)))

    def resumed(self) -> bool:
        """The ``--resume`` process has recorded itself as the run's orchestrator (``run.json``); it
        reaps the orphans next. Fails at once if that process has already exited."""
        proc = self.procs[-1]
        assert proc.poll() is None, (self.run_dir.parent.parent / "job.log").read_text()[-3000:]
        record = json.loads((self.run_dir / "run.json").read_text())  # replaced whole: never half
        return bool(record.get("orchestrator", {}).get("pid") == proc.pid)

    def finish(self) -> dict[str, Any]:
        assert self.procs[-1].wait(600) == 0, (self.run_dir.parent.parent / "job.log").read_text()[-3000:]
        return dict(json.loads((self.run_dir / "summary.json").read_text()))

    def cleanup(self) -> None:
        for p in self.procs:  # the first job's process group holds its orphaned roles
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        self.state.close()
        self.log.close()


def test_kill9_orchestrator(tmp_path: Path, cache_dir: Path) -> None:
    """kill -9 the orchestrator alone (its roles run on as orphans), then ``asyncrl train --resume`` at once,
    as a supervisor would; the orchestrator's state lives in Redis too (``control.state.kind=redis``)."""
    server = RedisServer(tmp_path / "redis")
    job: ProcJob | None = None
    try:
        job = ProcJob(tmp_path, cache_dir, server)
        assert not (job.run_dir / "control.sqlite").exists()
        wait_for(lambda: job.state.snapshot() is not None, 600, "an orchestrator snapshot")
        fault_at, _, _ = inject_after_progress(job)
        old_trainer = job.pids()["trainer"]
        # The orphaned trainer is held (SIGSTOP) while the `--resume` process starts: its imports take
        # ~6 s on two cores, longer than the ~12 steps left take the trainer alone (0.3-0.5 s each), so
        # unheld it would finish the run first and the resume would rightly start no role at all. It
        # runs on (SIGCONT) once the resumed orchestrator has recorded itself, just before it reaps.
        os.kill(old_trainer, signal.SIGSTOP)
        try:
            job.procs[0].send_signal(signal.SIGKILL)  # the orchestrator only
            job.procs[0].wait(30)
            job.resume()
            wait_for(job.resumed, 300, "the resumed orchestrator")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old_trainer, signal.SIGCONT)
        # the resumed orchestrator reaps the orphans and starts its own roles
        wait_for(
            lambda: job.resumed() and job.pids().get("trainer") not in (None, old_trainer),
            300,
            "a new trainer",
        )
        recover = job.recovery_seconds(fault_at, job.state.tallies().versions_published, job.put_total() or 0)
        s = job.finish()
        assert job.state.tallies().resumes >= 1  # the trainer restarted from its checkpoint
        assert not (job.run_dir / "control.sqlite").exists()
        check_promises(job, s, "kill -9 the orchestrator, then `train --resume` (state in Redis)", recover)
    finally:
        if job is not None:
            job.cleanup()
        server.stop()


@pytest.mark.ray
def test_kill_ray_actor(tmp_path: Path, cache_dir: Path) -> None:
    pytest.importorskip("ray", reason="needs ray (pip install 'asyncrl[ray]')")
    server = RedisServer(tmp_path / "redis")
    try:
        job = Job(tmp_path, cache_dir, server, "launcher.kind=ray", "launcher.rollout_cpus=0.5")
        fault_at, pub, put = inject_after_progress(job)
        victim = job.pids()["rollout-0"]  # the actor's process
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: job.pids().get("rollout-0") not in (None, victim), 180, "a new rollout actor")
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        assert s["restarts"].get("rollout-0", 0) >= 1
        check_promises(job, s, "kill -9 a Ray actor (rollout worker)", recover)
    finally:
        server.stop()


# ---- the crash-point sweep (issue 20) -----------------------------------------------------------------
# kill -9 each role at points spread over the checkpoint interval, then let the run (or `train --resume`)
# finish. With checkpoint_every = CKPT the points are trainer versions just after a checkpoint, in the
# middle, just before the next one, and mid-publish (while a snapshot's temp directory exists).
CKPT = 4
SWEEP = [f"trainer.checkpoint_every={CKPT}", "telemetry.eval_every=2", "trainer.total_steps=11"]
POINTS = {"after_checkpoint": CKPT + 1, "mid_interval": CKPT + 2, "before_checkpoint": 2 * CKPT - 1}


def wait_point(job: Job, point: str) -> tuple[float, int, int]:
    """Block until the run reaches ``point``; returns (fault time, versions published, accepted)."""
    if point == "mid_checkpoint":  # a checkpoint being written: its temp directory exists
        wait_for(lambda: job.state.version() >= CKPT + 1, 600, f"version {CKPT + 1}")
        end = time.time() + 120
        while not any((job.run_dir / "checkpoints").glob(".tmp-step_*")):
            assert time.time() < end and not job.state.trainer_finished(), (
                "no checkpoint in progress was seen"
            )
            time.sleep(0.001)
    elif point == "mid_publish":
        root = Path(job.cfg.weights.path or "") / job.run_dir.name
        wait_for(lambda: job.state.version() >= CKPT + 1, 600, f"version {CKPT + 1}")
        end = time.time() + 120
        while not any(root.glob(".tmp-v*")):  # a snapshot being written: its temp directory exists
            assert time.time() < end and not job.state.trainer_finished(), "no publish in progress was seen"
            time.sleep(0.001)
    else:
        wait_for(lambda: job.state.version() >= POINTS[point], 600, point)
    return time.time(), job.state.tallies().versions_published, job.put_total() or 0


def sweep_row(job: Job, s: dict[str, Any], fault: str, recover_s: float, wall_s: float) -> None:
    row = check_promises(job, s, fault, recover_s)
    assert wall_s < 600, f"{fault}: took {wall_s:.0f} s"  # bounded: no hang
    print(
        f"SWEEP {fault}: finished, lost {row['lost']}, twice {row['trained_twice']}, recover {recover_s:.1f} s"
    )


def kill_role_at(
    tmp_path: Path, cache_dir: Path, role: str, point: str, *extra: str, label: str = ""
) -> None:
    """kill -9 ``role`` at ``point`` of a sweep run, let it restart and the run finish; check the promises."""
    server = RedisServer(tmp_path / "redis")
    try:
        t0 = time.time()
        job = Job(tmp_path, cache_dir, server, *SWEEP, *extra)
        fault_at, pub, put = wait_point(job, point)
        victim = job.pids()[role]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: job.pids().get(role) not in (None, victim) or job.state.trainer_finished(),
            300,
            "restart",
        )
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        sweep_row(job, s, f"kill -9 {role} at {point}{label}", recover, time.time() - t0)
    finally:
        server.stop()


GROUP = ["trainer.world_size=2", "trainer.dist_timeout_s=15"]


@pytest.mark.parametrize(
    ("point", "parallel"),
    [
        ("mid_interval", "ddp"),
        ("mid_checkpoint", "ddp"),
        ("mid_publish", "ddp"),
        ("mid_checkpoint", "fsdp"),  # sharded: the gather of the full state and the moments' shards
    ],
)
def test_crash_point_sweep_trainer_rank(tmp_path: Path, cache_dir: Path, point: str, parallel: str) -> None:
    """kill -9 rank 1 of a two-rank trainer mid-step, mid-checkpoint, mid-publish: rank 0's next
    collective fails, the group ends and restarts whole from the newest checkpoint."""
    server = RedisServer(tmp_path / "redis")
    try:
        t0 = time.time()
        job = Job(tmp_path, cache_dir, server, *SWEEP, *GROUP, f"trainer.parallel={parallel}")
        fault_at, pub, put = wait_point(job, point)
        victim, leader = job.pids()["trainer.1"], job.pids()["trainer"]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: job.pids().get("trainer") not in (None, leader) or job.state.trainer_finished(),
            300,
            "the group to restart",
        )
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        mode = " (fsdp)" if parallel == "fsdp" else ""
        sweep_row(job, s, f"kill -9 trainer rank 1 of 2{mode} at {point}", recover, time.time() - t0)
    finally:
        server.stop()


def test_hung_trainer_rank(tmp_path: Path, cache_dir: Path) -> None:
    """A rank that hangs (SIGSTOP) makes the others' collective time out (trainer.dist_timeout_s): the
    group ends, the stopped rank is killed, the group restarts; nothing lost, nothing trained twice."""
    server = RedisServer(tmp_path / "redis")
    try:
        t0 = time.time()
        job = Job(tmp_path, cache_dir, server, *SWEEP, "trainer.world_size=2", "trainer.dist_timeout_s=5")
        fault_at, pub, put = wait_point(job, "mid_interval")
        victim = job.pids()["trainer.1"]
        os.kill(victim, signal.SIGSTOP)
        wait_for(
            lambda: job.pids().get("trainer.1") != victim or job.state.trainer_finished(), 120, "restart"
        )
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        assert s["restarts"].get("trainer", 0) >= 1
        sweep_row(job, s, "SIGSTOP trainer rank 1 of 2 (hang)", recover, time.time() - t0)
    finally:
        server.stop()


@pytest.mark.parametrize("point", [*POINTS, "mid_publish"])
@pytest.mark.parametrize("role", ["trainer", "rollout-0", "evaluator"])
def test_crash_point_sweep(tmp_path: Path, cache_dir: Path, role: str, point: str) -> None:
    kill_role_at(tmp_path, cache_dir, role, point)


TREE = [
    "rollout.tree.enabled=true",
    "rollout.tree.points=every_turn",
    "credit.strategy=tree",
    "env.max_difficulty=2",
]


@pytest.mark.parametrize("point", ["mid_interval", "mid_publish"])
@pytest.mark.parametrize("role", ["trainer", "rollout-0"])
def test_crash_point_sweep_tree_groups(tmp_path: Path, cache_dir: Path, role: str, point: str) -> None:
    """Tree groups are delivered whole: a worker killed mid-tree returns its admissions, a trainer
    killed mid-interval retrains nothing — the same promises as flat groups."""
    kill_role_at(tmp_path, cache_dir, role, point, *TREE, label=" (tree groups)")


@pytest.mark.parametrize("point", [*POINTS, "mid_publish"])
def test_crash_point_sweep_orchestrator(tmp_path: Path, cache_dir: Path, point: str) -> None:
    server = RedisServer(tmp_path / "redis")
    job: ProcJob | None = None
    try:
        t0 = time.time()
        job = ProcJob(tmp_path, cache_dir, server, *SWEEP)
        wait_for(lambda: job.state.snapshot() is not None, 600, "an orchestrator snapshot")
        fault_at, _, _ = wait_point(job, point)
        job.procs[0].send_signal(signal.SIGKILL)
        job.procs[0].wait(30)
        job.resume()
        recover = job.recovery_seconds(fault_at, job.state.tallies().versions_published, job.put_total() or 0)
        s = job.finish()
        sweep_row(job, s, f"kill -9 orchestrator at {point}, then --resume", recover, time.time() - t0)
    finally:
        if job is not None:
            job.cleanup()
        server.stop()


def corrupt_versions(root: Path, first: int, k: int, stop: threading.Event) -> list[int]:
    """Overwrite the weights of versions first .. first+k-1 (republished ones included) as they appear."""
    done: list[int] = []
    while not stop.is_set() and len(done) < k:
        for d in sorted(root.glob("v*")):
            v = int(d.name[1:])
            if v >= first and v not in done and len(done) < k and (d / "model.safetensors").exists():
                with contextlib.suppress(OSError):
                    (d / "model.safetensors").write_bytes(b"corrupt")
                    done.append(v)
        time.sleep(0.001)
    return done


@pytest.mark.parametrize("k", [1, 2, 3, 4])  # max_staleness = 2: up to max_staleness + 2 in a row
def test_consecutive_corrupt_versions(tmp_path: Path, cache_dir: Path, k: int) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        t0 = time.time()
        job = Job(tmp_path, cache_dir, server, *SWEEP)
        root = Path(job.cfg.weights.path or "") / job.run_dir.name
        wait_for(lambda: job.state.version() >= 3, 600, "version 3")
        stop = threading.Event()
        fault_at, pub, put = time.time(), job.state.tallies().versions_published, job.put_total() or 0
        out: list[list[int]] = []
        th = threading.Thread(
            target=lambda: out.append(corrupt_versions(root, job.state.version() + 1, k, stop))
        )
        th.start()
        recover = job.recovery_seconds(fault_at, pub, put)
        s = job.finish()
        stop.set()
        th.join(5)
        assert out and len(out[0]) == k, out
        sweep_row(job, s, f"{k} corrupt weight versions in a row ({out[0]})", recover, time.time() - t0)
    finally:
        server.stop()
