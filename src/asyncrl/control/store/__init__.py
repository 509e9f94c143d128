"""Shared control-plane state of a run: counters, flags, the trained/dropped ledger and documents.

The interface and what it holds: :mod:`asyncrl.control.store.base`; backends:
:mod:`asyncrl.control.store.sqlite` (the embedded default) and
:mod:`asyncrl.control.store.redis_backend` (imported only when ``control.state.kind: redis``
is used); :func:`make_state_store` picks one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.control.store.base import StateStore
from asyncrl.control.store.sqlite import SQLiteStateStore
from asyncrl.errors import UserError

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

__all__ = ["SQLiteStateStore", "StateStore", "make_state_store"]


def make_state_store(cfg: RunConfig, run_dir: str | Path) -> StateStore:
    """The run's state store, by ``control.state.kind`` (``sqlite``: ``run_dir/control.sqlite``;
    ``redis``: :class:`~asyncrl.control.store.redis_backend.RedisStateStore` at
    ``control.state.redis_url``)."""
    sc = cfg.control.state
    if sc.kind == "redis":
        from asyncrl.control.store.redis_backend import RedisStateStore  # lazy: sqlite users skip redis

        if not sc.redis_url:
            raise UserError("control.state.kind=redis needs control.state.redis_url")
        return RedisStateStore(sc.redis_url, run_dir, prefix=sc.prefix, socket_timeout_s=sc.socket_timeout_s)
    return SQLiteStateStore(Path(run_dir) / "control.sqlite", busy_timeout_s=sc.busy_timeout_s)
