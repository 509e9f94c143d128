"""The local launcher (``launcher.kind: local``): role processes on this machine (``multiprocessing``
with spawn). The contract: :mod:`asyncrl.launch.base`.

Each role runs in a session of its own (``setsid``): a terminal's Ctrl-C, a closed terminal's SIGHUP
and a signal to the launcher's process group (``timeout``, ``kill -- -PGID``) reach the orchestrator
alone, which stops the roles in order (:mod:`asyncrl.orchestrator.stopping`). A role never outlives
its orchestrator for long: it watches the orchestrator's heartbeat (``launcher.orphan_timeout_s``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.context import SpawnProcess

from asyncrl.launch.base import Launcher


class LocalLauncher(Launcher):
    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._procs: dict[str, SpawnProcess] = {}

    def start(self, name: str, target: Callable[..., None], *args: object) -> None:
        proc = self._ctx.Process(target=_own_session, args=(target, *args), name=name, daemon=False)
        proc.start()
        self._procs[name] = proc

    def exitcode(self, name: str) -> int | None:
        proc = self._procs[name]
        return None if proc.is_alive() else proc.exitcode

    def pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        return proc.pid if proc is not None else None

    def stop(self, name: str, timeout: float) -> None:
        proc = self._procs.get(name)
        if proc is None:
            return
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    def names(self) -> list[str]:
        return list(self._procs)


def _own_session(target: Callable[..., None], *args: object) -> None:
    """A role process's entry: leave the launcher's session and process group, then run the role."""
    os.setsid()
    target(*args)
