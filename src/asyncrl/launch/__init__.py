"""Launchers place role processes: the interface is :mod:`asyncrl.launch.base`, and
:func:`make_launcher` picks a backend by ``launcher.kind``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.launch.base import Launcher
from asyncrl.launch.external import ExternalLauncher
from asyncrl.launch.local import LocalLauncher
from asyncrl.launch.ray_launcher import RayLauncher

if TYPE_CHECKING:
    from asyncrl.config import LauncherConfig

__all__ = ["Launcher", "LocalLauncher", "make_launcher"]


def make_launcher(cfg: LauncherConfig, run_dir: Path | None = None) -> Launcher:
    """``local``: processes here; ``ray``: Ray actors; ``external``: roles started as services elsewhere."""
    if cfg.kind == "ray":
        return RayLauncher(cfg)
    if cfg.kind == "external":
        if run_dir is None:
            raise ValueError("launcher.kind 'external' needs the run directory")
        return ExternalLauncher(cfg, run_dir)
    return LocalLauncher(cfg.start)
