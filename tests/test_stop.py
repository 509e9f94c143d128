"""Operating a run: stop signals, ``asyncrl status`` / ``stop``, no orphans, safe resume
(:mod:`asyncrl.orchestrator.stopping`, :mod:`asyncrl.orchestrator.runctl`).

Each end-to-end test runs ``asyncrl train`` as a process of its own session, as a terminal or a
scheduler would, signals it (the whole process group, as Ctrl-C and ``timeout`` do), and checks
the promises: the exit code is 128 + the signal, no role process is left, ``run.json`` says
``stopped`` with the signal, phase and step, and ``--resume`` finishes the run with nothing lost and
nothing trained twice — a second ``--resume`` then changes nothing. The matrix over moments,
backends and the Ray launcher is in the ``faults`` suite (``make test-faults``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import helpers
from asyncrl.config import apply_overrides, load_config
from asyncrl.control import RunState
from asyncrl.orchestrator.runctl import process_alive, run_status
from asyncrl.orchestrator.stopping import Stopped, StopSignals
from helpers import TINY_RUN

STEPS, BATCH = 10, 16
TINY = [
    *TINY_RUN,
    "env.heldout_size=8",
    f"trainer.batch_size={BATCH}",
    f"trainer.total_steps={STEPS}",
    "telemetry.eval_every=4",
    "launcher.orphan_timeout_s=4",
]
# rollouts paced (16 episodes at a time, 0.15 s a tool call: about 1 s a step) for a signal that must land
# in training: unpaced, forked roles (tests/conftest.py) train the ten tiny steps in ~1.5 s and the signal
# can land after training, in the final evaluation
PACED = ["rollout.concurrent_episodes=16", "env.latency.seconds=0.15"]


# ---- units ------------------------------------------------------------------------------------
def test_a_signal_is_recorded_while_supervising_and_raises_while_working() -> None:
    s = StopSignals()
    with s.mode(raising=False):
        s._handle(signal.SIGTERM, None)  # flag mode: recorded only
        assert (s.signum, s.forced) == (signal.SIGTERM, False)
        with pytest.raises(Stopped) as second:  # a second signal always cuts short
            s._handle(signal.SIGINT, None)
    assert second.value.signum == signal.SIGTERM and second.value.exit_code == 128 + 15
    assert s.forced
    fresh = StopSignals()
    with pytest.raises(Stopped):  # raise mode (warm start, evaluations): the work is interrupted
        fresh._handle(signal.SIGINT, None)
    asked = StopSignals()
    asked.request(signal.SIGTERM, force=True)  # `asyncrl stop --now`
    assert asked.forced and asked.signum == signal.SIGTERM
    with pytest.raises(Stopped), asked.mode(raising=True):  # recorded before raise mode: raises on entry
        pass


def test_a_stopped_message_says_how_to_resume() -> None:
    stop = Stopped(signal.SIGINT, "training", "/runs/x")
    assert stop.exit_code == 130
    assert stop.message().endswith("resume with: asyncrl train --resume /runs/x")
    assert "nothing was written" in Stopped(signal.SIGTERM).message()


def _orphan_check(state: RunState, role: RunState) -> None:
    role._orphan_after = 2.0
    assert not role.stopping()  # the orchestrator never beat (a role tested on its own): not an orphan
    state.beat(time.time())
    role._watched_at = 0.0
    assert not role.stopping()
    state.beat(time.time() - 10)  # silent for 10 s > 2 s
    role._watched_at = 0.0
    assert role.stopping() and role.orphaned()
    state.beat(time.time())  # sticky: a role that saw its orchestrator gone stops anyway
    assert role.stopping()
    assert not state.stopping()  # the orchestrator's own view never watches itself


def test_a_role_stops_when_its_orchestrator_is_silent(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    _orphan_check(RunState.open(cfg, tmp_path), RunState.for_role(cfg, tmp_path))


@pytest.mark.redis
def test_a_role_stops_when_its_orchestrator_is_silent_redis(tmp_path: Path) -> None:
    from test_state_store import _delete, _redis_or_skip, redis_cfg

    _redis_or_skip()
    prefix = f"asyncrl-test-orphan-{os.getpid()}"
    cfg = redis_cfg(prefix)
    try:
        _orphan_check(RunState.open(cfg, tmp_path), RunState.for_role(cfg, tmp_path))
    finally:
        _delete(prefix)


def test_a_halt_asked_through_the_state_is_seen(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    state = RunState.open(cfg, tmp_path)
    assert state.halt_requested() == (False, False)
    state.request_halt(now=True)
    assert state.halt_requested() == (True, True)


# ---- end to end ---------------------------------------------------------------------------------
class TrainProcess:
    """``asyncrl train`` in a session of its own; ``signal`` sends to its whole process group."""

    def __init__(self, tmp: Path, cache: Path, *extra: str) -> None:
        sets = [*TINY, f"run_root={tmp / 'runs'}", f"cache_dir={cache}", *extra]
        self.cfg = load_config(None, sets)
        self.cfg_file = tmp / "job.yaml"
        self.cfg_file.write_text(json.dumps(apply_overrides({}, sets)))  # JSON is YAML
        self.root, self.log = tmp / "runs", tmp / "job.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = self.start(str(self.cfg_file))
        helpers.wait_for(lambda: any(self.root.glob("*/run.json")), 300, "the run directory")
        self.run_dir = next(self.root.glob("*/run.json")).parent

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "asyncrl.cli", "train", *args, "--no-display", "--eval-limit", "4"]
        with self.log.open("a") as log:
            return subprocess.Popen(
                cmd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )

    def signal(self, sig: int) -> float:
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout: float = 300) -> int:
        return self.proc.wait(timeout)

    def state(self) -> RunState:
        return RunState.open(self.cfg, self.run_dir)

    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.run_dir / "run.json").read_text()))

    def roles_left(self) -> list[str]:
        roles = json.loads((self.run_dir / "roles.json").read_text())
        return [n for n, (pid, ticks) in roles.items() if process_alive(pid, ticks)]

    def resume(self) -> dict[str, Any]:
        self.proc = self.start("--resume", str(self.run_dir))
        assert self.wait(600) == 0, self.log.read_text()[-3000:]
        return dict(json.loads((self.run_dir / "summary.json").read_text()))

    def cleanup(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            for pid, _ in json.loads((self.run_dir / "roles.json").read_text()).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def check_stopped(
    job: TrainProcess, sig: int, phase: str | tuple[str, ...], sent_at: float
) -> dict[str, Any]:
    code = job.wait(job.cfg.launcher.stop_grace_s + 60)
    took = time.monotonic() - sent_at
    assert code == 128 + sig, job.log.read_text()[-3000:]
    assert took < job.cfg.launcher.stop_grace_s + 30, took
    rec = job.record()
    assert rec["status"] == "stopped", rec
    phases = (phase,) if isinstance(phase, str) else phase
    assert rec["stopped"]["signal"] == signal.Signals(sig).name and rec["stopped"]["phase"] in phases, rec
    if (job.run_dir / "roles.json").is_file():
        assert job.roles_left() == []  # no orphan
    log = job.log.read_text()
    assert f"resume with: asyncrl train --resume {job.run_dir}" in log
    assert run_status(job.run_dir).status == "stopped"
    return rec


def check_resumed(job: TrainProcess) -> dict[str, Any]:
    s = job.resume()
    assert s["trainer_steps"] == STEPS, s
    assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0, s
    state = job.state()
    assert state.fate_counts().get("trained", 0) == s["samples_trained"] == STEPS * BATCH, s
    state.close()
    assert job.record()["status"] == "finished"
    before = (job.run_dir / "summary.json").read_bytes()
    job.proc = job.start("--resume", str(job.run_dir))  # a finished run: said so, nothing changed
    assert job.wait(120) == 0
    assert (job.run_dir / "summary.json").read_bytes() == before
    assert "already finished" in job.log.read_text()
    return s


@pytest.mark.slow
def test_sigterm_mid_training_stops_cleanly_and_resumes_to_the_end(tmp_path: Path, cache_dir: Path) -> None:
    job = TrainProcess(tmp_path, cache_dir, *PACED)
    try:
        state = job.state()
        helpers.wait_for(lambda: state.trainer_step() >= 3, 900, "trainer step 3")
        state.close()
        rec = check_stopped(job, signal.SIGTERM, "training", job.signal(signal.SIGTERM))
        assert 3 <= rec["stopped"]["step"] < STEPS
        ckpts = sorted((job.run_dir / "checkpoints").glob("step_*"))
        assert (
            int(ckpts[-1].name.split("_")[1]) == rec["stopped"]["step"]
        )  # a checkpoint of every trained step
        check_resumed(job)
    finally:
        job.cleanup()


@pytest.mark.slow
def test_ctrl_c_during_the_warm_start_leaves_a_resumable_run(tmp_path: Path, cache_dir: Path) -> None:
    job = TrainProcess(tmp_path, cache_dir / "own", "trainer.sft.steps=100000")  # a warm start that lasts
    try:
        time.sleep(3.0)  # in the warm start (the run directory exists from its first second)
        check_stopped(job, signal.SIGINT, "preparation", job.signal(signal.SIGINT))
        assert (job.run_dir / "config.yaml").is_file() and not (job.run_dir / "initial_eval.json").exists()
        st = run_status(job.run_dir)
        assert st.status == "stopped" and st.step == 0
    finally:
        job.cleanup()


@pytest.mark.slow
@pytest.mark.redis
def test_asyncrl_stop_from_another_shell_on_the_redis_queue(tmp_path: Path, cache_dir: Path) -> None:
    from redis_server import RedisServer

    server = RedisServer(tmp_path / "redis")
    long = "trainer.total_steps=200"  # not resumed here: long enough that the stop lands in training
    job = TrainProcess(tmp_path, cache_dir, long, "transport.kind=redis", f"transport.redis_url={server.url}")
    try:
        state = job.state()
        helpers.wait_for(lambda: state.trainer_step() >= 2, 300, "trainer step 2")
        state.close()
        assert run_status(job.run_dir).status == "running"
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "asyncrl.cli", "stop", str(job.run_dir), "--wait", "90"],
            capture_output=True,
            text=True,
            env=job.env,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "status   stopped" in out.stdout
        check_stopped(job, signal.SIGTERM, "training", t0)  # resumed on Redis: the faults matrix below
    finally:
        job.cleanup()
        server.stop()


@pytest.mark.slow
def test_roles_of_a_killed_orchestrator_stop_by_themselves(tmp_path: Path, cache_dir: Path) -> None:
    """kill -9 the orchestrator (no handler runs): its roles see the heartbeat stop and exit within
    ``launcher.orphan_timeout_s`` (4 s here); the trainer checkpoints first; ``status`` says lost."""
    job = TrainProcess(tmp_path, cache_dir, "trainer.total_steps=200")  # still training when killed
    try:
        state = job.state()
        helpers.wait_for(lambda: state.trainer_step() >= 2, 300, "trainer step 2")
        roles = job.roles_left()
        assert {"trainer", "rollout-0"} <= set(roles)
        pids = {n: pid for n, (pid, _) in json.loads((job.run_dir / "roles.json").read_text()).items()}
        helpers.wait_for(  # telemetry.eval_idle, the default
            lambda: os.sched_getscheduler(pids["evaluator"]) == os.SCHED_IDLE,
            60,
            "the evaluator at SCHED_IDLE",
        )
        assert os.sched_getscheduler(pids["trainer"]) == os.sched_getscheduler(
            0
        )  # training keeps its priority
        job.proc.send_signal(signal.SIGKILL)  # the orchestrator alone: its roles are in their own sessions
        job.wait(30)
        assert job.roles_left()  # they outlive it ...
        helpers.wait_for(lambda: not job.roles_left(), 60, "the orphaned roles to stop")  # ... not for long
        assert run_status(job.run_dir).status == "lost"
        step = state.trainer_step()
        ckpts = sorted((job.run_dir / "checkpoints").glob("step_*"))
        assert int(ckpts[-1].name.split("_")[1]) == step  # it stopped at a safe point, checkpointed
        state.close()
    finally:
        job.cleanup()


# ---- the matrix (make test-faults): each signal at several moments, both queues, the Ray launcher ------
def _at_moment(job: TrainProcess, moment: str) -> None:
    """Wait until the run is at ``moment`` (as near as polling the run directory gets)."""
    state = job.state()
    try:
        if moment == "warm start":
            time.sleep(2.0)
        elif moment == "initial evaluation":
            helpers.wait_for(lambda: (job.run_dir / "initial_policy").is_dir(), 300, "the initial policy")
        elif moment == "mid-step":
            helpers.wait_for(lambda: state.trainer_step() >= 3, 900, "trainer step 3")
        elif moment == "a publish":  # the version announcement follows each publish at once
            v = state.version()
            helpers.wait_for(lambda: state.version() > max(v, 2), 300, "a new version", every=0.01)
        elif moment == "mid-checkpoint":  # a checkpoint directory being written, or just written
            ckpts = job.run_dir / "checkpoints"
            helpers.wait_for(
                lambda: state.trainer_step() >= 2 and any(ckpts.glob("*")), 300, "a checkpoint", every=0.01
            )
        elif moment == "final evaluation":  # the trainer finished and every role has stopped
            helpers.wait_for(state.trainer_finished, 600, "the trainer to finish", every=0.05)
            helpers.wait_for(lambda: not job.roles_left(), 120, "the roles to stop", every=0.05)
    finally:
        state.close()


MATRIX = [  # (signal, moment, extra settings, phase it is recorded in)
    (signal.SIGINT, "warm start", ["trainer.sft.steps=400"], "preparation"),
    (signal.SIGTERM, "initial evaluation", ["env.heldout_size=64"], "preparation"),
    (signal.SIGTERM, "mid-step", [], "training"),
    (signal.SIGINT, "mid-step", ["transport.kind=redis"], "training"),
    (signal.SIGHUP, "a publish", ["transport.kind=redis"], "training"),
    (signal.SIGTERM, "mid-checkpoint", [], "training"),
    (signal.SIGHUP, "final evaluation", ["env.heldout_size=64"], "final evaluation"),
    (signal.SIGTERM, "mid-step", ["launcher.kind=ray"], "training"),
]


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.timeout(1200)  # a resumed warm start, a Ray cluster's start: minutes on a loaded machine
@pytest.mark.parametrize(
    ("sig", "moment", "extra", "phase"), MATRIX, ids=[f"{s.name}-{m}-{'+'.join(e)}" for s, m, e, _ in MATRIX]
)
def test_stop_signal_matrix(
    tmp_path: Path, cache_dir: Path, sig: signal.Signals, moment: str, extra: list[str], phase: str
) -> None:
    from redis_server import RedisServer

    if "launcher.kind=ray" in extra:
        pytest.importorskip("ray")
    server = RedisServer(tmp_path / "redis") if "transport.kind=redis" in extra else None
    sets = [
        *extra,
        *([f"transport.redis_url={server.url}"] if server else []),
        *(PACED if phase == "training" else []),
    ]
    job = TrainProcess(tmp_path, cache_dir, *sets)
    try:
        _at_moment(job, moment)
        phases = (phase,)
        if moment == "initial evaluation" and (job.run_dir / "initial_eval.json").is_file():
            # the evaluation was over before the signal, which lands in the preparation's last step
            # (freeing the warm start's memory) or in training: a switch this poll cannot see
            phases = ("preparation", "training")
        sent = job.signal(sig)
        check_stopped(job, sig, phases, sent)
        took = time.monotonic() - sent
        s = check_resumed(job)
        fault = f"{sig.name} at {moment} ({', '.join(extra) or 'embedded queue'}), then --resume"
        helpers.fault_row(fault, s, restarts="none (stopped, resumed)", recover_s=f"stopped in {took:.1f}")
    finally:
        job.cleanup()
        if server is not None:
            server.stop()
