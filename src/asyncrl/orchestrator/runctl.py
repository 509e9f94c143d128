"""Operating a run from another shell: ``asyncrl status RUN`` and ``asyncrl stop RUN``.

Both read the run directory and the run's control state (SQLite in the run directory, or Redis),
so they work for a run started by ``asyncrl train``/``demo`` here and for one whose orchestrator
runs as a service elsewhere:

* **status** — ``running`` / ``stopped`` / ``finished`` / ``failed`` (``run.json``), or ``lost`` when
  ``run.json`` still says running but the orchestrator has neither a live process here nor a
  heartbeat within ``launcher.orphan_timeout_s`` (it was killed: ``--resume`` takes over); the
  trainer step and version, which roles are alive, the last held-out success, the queue depth.
* **stop** — the same clean stop as SIGTERM (:mod:`asyncrl.orchestrator.stopping`): a signal to the
  orchestrator's process when it runs on this machine, else the ``halt`` flag in the control state,
  which the orchestrator polls every tick. ``now``: no grace period.

A process is identified by its pid *and* its start time (``/proc/PID/stat``), so a pid reused by a
later process is never taken for a role or signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.control import RunState
from asyncrl.errors import UserError
from asyncrl.telemetry.experiment import update_run_record
from asyncrl.telemetry.jsonl import read_jsonl
from asyncrl.transport import make_queue


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat from field 3 (the state) on; empty if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22); None if gone."""
    stat = _stat(pid)
    return int(stat[19]) if stat else None


def process_alive(pid: int, ticks: int | None) -> bool:
    """The process ``pid`` started at ``ticks`` still runs (a zombie does not)."""
    stat = _stat(pid)
    return ticks is not None and bool(stat) and int(stat[19]) == ticks and stat[0] != "Z"


def reap_orphans(run_dir: Path, state: RunState) -> None:
    """After a crash of the orchestrator itself its role processes may live on (until their orphan
    watch stops them): stop them (SIGKILL, as if they had crashed with it) and give their admissions
    back, before a resumed orchestrator starts new ones."""
    roles_file = run_dir / "roles.json"
    roles = json.loads(roles_file.read_text()) if roles_file.is_file() else {}
    for pid, ticks in roles.values():
        # the same pid AND the same start time: our process, not a later one that reused the pid
        if pid != os.getpid() and process_alive(pid, ticks):
            os.kill(int(pid), signal.SIGKILL)
            end = time.time() + 5.0
            while process_alive(pid, ticks) and time.time() < end:
                time.sleep(0.05)
    for name in state.workers_in_flight():
        state.reclaim(name)


def record_orchestrator(run_dir: Path) -> None:
    """Write this process's identity into ``run.json``: ``asyncrl stop`` signals it, ``status`` checks it."""
    pid = os.getpid()
    update_run_record(
        run_dir, orchestrator={"pid": pid, "host": socket.gethostname(), "start_ticks": start_ticks(pid)}
    )


@dataclass
class RunStatus:
    run_dir: str
    status: str
    """running / stopped / finished / failed / lost (see the module docstring)."""
    step: int | None = None
    total_steps: int | None = None
    version: int | None = None
    heartbeat_age_s: float | None = None
    roles: dict[str, bool | None] = field(default_factory=dict)
    """Role -> alive (None: on another machine, not visible from here)."""
    heldout_success: float | None = None
    heldout_version: int | None = None
    queue_depth: int | None = None
    stopped: dict[str, object] | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def render(self) -> str:
        lines = [f"run      {self.run_dir}", f"status   {self.status}"]
        if self.step is not None:
            lines.append(f"step     {self.step} of {self.total_steps}, version {self.version}")
        if self.heartbeat_age_s is not None and self.status in ("running", "lost"):
            lines.append(f"orchestrator heartbeat {self.heartbeat_age_s:.0f} s ago")
        if self.roles:
            alive = [n for n, a in self.roles.items() if a]
            unknown = [n for n, a in self.roles.items() if a is None]
            lines.append(
                f"roles    {len(alive)} alive"
                + (f" ({', '.join(alive)})" if alive else "")
                + (f"; {len(unknown)} on other machines" if unknown else "")
            )
        if self.heldout_success is not None:
            lines.append(f"held-out {self.heldout_success:.1%} at v{self.heldout_version}")
        if self.queue_depth is not None:
            lines.append(f"queue    {self.queue_depth} entries")
        if self.stopped:
            lines.append(f"stopped  by {self.stopped.get('signal')} during {self.stopped.get('phase')}")
        if self.error:
            lines.append(f"error    {self.error}")
        if self.status in ("stopped", "lost"):
            lines.append(f"resume   asyncrl train --resume {self.run_dir}")
        return "\n".join(lines)


