"""``control``: the shared run state and its rules (:mod:`asyncrl.control`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag, model_validator

from asyncrl.config.base import RedisUrl, Section, kind_of


class _StateBase(Section):
    """Where the orchestrator's state lives (counters, ledger, documents; restored on --resume)."""

    kind: str = "sqlite"
    """``sqlite``: ``run_dir/control.sqlite`` (embedded, survives a crash of any role); ``redis``: the same
    counters, ledger and documents in Redis (``redis_url``), so roles on several machines need no shared
    SQLite file."""
    snapshot_every_s: float = Field(1.0, gt=0, le=3600)
    """Seconds between snapshots of the orchestrator's rule states into the store."""


class SQLiteStateConfig(_StateBase):
    """``run_dir/control.sqlite``."""

    kind: Literal["sqlite"] = "sqlite"
    busy_timeout_s: float = Field(30.0, gt=0, le=3600)
    """How long a role waits for another's write lock on ``control.sqlite`` before the call fails
    (SQLite's busy timeout)."""


class RedisStateConfig(_StateBase):
    """The run's state in Redis."""

    kind: Literal["redis"] = "redis"
    redis_url: RedisUrl | None = None
    """The Redis server (same URL rules as transport.redis_url; masked in the run directory, a masked or
    absent password is read from $ASYNCRL_REDIS_PASSWORD). Required."""
    prefix: str | None = None
    """Key prefix of this run's state; unset: ``asyncrl:{<hash of the run directory>}:state`` (set it when
    the roles see the run directory under different absolute paths)."""
    socket_timeout_s: float = Field(30.0, gt=0, le=3600)
    """A state call without an answer for this long fails and is retried under the one retry policy."""

    @model_validator(mode="after")
    def _check(self) -> RedisStateConfig:
        if not self.redis_url:
            raise ValueError(
                "control.state.kind=redis needs control.state.redis_url, e.g. redis://127.0.0.1:6379/0"
            )
        if self.prefix is not None and not self.prefix.strip():
            raise ValueError("control.state.prefix must not be empty (unset it for the default)")
        return self


StateStoreConfig: TypeAlias = Annotated[
    Annotated[SQLiteStateConfig, Tag("sqlite")] | Annotated[RedisStateConfig, Tag("redis")],
    Discriminator(kind_of("sqlite")),
]
"""``control.state``: one model per ``kind``."""


class ControlConfig(Section):
    """The shared run state and the rules every role applies through it (:mod:`asyncrl.control`): the
    staleness bound (:class:`~asyncrl.control.StalenessPolicy`, enforced by admission in
    :class:`~asyncrl.control.RunState`), where the state lives, and how workers read the orchestrator's
    directives and balance their load (:class:`~asyncrl.control.WorkerControl`)."""

    mode: Literal["async", "one_step_off", "sync"] = "async"
    """``sync``: generate one batch, train, publish; ``one_step_off``: overlap one batch;
    ``async``: fully asynchronous within ``max_staleness``."""
    max_staleness: int = Field(2, ge=0, le=1000)
    """The staleness bound: the largest allowed age (trainer version minus the version of its oldest
    token) of a trained sample. The orchestrator may lower it for a while (``orchestrator.governor``)."""
    stale_policy: Literal["drop", "downweight"] = "drop"
    """What happens to a sample older than ``max_staleness``."""
    state: StateStoreConfig = Field(default_factory=SQLiteStateConfig)
    balance: bool = True
    """Admit a group only on a worker whose in-flight load (remaining episode steps) is within one
    group of the least-loaded worker's."""
    refresh_s: float = Field(0.5, gt=0, le=60)
    """Seconds between a rollout worker's reads of the orchestrator's directives (curriculum weights,
    breakers, exploration, retirement)."""
    heartbeat_s: float = Field(5.0, gt=0, le=3600)
    """Load balancing counts only workers whose load heartbeat is at most this old (a dead worker's load
    stops counting after it)."""
