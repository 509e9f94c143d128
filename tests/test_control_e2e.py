"""The orchestrator's rules on real multi-process runs (tiny model, short warm start).

* a fault switched on for one bucket opens that bucket's breaker within ``consecutive``
  episodes, training continues on the other bucket, and the breaker closes after the fault clears;
* kill -9 of the orchestrator process alone (its role processes live on as orphans): a restart
  with ``--resume`` restores exactly the last saved state, reaps the orphans, and the run completes
  with nothing trained twice or lost.

``bench/control_figures.py`` runs the same scenarios and prints the measured figures.
"""

from __future__ import annotations

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

from asyncrl.config import RunConfig, load_config
from asyncrl.control import RunState
from asyncrl.jobs.train import train
from asyncrl.orchestrator.run import Orchestrator
from helpers import wait_for

pytestmark = pytest.mark.slow

BASE = [
    "model.max_context=320",
    "env.kind=calculator",
    "env.min_difficulty=2",
    "env.max_difficulty=3",
    "env.heldout_size=32",
    "rollout.group_size=8",
    "rollout.concurrent_episodes=32",
    "rollout.sampling.max_new_tokens=24",
    "trainer.batch_size=32",
    "trainer.lr=1e-4",
    "trainer.checkpoint_every=2",
    "trainer.sft.steps=60",
    "telemetry.log_every_s=0.5",
]


def make_cfg(tmp: Path, cache: Path, *extra: str) -> RunConfig:
    return load_config(None, [*BASE, f"run_root={tmp}", f"cache_dir={cache}", *extra])


def alerts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "alerts.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def groups(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in (run_dir / "metrics").glob("rollout-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"rollout/group"' in line:
                out.append(json.loads(line))
    return sorted(out, key=lambda r: r["time"])


def breaker_scenario(tmp: Path, cache: Path) -> dict[str, Any]:
    """Run the breaker scenario; returns the measured figures (also used by the bench script)."""
    tmp.mkdir(parents=True, exist_ok=True)
    switch = tmp / "fault-on"
    cfg = make_cfg(
        tmp,
        cache,
        "trainer.total_steps=400",
        "env.faults.exception_rate=1.0",
        "env.faults.task_types=[arithmetic:3]",
        f"env.faults.switch_file={switch}",
        "env.guard.retries=0",
        "orchestrator.breaker.consecutive=5",
        "orchestrator.breaker.backoff_s=8",
    )
    out: dict[str, Any] = {}
    th = threading.Thread(
        target=lambda: out.update(
            zip(("run_dir", "summary"), train(cfg, display=False, eval_limit=4), strict=True)
        ),
        daemon=True,
    )
    th.start()
    wait_for(lambda: any(Path(tmp).glob("run-*/control.sqlite")), 600, "the run directory")
    run_dir = next(Path(tmp).glob("run-*"))
    state = RunState.open(cfg, run_dir)
    wait_for(lambda: state.version() >= 1, 600, "a trained version")
    switch.touch()
    on_at = time.time()
    wait_for(lambda: any(a["kind"] == "breaker_open" for a in alerts(run_dir)), 300, "the breaker to open")
    opened = next(a for a in alerts(run_dir) if a["kind"] == "breaker_open")
    version_at_open = state.version()
    wait_for(lambda: state.version() >= version_at_open + 2, 300, "training to continue on the other bucket")
    switch.unlink()
    off_at = time.time()
    wait_for(lambda: any(a["kind"] == "breaker_closed" for a in alerts(run_dir)), 300, "the breaker to close")
    closed = next(a for a in alerts(run_dir) if a["kind"] == "breaker_closed")
    state.mark_trainer_finished()  # end the run here
    th.join(600)
    faulty = [g for g in groups(run_dir) if g["bucket"] == "arithmetic:3" and g["time"] >= on_at]
    bad_episodes_before_open = sum(
        sum(a is not None for a in g["anomalies"]) for g in faulty if g["time"] <= opened["time"]
    )
    first_bad = min(g["time"] for g in faulty if any(g["anomalies"]))
    return {
        "run_dir": run_dir,
        "opened": opened,
        "closed": closed,
        "reaction_s_from_switch": opened["time"] - on_at,
        "reaction_s_from_first_faulty_group": opened["time"] - first_bad,
        "anomalous_episodes_reported_before_open": bad_episodes_before_open,
        "recovery_s_from_switch_off": closed["time"] - off_at,
        "groups": groups(run_dir),
        "version_at_open": version_at_open,
        "final_version": state.version(),
        "summary": out.get("summary"),
    }