def _record(run_dir: Path) -> dict[str, Any]:
    try:
        rec = json.loads((run_dir / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise UserError(f"{run_dir}: not a run directory (no readable run.json)") from None
    return rec if isinstance(rec, dict) else {}


def _orchestrator_here(rec: dict[str, Any]) -> int | None:
    """The orchestrator's pid if it runs on this machine and is alive, else None."""
    o = rec.get("orchestrator") or {}
    if o.get("host") != socket.gethostname() or not isinstance(o.get("pid"), int):
        return None
    return int(o["pid"]) if process_alive(int(o["pid"]), o.get("start_ticks")) else None


def _heldout(run_dir: Path) -> tuple[float | None, int | None]:
    evals = read_jsonl(run_dir / "evals.jsonl")
    if evals:
        return float(evals[-1]["success_rate"]), int(evals[-1]["version"])
    final = run_dir / "final_eval.json"
    for path, version in ((final, None), (run_dir / "initial_eval.json", 0)):
        if path.is_file():
            return float(json.loads(path.read_text())["success_rate"]), version
    return None, None


def _roles(run_dir: Path) -> dict[str, bool | None]:
    try:
        roles = json.loads((run_dir / "roles.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {name: process_alive(int(pid), ticks) for name, (pid, ticks) in roles.items()}


def run_status(run_dir: str | Path) -> RunStatus:
    """What ``asyncrl status RUN`` prints (module docstring)."""
    run_dir = Path(run_dir)
    rec = _record(run_dir)
    st = RunStatus(run_dir=str(run_dir), status=str(rec.get("status", "running")), stopped=rec.get("stopped"))
    st.error = rec.get("error")
    st.heldout_success, st.heldout_version = _heldout(run_dir)
    if not (run_dir / "config.yaml").is_file():  # still being prepared (or stopped while it was)
        alive = _orchestrator_here(rec) is not None
        st.status = "lost" if st.status == "running" and not alive and rec.get("orchestrator") else st.status
        return st
    cfg = load_config(run_dir / "config.yaml")
    st.total_steps = cfg.trainer.total_steps
    state = RunState.open(cfg, run_dir)
    try:
        st.step, st.version = state.trainer_step(), state.version()
        st.heartbeat_age_s = state.orchestrator_silent_s()
    finally:
        state.close()
    st.roles = _roles(run_dir) if st.status == "running" else {}
    if st.status == "running" and _orchestrator_here(rec) is None:
        age = st.heartbeat_age_s
        if age is None or age > cfg.launcher.orphan_timeout_s:
            st.status = "lost"
    queue = make_queue(cfg.transport, run_dir)
    try:
        st.queue_depth = int(queue.stats().depth)
    finally:
        queue.close()
    return st


def stop_run(run_dir: str | Path, *, now: bool, wait_s: float) -> RunStatus:
    """Stop a running run as SIGTERM would (``now``: as a second signal would) and wait up to ``wait_s``
    for ``run.json`` to say it is no longer running."""
    run_dir = Path(run_dir)
    st = run_status(run_dir)
    if st.status != "running":
        return st
    pid = _orchestrator_here(_record(run_dir))
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        if now:
            time.sleep(0.5)  # the first signal's handler has run: the second one cuts the grace short
            os.kill(pid, signal.SIGTERM)
    else:
        if not (run_dir / "config.yaml").is_file():
            raise UserError(
                f"{run_dir} is being prepared by an orchestrator that does not run on this machine: stop it there"
            )
        cfg = load_config(run_dir / "config.yaml")
        state = RunState.open(cfg, run_dir)
        state.request_halt(now=now)
        state.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        st = run_status(run_dir)
        if st.status != "running":
            return st
        time.sleep(0.5)
    return st


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """``--resume`` of a finished run: its summary, untouched (and a line saying so); None for a run that
    has not finished. Light (no torch): ``asyncrl train --resume`` asks it before importing the job."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None
    done: dict[str, Any] = json.loads(summary.read_text())
    print(
        f"asyncrl: {run_dir} already finished ({done.get('trainer_steps')} trainer steps); "
        "nothing to resume, nothing changed",
        file=sys.stderr,
        flush=True,
    )
    return done
