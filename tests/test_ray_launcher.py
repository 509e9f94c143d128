"""The Ray launcher: actors report exit codes like processes (so the supervisor restarts them), and a
shortened demo run with ``launcher.kind=ray`` on a local cluster completes with nothing lost.

The local cluster is started by the launcher itself: its GCS takes a free port (never the 6379 of
the Redis service here) and token auth stays on with a per-run token.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'asyncrl[ray]')")

from asyncrl.config import RayLauncherConfig, load_config
from asyncrl.errors import UserError

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]


def wait_code(launcher: object, name: str, timeout: float = 60.0) -> int:
    end = time.time() + timeout
    while time.time() < end:
        code = launcher.exitcode(name)  # type: ignore[attr-defined]
        if code is not None:
            return int(code)
        time.sleep(0.1)
    raise AssertionError(f"{name} did not end")


def test_actor_exit_codes_restart_and_placement_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from asyncrl.launch.ray_launcher import RayLauncher

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    launcher = RayLauncher(RayLauncherConfig(rollout_cpus=0.5, trainer_cpus=0.5))
    try:
        assert ray.is_initialized()
        gcs_port = int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])
        assert gcs_port != 6379  # Redis owns 6379 here
        assert os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
        # a role whose main returns: exit code 0; one that raises: 1 (targets are module:function)
        launcher.start("rollout-0", time.sleep, 0.2)
        assert launcher.pid("rollout-0") not in (None, os.getpid())
        assert wait_code(launcher, "rollout-0") == 0
        launcher.start("rollout-1", time.sleep, "not a number")
        assert wait_code(launcher, "rollout-1") == 1
        # an actor killed from outside reports -9, and start() replaces it (the supervisor's restart)
        launcher.start("trainer", time.sleep, 600)
        pid = launcher.pid("trainer")
        assert pid is not None and launcher.exitcode("trainer") is None
        # at the launcher's priority, not Ray's default nice 15 (starved beside any other work)
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
        os.kill(pid, signal.SIGKILL)
        assert wait_code(launcher, "trainer") == -9
        launcher.start("trainer", time.sleep, 600)
        assert launcher.pid("trainer") not in (None, pid) and launcher.exitcode("trainer") is None
        launcher.stop("trainer", timeout=0.5)  # does not end by itself: killed
        assert launcher.exitcode("trainer") == -9
        assert sorted(launcher.names()) == ["rollout-0", "rollout-1", "trainer"]
        # a request no node can satisfy is a clear UserError, not a hang
        launcher.cfg = RayLauncherConfig(trainer_gpus=8, place_timeout_s=3.0)
        with pytest.raises(UserError, match=r"launcher\.trainer_gpus"):
            launcher.start("trainer", time.sleep, 1)
    finally:
        launcher.close()
    assert not ray.is_initialized()  # the launcher shut down the cluster it started


def test_demo_config_runs_on_ray(tmp_path: Path) -> None:
    from asyncrl.jobs.train import train

    cfg = load_config(
        REPO / "configs" / "demo.yaml",
        [
            "launcher.kind=ray",
            "launcher.rollout_cpus=0.5",
            "trainer.total_steps=4",
            "trainer.checkpoint_every=2",
            "trainer.sft.steps=30",
            "env.heldout_size=8",
            "telemetry.tensorboard=false",
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    run_dir, s = train(cfg, display=False, eval_limit=4)
    assert s["trainer_steps"] == 4 and s["samples_trained"] == 4 * cfg.trainer.batch_size
    assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0
    assert s["restarts"] == {}
    import json

    pids = json.loads((run_dir / "pids.json").read_text())
    assert set(pids) == {"trainer", "rollout-0", "evaluator"}  # demo.yaml evaluates every 20 versions
    assert os.getpid() not in pids.values() and len(set(pids.values())) == 3
    import ray

    assert not ray.is_initialized()
