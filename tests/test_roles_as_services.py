"""Roles as services: the three roles as separate processes (``asyncrl role ...``) meet only through
a real redis-server (queue, weight pointer and the orchestrator's state store, password-protected),
the shared weight directory and the run directory, and train to completion with nothing lost or trained twice. The password
never reaches the run directory, the weight store or any role's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import TINY_RUN, free_port
from redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "Svc-Pa55word-4711"
TINY = [  # a small, quick run: the point is the wiring, not the learning
    *TINY_RUN,
    "env.heldout_size=16",
    "trainer.batch_size=16",
    "trainer.total_steps=6",
]


def role_cmd(role: str, cfg: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.cli", "role", role, str(cfg), "--run-dir", str(run_dir), *extra]


@pytest.mark.parametrize("world", [1, 2])
def test_three_roles_as_separate_processes_train_to_completion(tmp_path: Path, world: int) -> None:
    """The roles as services; with ``world = 2`` the trainer is two rank services started
    torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in their environment)."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD)
    shared = tmp_path / "shared-weights"
    cfg_path = tmp_path / "run.yaml"
    lines = [
        *TINY,
        "transport.kind=redis",
        f"transport.redis_url={server.url}",
        "transport.capacity=256",
        "weights.kind=shared",
        f"weights.path={shared}",
        f"weights.redis_url={server.url}",
        "control.state.kind=redis",
        f"control.state.redis_url={server.url}",
        "launcher.kind=external",
        f"cache_dir={tmp_path / 'cache'}",
        f"trainer.world_size={world}",
    ]
    from asyncrl.config import apply_overrides

    cfg_path.write_text(json.dumps(apply_overrides({}, lines)))  # JSON is YAML
    run_dir = tmp_path / "runs" / "svc"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("ASYNCRL_REDIS_PASSWORD", None)
    ranks = ["trainer", *(f"trainer.{r}" for r in range(1, world))]
    logs = {name: (tmp_path / f"{name}.log").open("w+") for name in ("rollout", *ranks, "orchestrator")}
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        # services start in any order: the workers wait for the orchestrator to prepare the run
        procs["rollout"] = subprocess.Popen(
            role_cmd("rollout", cfg_path, run_dir, "--index", "0"),
            stdout=logs["rollout"],
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        for rank, name in enumerate(ranks):
            procs[name] = subprocess.Popen(
                role_cmd("trainer", cfg_path, run_dir),
                stdout=logs[name],
                stderr=subprocess.STDOUT,
                env={**env, **rendezvous, "RANK": str(rank)} if world > 1 else env,
                cwd=REPO,
            )
        time.sleep(1.0)
        procs["orchestrator"] = subprocess.Popen(
            role_cmd("orchestrator", cfg_path, run_dir), stdout=logs["orchestrator"], stderr=subprocess.STDOUT, env=env, cwd=REPO
        )  # fmt: skip
        deadline = time.time() + 420
        for name in ("orchestrator", *ranks, "rollout"):
            procs[name].wait(max(1.0, deadline - time.time()))
        codes = {name: p.returncode for name, p in procs.items()}
        out = {name: (f.seek(0), f.read())[1] for name, f in logs.items()}
        assert codes == dict.fromkeys(procs, 0), out
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for f in logs.values():
            f.close()
        server.stop()

    s = json.loads((run_dir / "summary.json").read_text())
    assert s["trainer_steps"] == 6 and s["samples_trained"] == 6 * 16
    assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0
    assert s["restarts"] == {}
    assert not (run_dir / "control.sqlite").exists()  # counters, ledger and documents lived in Redis
    # weights went to the shared directory, the pointer to Redis (no pointer file there)
    versions = sorted(int(p.name[1:]) for p in (shared / "svc").glob("v*"))
    assert versions and versions[-1] == s["last_version"] >= 6
    assert not (shared / "svc" / "latest").exists() and not (run_dir / "weights").exists()
    # the orchestrator launched nothing: the roles' pids are the services' own
    pids = json.loads((run_dir / "pids.json").read_text())
    assert set(pids) - {"evaluator"} == {"trainer", "rollout-0"} and set(pids.values()) == {None}
    # the password is nowhere: run directory, shared weights, any role's output
    leaks = [
        str(p)
        for root in (
            run_dir,
            shared,
            *(tmp_path / f"{n}.log" for n in ("rollout", *ranks, "orchestrator")),
        )
        for p in ([root] if root.is_file() else root.rglob("*"))
        if p.is_file() and PASSWORD.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert "redis://:***@127.0.0.1" in (run_dir / "config.yaml").read_text()


def test_role_waits_then_fails_clearly_without_an_orchestrator(tmp_path: Path) -> None:
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text("{}\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        role_cmd("trainer", cfg_path, tmp_path / "nowhere", "--wait", "1"),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert res.returncode == 2
    assert "was not prepared" in res.stderr and "asyncrl role orchestrator" in res.stderr
    assert "Traceback" not in res.stderr


def test_external_launcher_marks_ready_and_watches_heartbeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from asyncrl.config import ExternalLauncherConfig
    from asyncrl.launch.external import READY_FILE, ExternalLauncher

    launcher = ExternalLauncher(ExternalLauncherConfig(heartbeat_timeout_s=0.3), tmp_path)
    assert not (tmp_path / READY_FILE).exists()
    launcher.start("trainer", print)  # nothing is launched: the role runs elsewhere
    assert (tmp_path / READY_FILE).is_file() and launcher.names() == ["trainer"]
    assert launcher.pid("trainer") is None and launcher.exitcode("trainer") is None
    assert launcher.silent() == []
    time.sleep(0.5)
    with caplog.at_level("WARNING", logger="asyncrl.launch.external"):
        assert launcher.exitcode("trainer") is None  # never "dead": only reported as silent
    assert launcher.silent() == ["trainer"]
    assert any("has not reported" in r.getMessage() for r in caplog.records)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "trainer.jsonl").write_text("{}\n")  # a heartbeat
    launcher.exitcode("trainer")
    assert launcher.silent() == []
