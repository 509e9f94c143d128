"""The local launcher: role processes on this machine (``multiprocessing`` with spawn).

A launcher starts named role processes, reports whether they are alive, and stops them. The
orchestrator decides what to restart; the launcher only places processes. The Ray launcher
(``launcher.kind: ray``) implements the same four methods with Ray actors.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from asyncrl.config import LauncherConfig, RunConfig


def init_role_process(cfg_json: str) -> RunConfig:
    """First thing every role process does: parse its config and pin torch threads."""
    cfg = RunConfig.model_validate_json(cfg_json)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.launcher.torch_threads))
    import torch

    torch.set_num_threads(cfg.launcher.torch_threads)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return cfg


class Launcher(ABC):
    @abstractmethod
    def start(self, name: str, target: Callable[..., None], *args: Any) -> None: ...

    @abstractmethod
    def exitcode(self, name: str) -> int | None:
        """None while running; the exit code once it has ended (negative: killed by a signal)."""

    @abstractmethod
    def pid(self, name: str) -> int | None: ...

    @abstractmethod
    def stop(self, name: str, timeout: float = 10.0) -> None: ...

    @abstractmethod
    def names(self) -> list[str]: ...


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

    def stop(self, name: str, timeout: float = 10.0) -> None:
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


def make_launcher(cfg: LauncherConfig) -> Launcher:
    if cfg.kind == "local":
        return LocalLauncher()
    from asyncrl.errors import UserError

    raise UserError("launcher.kind 'ray' is not available yet in this version; use launcher.kind=local")