def test_breaker_opens_on_a_failing_bucket_training_continues_and_it_closes(
    tmp_path: Path, cache_dir: Path
) -> None:
    r = breaker_scenario(tmp_path, cache_dir)
    opened, closed = r["opened"], r["closed"]
    assert opened["bucket"] == "arithmetic:3" and opened["evidence"]["anomaly"] == "exception"
    assert opened["evidence"]["streak"] == 5
    # within N episodes: the rule opened on the 5th consecutive anomalous episode it saw; episodes
    # already running when it opened still finish (at most the worker's concurrency)
    # the rule sees whole groups: the group that completes the streak may add up to group_size - 1
    # more anomalies, then the episodes in flight (≤ concurrency) finish
    assert r["anomalous_episodes_reported_before_open"] <= 5 + (8 - 1) + 32
    # while open, no group of the failing bucket is STARTED (once the workers have read the new
    # directives, a tick or two; groups started before may still finish), and the other bucket keeps
    # training. Judged by start time, so a loaded machine's slow episodes cannot make it flaky.
    half_open = next(a for a in alerts(r["run_dir"]) if a["kind"] == "breaker_half_open")
    during = [g for g in r["groups"] if opened["time"] + 2.0 < g["started"] < half_open["time"]]
    assert [g for g in during if g["bucket"] == "arithmetic:3"] == []
    assert any(g["bucket"] == "arithmetic:2" for g in during)
    assert r["final_version"] >= r["version_at_open"] + 2
    assert closed["bucket"] == "arithmetic:3" and closed["time"] > opened["time"]
    after = [g for g in r["groups"] if g["time"] > closed["time"] and g["bucket"] == "arithmetic:3"]
    assert r["summary"] is not None and r["summary"]["lost_trajectories"] == 0
    assert after or r["summary"]["trainer_steps"] > 0


def kill_scenario(tmp: Path, cache: Path, total_steps: int = 8, *extra: str) -> dict[str, Any]:
    """kill -9 the orchestrator alone mid-run, check the restored state, resume; returns figures."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    sets = [*BASE, f"run_root={tmp}", f"cache_dir={cache}", f"trainer.total_steps={total_steps}", *extra]
    base = [sys.executable, "-m", "asyncrl.cli", "train"]
    opts = ["--no-display", "--eval-limit", "4"]
    cfg_file = tmp / "cfg.yaml"
    cfg_file.write_text("name: kill\n")
    job = subprocess.Popen(
        [*base, str(cfg_file), *opts, *(x for kv in sets for x in ("--set", kv))],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    wait_for(lambda: any(Path(tmp).glob("kill-*/control.sqlite")), 600, "the run directory")
    run_dir = next(Path(tmp).glob("kill-*"))
    state = RunState.open(load_config(None, sets), run_dir)
    wait_for(lambda: state.version() >= 3 and state.snapshot() is not None, 600, "a few versions")
    pids = json.loads((run_dir / "pids.json").read_text())
    os.kill(job.pid, signal.SIGKILL)  # the orchestrator only: trainer and workers become orphans
    killed_at = time.time()
    job.wait(30)
    step_at_kill = state.version()
    saved = state.snapshot()
    assert saved is not None
    saved.pop("saved_at")
    orphans_alive = [p for p in pids.values() if p and Path(f"/proc/{p}").exists()]
    # the restart: a new orchestrator restores the last saved state (and reaps the orphans)
    t0 = time.time()
    cfg = load_config(run_dir / "config.yaml")
    orch = Orchestrator(cfg, run_dir, resume=True, display=False)
    orch.prepare()
    restore_s = time.time() - t0
    restored = json.loads(json.dumps(orch.state_doc()))
    orch._merged.close()
    wait_for(
        lambda: (
            not any(
                Path(f"/proc/{p}").exists() and b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()
                for p in orphans_alive
                if Path(f"/proc/{p}/cmdline").exists()
            )
        ),
        30,
        "orphans reaped",
    )
    resumed_at = time.time()
    res = subprocess.Popen(
        [*base, "--resume", str(run_dir), *opts],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    wait_for(lambda: state.version() > step_at_kill or res.poll() is not None, 600, "training to continue")
    recovered_at = time.time()
    _, err = res.communicate(timeout=600)
    return {
        "run_dir": run_dir,
        "saved": saved,
        "restored": restored,
        "orphans_alive_after_kill": len(orphans_alive),
        "returncode": res.returncode,
        "stderr": err[-2000:],
        "summary": json.loads((run_dir / "summary.json").read_text())
        if (run_dir / "summary.json").is_file()
        else {},
        "restore_s": restore_s,
        "recovery_s": recovered_at - resumed_at,
        "downtime_s": recovered_at - killed_at,
        "total_steps": total_steps,
    }


@pytest.mark.long  # ~2 min; `make test-long` and the crash-point sweep of `make test-faults` kill the orchestrator too
def test_orchestrator_kill9_resume_restores_saved_state_and_completes(
    tmp_path: Path, cache_dir: Path
) -> None:
    # short leases: the killed trainer's leased entries come back sooner (recovery ~ lease_seconds)
    r = kill_scenario(tmp_path, cache_dir, 8, "transport.lease_seconds=10")
    assert r["orphans_alive_after_kill"] >= 2  # trainer and worker outlived the orchestrator
    assert r["restored"] == r["saved"]
    assert r["returncode"] == 0, r["stderr"]
    s = r["summary"]
    assert s["trainer_steps"] == r["total_steps"]
    assert s["duplicates_recorded"] == 0 and s["lost_trajectories"] == 0
