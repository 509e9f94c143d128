"""The launcher interface: start named role processes, report whether they are alive, stop them.

The orchestrator decides what to restart; a launcher only places processes. Backends, chosen by
``launcher.kind`` in :func:`asyncrl.launch.make_launcher`: :class:`~asyncrl.launch.local.LocalLauncher`
(``local``: ``multiprocessing`` with spawn on this machine), :class:`~asyncrl.launch.ray_launcher.RayLauncher`
(``ray``: the same methods with Ray actors) and :class:`~asyncrl.launch.external.ExternalLauncher`
(``external``: launches nothing, the roles run as services started with ``asyncrl role ...``).
What every role process does first is :func:`asyncrl.bootstrap.init_role_process`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


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
