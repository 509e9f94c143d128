"""``asyncrl role rollout|trainer|orchestrator CONFIG --run-dir DIR``: one role on its own, as a service.

* ``orchestrator`` prepares ``DIR`` (or continues it if it is already prepared: a restarted
  orchestrator service resumes the run), then supervises with ``launcher.kind: external`` —
  it launches nothing, watches heartbeats, adapts the flow, and writes ``summary.json`` at the end.
* ``trainer`` waits until ``DIR`` is prepared, then runs the trainer (resuming from the newest
  checkpoint if there is one) until ``trainer.total_steps``.
* ``rollout --index I`` waits likewise, returns the admissions a previous ``rollout-I`` never
  delivered, then runs the worker until the run's ``stop`` flag.

Every role gets the same CONFIG (and ``--set`` overrides). Exit code 0 means the run is over for
this role; ``128 + N`` means signal N stopped it at its next safe point (the trainer wrote a
checkpoint); 75 means its orchestrator was gone longer than ``launcher.orphan_timeout_s`` (no
orphans: it stopped; restarted, it waits for the orchestrator's heartbeat before it begins);
anything else is a failure its service manager should restart. See ``docs/deploy.md``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from asyncrl.bootstrap import init_role_process
from asyncrl.config import ExternalLauncherConfig, RunConfig
from asyncrl.control import RunState
from asyncrl.credentials import check_connections
from asyncrl.errors import UserError
from asyncrl.jobs.train import train
from asyncrl.launch.external import READY_FILE
from asyncrl.orchestrator.stopping import Stopped, StopSignals, stop_signals
from asyncrl.rollout.worker import RolloutWorker

Role = Literal["rollout", "trainer", "orchestrator"]
log = logging.getLogger("asyncrl.role")


def is_prepared(run_dir: Path) -> bool:
    return (run_dir / READY_FILE).is_file() and (run_dir / "initial_policy").is_dir()


def wait_until_prepared(run_dir: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    _poll_until(
        lambda: is_prepared(run_dir),
        timeout_s,
        poll_s,
        f"waiting for the orchestrator to prepare {run_dir} ...",
        f"run directory {run_dir} was not prepared within {timeout_s:.0f}s: start "
        f"`asyncrl role orchestrator CONFIG --run-dir {run_dir}` (it writes {READY_FILE}), or raise --wait",
    )


def _poll_until(done: Callable[[], bool], timeout_s: float, poll_s: float, waiting: str, error: str) -> None:
    """Poll ``done`` every ``poll_s``; say ``waiting`` once, and raise ``error`` after ``timeout_s``."""
    deadline, announced = time.monotonic() + timeout_s, False
    while not done():
        if time.monotonic() >= deadline:
            raise UserError(error)
        if not announced:
            log.warning(waiting)
            announced = True
        time.sleep(poll_s)


def run_role(
    role: Role, cfg: RunConfig, run_dir: Path, *, index: int = 0, wait_s: float = 3600.0
) -> dict[str, Any] | None:
    """Run one role to its end; the orchestrator returns the run's summary."""
    run_dir = Path(run_dir)
    check_connections(cfg)  # bad Redis settings fail here, before any work
    if role == "orchestrator":
        lc = cfg.launcher  # the roles run as services: the orchestrator only watches them
        shared = set(ExternalLauncherConfig.model_fields) - {"kind"}  # every kind's fields, external's own
        external = ExternalLauncherConfig(**lc.model_dump(include=shared))
        cfg = cfg.model_copy(update={"launcher": external})
        resume = run_dir if (run_dir / "initial_eval.json").is_file() else None
        _, summary = train(cfg, resume=resume, run_dir=run_dir, display=False)
        return summary
    if role not in ("trainer", "rollout"):
        raise UserError(f"unknown role {role!r}; use rollout, trainer or orchestrator")
    if role == "rollout" and not 0 <= index < cfg.rollout.num_workers:
        raise UserError(
            f"--index {index}: must be in 0..rollout.num_workers-1 ({cfg.rollout.num_workers - 1})"
        )
    wait_until_prepared(run_dir, wait_s)
    wait_for_orchestrator(cfg, run_dir, wait_s)
    with stop_signals() as signals:  # SIGTERM from the service manager: stop here, at the next safe point
        orphaned = _run_compute_role(role, cfg, run_dir, index, signals)
    if signals.signum is not None:
        raise Stopped(signals.signum, f"the {role} role")
    if orphaned:
        raise Orphaned(
            f"asyncrl role {role}: the orchestrator of {run_dir} was silent for more than "
            f"launcher.orphan_timeout_s ({cfg.launcher.orphan_timeout_s:.0f}s); stopped (restart this service: "
            "it waits for the orchestrator)"
        )
    return None


