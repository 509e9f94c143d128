"""The local launcher (``launcher.kind: local``): role processes on this machine (``multiprocessing``
with spawn). The contract: :mod:`asyncrl.launch.base`."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

from asyncrl.launch.base import Launcher


class LocalLauncher(Launcher):
    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self._procs: dict[str, Any] = {}

    def start(self, name: str, target: Callable[..., None], *args: Any) -> None:
        proc = self._ctx.Process(target=target, args=args, name=name, daemon=False)
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
