"""The embedded state store (``control.state.kind: sqlite``): one SQLite file, ``run_dir/control.sqlite``.

WAL mode makes it safe across processes: every role process opens its own connection. Each
method is one transaction; the semantics are :class:`~asyncrl.control.store.base.StateStore`'s.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from asyncrl.config import SQLiteStateConfig, default_of
from asyncrl.control.store.base import StateStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS flags (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    traj_id TEXT PRIMARY KEY, fate TEXT NOT NULL, step INTEGER NOT NULL, age INTEGER NOT NULL,
    at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS docs (name TEXT PRIMARY KEY, body TEXT NOT NULL, at REAL NOT NULL);
"""


class SQLiteStateStore(StateStore):
    """Cross-process counters, flags, ledger and documents for one run (see :mod:`asyncrl.control.store.base`)."""

    def __init__(
        self, path: str | Path, busy_timeout_s: float = default_of(SQLiteStateConfig, "busy_timeout_s")
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    # -- counters ---------------------------------------------------------------------------
    def get(self, name: str, default: int = 0) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name=?", (name,)).fetchone()
        return int(row[0]) if row else default

    _UPSERT = "INSERT INTO {}(name, value) VALUES(?, ?) ON CONFLICT(name) DO UPDATE SET value=excluded.value"

    def set_value(self, name: str, value: int) -> None:
        with self._lock:
            self._db.execute(self._UPSERT.format("counters"), (name, int(value)))

    def add(self, name: str, delta: int) -> int:
        value = self._transact(name, delta, lambda _: True)
        assert value is not None
        return value

    def try_add_within(self, name: str, delta: int, limit_fn: Callable[[dict[str, int]], int]) -> bool:
        """``limit_fn`` reads the counters inside the same write transaction: two workers can never both
        take the last admission slot."""
        return (
            self._transact(name, delta, lambda c: c.get(name, 0) + int(delta) <= int(limit_fn(c))) is not None
        )

    def _transact(self, name: str, delta: int, allowed: Callable[[dict[str, int]], bool]) -> int | None:
        """Add ``delta`` to ``name`` if ``allowed(counters)``, in one write transaction; the new value or None."""
        with self._write():
            counters = {str(k): int(v) for k, v in self._db.execute("SELECT name, value FROM counters")}
            if not allowed(counters):
                return None
            value = counters.get(name, 0) + int(delta)
            self._db.execute(self._UPSERT.format("counters"), (name, value))
            return value

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A ``BEGIN IMMEDIATE`` transaction under the lock, committed on success, rolled back on error."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            with self._db:  # COMMIT, or ROLLBACK on an error
                yield

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {str(k): int(v) for k, v in self._db.execute("SELECT name, value FROM counters")}

    # -- flags ------------------------------------------------------------------------------
    def flag(self, name: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT value FROM flags WHERE name=?", (name,)).fetchone()
        return bool(row and row[0])

    def set_flag(self, name: str, value: bool) -> None:
        with self._lock:
            self._db.execute(self._UPSERT.format("flags"), (name, int(value)))

    # -- ledger -----------------------------------------------------------------------------
    def record(self, rows: Iterable[tuple[str, str, int, int]]) -> int:
        dup = 0
        now = time.time()
        with self._write():
            for traj_id, fate, step, age in rows:
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO ledger(traj_id, fate, step, age, at) VALUES(?, ?, ?, ?, ?)",
                    (traj_id, fate, step, age, now),
                )
                dup += cur.rowcount == 0
            if dup:
                self._db.execute(
                    "INSERT INTO counters(name, value) VALUES('duplicates', ?) "
                    "ON CONFLICT(name) DO UPDATE SET value=value+excluded.value",
                    (dup,),
                )
        return dup

    def ledger_ids(self) -> set[str]:
        with self._lock:
            return {str(r[0]) for r in self._db.execute("SELECT traj_id FROM ledger")}

    def ledger_counts(self) -> dict[str, int]:
        with self._lock:
            return {
                str(f): int(n) for f, n in self._db.execute("SELECT fate, COUNT(*) FROM ledger GROUP BY fate")
            }

    def ages(self) -> list[int]:
        with self._lock:
            return [int(r[0]) for r in self._db.execute("SELECT age FROM ledger WHERE fate='trained'")]

    # -- documents --------------------------------------------------------------------------
    def put_doc(self, name: str, doc: dict[str, Any]) -> None:
        body = json.dumps(doc, sort_keys=True)
        with self._lock:
            self._db.execute(
                "INSERT INTO docs(name, body, at) VALUES(?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET body=excluded.body, at=excluded.at",
                (name, body, time.time()),
            )

    def get_doc(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM docs WHERE name=?", (name,)).fetchone()
        if row is None:
            return None
        doc = json.loads(row[0])
        return doc if isinstance(doc, dict) else None

    def close(self) -> None:
        with self._lock:
            self._db.close()