class Orphaned(Exception):
    """A role service stopped because its orchestrator was gone (exit :data:`EXIT_ORPHANED`)."""


EXIT_ORPHANED = 75
"""EX_TEMPFAIL: a failure to its service manager (``Restart=on-failure`` restarts it), not a finished run."""


def _run_compute_role(role: Role, cfg: RunConfig, run_dir: Path, index: int, signals: StopSignals) -> bool:
    """Run the trainer (or one of its ranks) or a rollout worker; True if it stopped as an orphan."""
    started = time.time()
    if role == "trainer":
        from asyncrl.trainer.process import TrainerRole

        init_role_process(cfg.model_dump_json(), "trainer")
        if cfg.trainer.world_size > 1:  # one rank of the group, torchrun-style (RANK, MASTER_ADDR/PORT)
            from asyncrl.trainer.ranks import ENV_RENDEZVOUS, trainer_rank_main

            rank = _rank_from_env(cfg.trainer.world_size)
            trainer_rank_main(cfg.model_dump_json(), str(run_dir), True, rank, ENV_RENDEZVOUS, 0)
            return False
        trainer = TrainerRole(cfg, run_dir, resume=True, started=started)
        signals.on_signal = trainer.state.stop_here
        with signals.mode(raising=False):
            trainer.run()
        return trainer.state.orphaned()
    import asyncio

    state = RunState.open(cfg, run_dir)
    state.reclaim(f"rollout-{index}")  # a previous incarnation died with admissions it never delivered
    state.close()
    init_role_process(cfg.model_dump_json(), "rollout")
    worker = RolloutWorker(cfg, run_dir, index, started=started)
    signals.on_signal = worker.state.stop_here
    with signals.mode(raising=False):
        asyncio.run(worker.run())
    return worker.state.orphaned()


def wait_for_orchestrator(cfg: RunConfig, run_dir: Path, timeout_s: float, poll_s: float = 1.0) -> None:
    """A role service starts only while the orchestrator beats (within ``launcher.orphan_timeout_s``):
    restarted while the orchestrator is away, it waits instead of stopping at once as an orphan."""
    state = RunState.open(cfg, run_dir)

    def beating() -> bool:
        silent = state.orchestrator_silent_s()
        return silent is not None and silent <= cfg.launcher.orphan_timeout_s

    try:
        _poll_until(
            beating,
            timeout_s,
            poll_s,
            f"waiting for the orchestrator of {run_dir} to run ...",
            f"the orchestrator of {run_dir} has not beaten for {timeout_s:.0f}s: start (or resume) "
            f"`asyncrl role orchestrator CONFIG --run-dir {run_dir}`, or raise --wait",
        )
    finally:
        state.close()


def _rank_from_env(world_size: int) -> int:
    """This trainer rank, from the variables torchrun sets (or an operator sets by hand)."""
    import os

    missing = [v for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise UserError(
            f"trainer.world_size is {world_size}: start each rank with RANK, MASTER_ADDR and MASTER_PORT "
            f"set (torchrun sets them); missing {', '.join(missing)}"
        )
    rank, world = os.environ["RANK"], os.environ.get("WORLD_SIZE", str(world_size))
    if not rank.isdigit() or int(rank) >= world_size or world != str(world_size):
        raise UserError(f"RANK={rank} WORLD_SIZE={world}: need 0 <= RANK < trainer.world_size = {world_size}")
    return int(rank)


def summary_line(summary: dict[str, Any]) -> str:
    keys = ("trainer_steps", "samples_trained", "lost_trajectories", "duplicates_recorded", "final_success")
    return json.dumps({k: summary.get(k) for k in keys})
