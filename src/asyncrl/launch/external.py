"""Roles as services (``launcher.kind: external``): the orchestrator launches nothing.

Each role runs on its own — ``asyncrl role rollout|trainer|orchestrator CONFIG --run-dir DIR`` —
under whatever starts services on its machine (systemd, Kubernetes, Compose), and the roles meet
only through the queue (Redis), the weight store (shared filesystem + Redis pointer) and the run
directory (control state and metrics; see ``docs/deploy.md`` for what must be shared).

Start-up order is free. The orchestrator role prepares the run directory (warm start, version 0
of the weights, initial evaluation, ``config.yaml``) and then "starts" the roles, which here only
writes :data:`READY_FILE`; ``asyncrl role rollout|trainer`` wait for that file before they begin.
Restarting a role is its service manager's job (``Restart=on-failure``); a rollout worker that
starts returns the admissions its predecessor of the same index never delivered, as the local
supervisor does for a dead process. The orchestrator only watches heartbeats: a role whose
metrics file has not changed for ``launcher.heartbeat_timeout_s`` is reported as silent (log
warning, and in :meth:`ExternalLauncher.silent`), but ``exitcode`` stays ``None`` — it cannot see
or restart processes on other machines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.config import ExternalLauncherConfig
from asyncrl.launch.base import Launcher

log = logging.getLogger(__name__)

READY_FILE = "roles.ready"
"""Written into the run directory once it is prepared: roles started as services may begin."""


class ExternalLauncher(Launcher):
    def __init__(self, cfg: ExternalLauncherConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self._started: dict[str, float] = {}
        self._silent: set[str] = set()

    def start(self, name: str, target: Callable[..., None], *args: object) -> None:
        """Record the role and tell the services the run directory is ready (nothing is launched)."""
        self._started.setdefault(name, time.time())
        ready = self.run_dir / READY_FILE
        if not ready.exists():
            ready.write_text(f"{time.time()}\n")

    def start_group(
        self, names: list[str], target: Callable[..., None], args: tuple[object, ...], port: int
    ) -> None:
        """The trainer's ranks are services too (``asyncrl role trainer`` with RANK/MASTER_ADDR/MASTER_PORT,
        e.g. under torchrun); only rank 0 reports metrics, so only it is watched."""
        self.start(names[0], target, *args)

    def exitcode(self, name: str) -> int | None:
        """Always None (liveness of remote processes is their service manager's business); warns once when
        the role's metrics go silent past ``launcher.heartbeat_timeout_s``, and when they resume."""
        metrics = self.run_dir / "metrics" / f"{name}.jsonl"
        try:
            last = metrics.stat().st_mtime
        except FileNotFoundError:
            last = self._started[name]
        silent = time.time() - last > self.cfg.heartbeat_timeout_s
        if silent and name not in self._silent:
            log.warning(
                "role %s has not reported for %.0fs (launcher.heartbeat_timeout_s); is its service running?",
                name,
                time.time() - last,
            )
            self._silent.add(name)
        elif not silent and name in self._silent:
            log.warning("role %s is reporting again", name)
            self._silent.discard(name)
        return None

    def silent(self) -> list[str]:
        """Roles currently past their heartbeat timeout."""
        return sorted(self._silent)

    def pid(self, name: str) -> int | None:
        return None

    def stop(self, name: str, timeout: float) -> None:
        """Nothing to do: every role stops by itself once the run's ``stop`` flag is set."""

    def names(self) -> list[str]:
        return list(self._started)
