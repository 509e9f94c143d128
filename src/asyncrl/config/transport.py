"""``transport``: the trajectory queue (:mod:`asyncrl.transport`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag

from asyncrl.config.base import RedisUrl, Section, kind_of


class _TransportBase(Section):
    """The trajectory queue between rollout workers and the trainer."""

    kind: str = "embedded"
    """``embedded``: durable SQLite queue in the run directory, no server; ``redis``: Redis Streams."""
    capacity: int = Field(1024, ge=1, le=10_000_000)
    """Unacknowledged entries — whole groups — at most; producers block beyond it (back-pressure)."""
    lease_seconds: float = Field(60.0, gt=0, le=86400)
    """A taken but unacknowledged entry is redelivered after this long."""


class EmbeddedTransportConfig(_TransportBase):
    """A durable SQLite queue in the run directory."""

    kind: Literal["embedded"] = "embedded"
    busy_timeout_s: float = Field(30.0, gt=0, le=3600)
    """How long a process waits for another's write lock on the SQLite queue before the call fails
    (SQLite's busy timeout)."""


class RedisTransportConfig(_TransportBase):
    """Redis Streams."""

    kind: Literal["redis"] = "redis"
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0"
    """Redis server: ``redis://[:PASSWORD@]host:port/db``, ``rediss://`` for TLS. Written to the
    run directory masked; a masked or absent password is read from $ASYNCRL_REDIS_PASSWORD."""
    socket_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A Redis call without an answer for this long fails and is retried under the one retry policy
    (never below the blocking read's slice + 5 s)."""


TransportConfig: TypeAlias = Annotated[
    Annotated[EmbeddedTransportConfig, Tag("embedded")] | Annotated[RedisTransportConfig, Tag("redis")],
    Discriminator(kind_of("embedded")),
]
"""``transport``: one model per ``kind``."""
