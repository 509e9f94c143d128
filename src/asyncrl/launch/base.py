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


class Launcher(ABC):
    @abstractmethod
    def start(self, name: str, target: Callable[..., None], *args: object) -> None: ...

    @abstractmethod
    def exitcode(self, name: str) -> int | None:
        """None while running; the exit code once it has ended (negative: killed by a signal)."""

    @abstractmethod
    def pid(self, name: str) -> int | None: ...

    @abstractmethod
    def stop(self, name: str, timeout: float) -> None: ...

    @abstractmethod
    def names(self) -> list[str]: ...

    def start_group(
        self, names: list[str], target: Callable[..., None], args: tuple[object, ...], port: int
    ) -> None:
        """Start the ranks of one torch.distributed group: ``names[r]`` runs ``target(*args, r, host,
        port)``, where rank 0 listens on ``host:port`` for the rendezvous (``port`` 0: a free one).

        Here: every rank on this machine, rank 0 on the loopback address. A launcher that places
        processes on other machines overrides it (rank 0's address is only known once it is placed).
        """
        port = port or free_port(LOOPBACK)
        for rank, name in enumerate(names):
            self.start(name, target, *args, rank, LOOPBACK, port)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the launcher itself holds (e.g. a cluster it started); after every stop()."""


LOOPBACK = "127.0.0.1"


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (a trainer group's rendezvous with ``trainer.dist_port: 0``)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
