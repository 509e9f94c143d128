"""The trajectory bus from rollout workers to the trainer: semantics in :mod:`asyncrl.transport.base`,
backends :mod:`asyncrl.transport.embedded` and :mod:`asyncrl.transport.redis_backend`, all in
``docs/transport.md``; :func:`make_queue` picks one by ``transport.kind``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.transport.base import BackendUnavailableError, QueueClosedError, TrajectoryQueue
from asyncrl.transport.embedded import EmbeddedQueue
from asyncrl.transport.redis_backend import RedisQueue  # lazy: embedded users skip redis

if TYPE_CHECKING:  # importing the config pulls in torch; keep worker start-up light
    from asyncrl.config import TransportConfig

QUEUE_FILENAME = "queue.sqlite"

__all__ = [
    "QUEUE_FILENAME",
    "BackendUnavailableError",
    "EmbeddedQueue",
    "QueueClosedError",
    "TrajectoryQueue",
    "make_queue",
]


def make_queue(cfg: TransportConfig, run_dir: Path) -> TrajectoryQueue:
    """Open (creating if needed) the run's trajectory queue; every process calls this itself."""
    if cfg.kind == "embedded":
        return EmbeddedQueue(
            Path(run_dir) / QUEUE_FILENAME,
            capacity=cfg.capacity,
            lease_seconds=cfg.lease_seconds,
            busy_timeout_s=cfg.busy_timeout_s,
        )
    if cfg.kind == "redis":
        return RedisQueue(
            cfg.redis_url,
            run_dir,
            capacity=cfg.capacity,
            lease_seconds=cfg.lease_seconds,
            socket_timeout_s=cfg.socket_timeout_s,
        )
    raise BackendUnavailableError(f"unknown transport.kind {cfg.kind!r}; use 'embedded' or 'redis'")
