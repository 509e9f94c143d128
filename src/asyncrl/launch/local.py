"""The local launcher: role processes on this machine (``multiprocessing`` with spawn).

A launcher starts named role processes, reports whether they are alive, and stops them. The
orchestrator decides what to restart; the launcher only places processes. The Ray launcher
(``launcher.kind: ray``, :mod:`asyncrl.launch.ray_launcher`) implements the same methods with Ray
actors; ``launcher.kind: external`` (:mod:`asyncrl.launch.external`) launches nothing: the roles run
as services started with ``asyncrl role ...``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.config import LauncherConfig, RunConfig
from asyncrl.policy.memory import set_mmap_threshold


def init_role_process(cfg_json: str) -> RunConfig:
    """First thing every role process does: parse its config, pin torch threads, set the allocator."""
    cfg = RunConfig.model_validate_json(cfg_json)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.launcher.torch_threads))
    import torch

    torch.set_num_threads(cfg.launcher.torch_threads)
    set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)
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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the launcher itself holds (e.g. a cluster it started); after every stop()."""


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


def make_launcher(cfg: LauncherConfig, run_dir: Path | None = None) -> Launcher:
    """``local``: processes here; ``ray``: Ray actors; ``external``: roles started as services elsewhere."""
    if cfg.kind == "local":
        return LocalLauncher()
    if cfg.kind == "ray":
        from asyncrl.launch.ray_launcher import RayLauncher  # lazy: ray is an optional dependency

        return RayLauncher(cfg)
    if cfg.kind == "external":
        from asyncrl.launch.external import ExternalLauncher

        if run_dir is None:
            raise ValueError("launcher.kind 'external' needs the run directory")
        return ExternalLauncher(cfg, run_dir)
    raise ValueError(f"unknown launcher.kind {cfg.kind!r}")
