"""Embedded, durable trajectory queue: one SQLite database in WAL mode, no server.

Several processes open ``run_dir/queue.sqlite`` at once, each with its own connection. Delivery
semantics: :mod:`asyncrl.transport.base` (an entry is one group, keyed by the group's id).

How the guarantees are met
--------------------------
* **Durability.** ``put`` returns ``True`` only after its transaction committed. In WAL mode
  with ``synchronous=NORMAL`` (the default) a committed transaction survives a crash of any
  process, including ``kill -9`` mid-transaction; the newest commits can be lost only on a
  power cut or kernel crash (the database is never corrupted). ``synchronous="FULL"`` also
  survives those, at one fsync per commit.
* **Exclusive leases.** Every state change runs in a ``BEGIN IMMEDIATE`` transaction, which
  takes SQLite's single write lock up front, so two consumers can never select and lease
  the same entry; waiting for the lock is bounded by ``busy_timeout``. Polling while the
  queue is empty or full is done with lock-free WAL reads, sleeping 5-20 ms between polls.
* **Leases** are a per-entry ``visible_at`` time: ``enqueue time`` for a fresh entry,
  ``lease time + lease_seconds`` for a leased one. An entry is ready iff
  ``visible_at <= now``, so an expired lease needs no sweeper. Times are wall-clock
  (``time.time()``), comparable across processes and restarts.
* **Idempotent put.** ``group_id`` is ``UNIQUE``; re-putting a queued id is a no-op.
* **Bounded disk.** Acked entries are deleted (their pages are reused by new entries).
* **Poison entries.** A stored payload that raises :class:`~asyncrl.records.RecordDecodeError`
  (or whose id disagrees with the row) is moved, in the same transaction, to the
  ``dead_letters`` table with the reason.
* **Threads.** A handle holds one connection guarded by a lock (sleeps happen outside it). A
  handle used in a forked child transparently opens a fresh connection.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from asyncrl.telemetry.reports import QueueStats
from asyncrl.transport.base import (
    COUNTERS,
    DeadLetter,
    Delivery,
    QueueClosedError,
    TrajectoryQueue,
    backoff_sleep,
    check_batch_args,
    leased_group,
    stats_of,
)

SCHEMA_VERSION = 2
"""Stored in ``PRAGMA user_version``; a database of another version is refused."""

Synchronous = Literal["NORMAL", "FULL"]

_ACK_CHUNK = 500
_SCHEMA: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS entries (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,  -- entry id (AUTOINCREMENT: never reused)
        group_id      TEXT    NOT NULL UNIQUE,
        state        TEXT    NOT NULL DEFAULT 'ready',   -- 'ready' | 'leased' (a leased entry whose
                                                         -- visible_at has passed is ready again)
        visible_at   REAL    NOT NULL,                   -- deliverable when visible_at <= now
        lease_owner  TEXT,
        attempts     INTEGER NOT NULL DEFAULT 0,
        enqueued_at  REAL    NOT NULL,
        nbytes       INTEGER NOT NULL,
        members      INTEGER NOT NULL DEFAULT 0          -- samples in the group (0: not put by put())
    )
    """,
    # Payloads live in their own table: leasing rewrites only the small entries row
    # (SQLite rewrites a whole record on UPDATE, large blobs included).
    """
    CREATE TABLE IF NOT EXISTS payloads (
        seq          INTEGER PRIMARY KEY,                -- = entries.seq
        data         BLOB    NOT NULL                    -- records.encode(group), msgpack
    )
    """,
    """
    CREATE INDEX IF NOT EXISTS entries_visible ON entries (visible_at)
    """,
    """
    CREATE TABLE IF NOT EXISTS dead_letters (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        entry_id     TEXT    NOT NULL,
        group_id      TEXT    NOT NULL,
        reason       TEXT    NOT NULL,
        payload      BLOB    NOT NULL,
        attempts     INTEGER NOT NULL,
        dead_at      REAL    NOT NULL,
        members      INTEGER NOT NULL DEFAULT 0
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS counters (
        name         TEXT    PRIMARY KEY,
        value        INTEGER NOT NULL
    )
    """,
)


class EmbeddedQueue(TrajectoryQueue):
    """The SQLite-backed :class:`TrajectoryQueue` (``transport.kind: embedded``)."""

    def __init__(
        self,
        path: str | Path,
        *,
        capacity: int,
        lease_seconds: float,
        busy_timeout_s: float,
        synchronous: Synchronous = "NORMAL",
    ) -> None:
        super().__init__(capacity, lease_seconds)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.path = Path(path)
        self.synchronous: Synchronous = synchronous
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.RLock()
        self._closed = False
        self._pid = os.getpid()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db: sqlite3.Connection | None = self._open()

    # ---- connection management ---------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.path}: could not switch the queue database to WAL (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("BEGIN IMMEDIATE")
            with conn:  # COMMIT, or ROLLBACK on an error
                version = conn.execute("PRAGMA user_version").fetchall()[0][0]
                if version not in (0, SCHEMA_VERSION):
                    raise RuntimeError(
                        f"{self.path}: queue schema version {version}, this asyncrl reads {SCHEMA_VERSION}"
                    )
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.executemany(
                    "INSERT OR IGNORE INTO counters (name, value) VALUES (?, 0)", [(c,) for c in COUNTERS]
                )
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        """This handle's connection (caller holds ``self._lock``)."""
        if self._closed:
            raise QueueClosedError(f"queue {self.path} is closed")
        if os.getpid() != self._pid:
            # Forked child: never use the parent's SQLite connection; abandon it unclosed.
            self._pid = os.getpid()
            self._db = self._open()
        assert self._db is not None
        return self._db

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction, committed on success, rolled back on error."""
        with self._lock:
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            with conn:  # COMMIT, or ROLLBACK on an error
                yield conn

    def _scalar(self, sql: str, params: Sequence[object] = ()) -> int:
        """An integer read (count, exists): lock-free in WAL, or in the caller's transaction (re-entrant lock)."""
        with self._lock:
            value = self._conn().execute(sql, params).fetchall()[0][0]
        assert isinstance(value, int), value
        return value

    @staticmethod
    def _bump(conn: sqlite3.Connection, name: str, by: int) -> None:
        if by:
            conn.execute("UPDATE counters SET value = value + ? WHERE name = ?", (by, name))

    # ---- producer ----------------------------------------------------------------------
    def _try_put(self, group_id: str, payload: bytes, members: int) -> bool:
        # Cheap lock-free check first, so blocked producers never hold the write lock.
        full = self._scalar("SELECT count(*) FROM entries") >= self.capacity
        if full:
            return bool(self._scalar("SELECT count(*) FROM entries WHERE group_id = ?", (group_id,)))
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM entries WHERE group_id = ?", (group_id,)).fetchall():
                return True
            if conn.execute("SELECT count(*) FROM entries").fetchone()[0] >= self.capacity:  # under the lock
                return False
            now = time.time()
            cur = conn.execute(
                "INSERT INTO entries (group_id, visible_at, enqueued_at, nbytes, members) VALUES (?, ?, ?, ?, ?)",
                (group_id, now, now, len(payload), members),
            )
            conn.execute("INSERT INTO payloads (seq, data) VALUES (?, ?)", (cur.lastrowid, payload))
            self._bump(conn, "put_total", 1)
            self._bump(conn, "samples_in", members)
            self._bump(conn, "bytes_in", len(payload))
            return True

    # ---- consumer ----------------------------------------------------------------------
    def get_batch(self, max_items: int, timeout: float = 0.0, consumer: str = "trainer") -> list[Delivery]:
        check_batch_args(max_items, timeout)
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            if self._scalar(
                "SELECT count(*) FROM (SELECT 1 FROM entries WHERE visible_at <= ? LIMIT 1)", (time.time(),)
            ):
                out = self._lease(max_items, consumer)
                if out:
                    return out
                # Everything visible was poison (now dead-lettered) or a rival took it: poll again.
            if time.monotonic() >= deadline:
                return []
            backoff_sleep(attempt, deadline)
            attempt += 1

    def _lease(self, max_items: int, consumer: str) -> list[Delivery]:
        out: list[Delivery] = []
        with self._write() as conn:
            now = time.time()
            rows = conn.execute(
                "SELECT e.seq, e.group_id, p.data, e.attempts, e.members FROM entries AS e "
                "LEFT JOIN payloads AS p ON p.seq = e.seq "
                "WHERE e.visible_at <= ? ORDER BY e.visible_at, e.seq LIMIT ?",
                (now, max_items),
            ).fetchall()
            leased: list[tuple[float, str, int]] = []
            redelivered = 0
            for seq, group_id, payload, attempts, members in rows:
                payload = b"" if payload is None else bytes(payload)
                group = leased_group(payload, group_id, now)
                if isinstance(group, str):
                    conn.execute(
                        "INSERT INTO dead_letters (entry_id, group_id, reason, payload, attempts, dead_at, members) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (str(seq), group_id, group, payload, attempts + 1, now, members),
                    )
                    self._bump(conn, "samples_dead", members)
                    conn.execute("DELETE FROM entries WHERE seq = ?", (seq,))
                    conn.execute("DELETE FROM payloads WHERE seq = ?", (seq,))
                    continue
                redelivered += attempts > 0
                leased.append((now + self.lease_seconds, consumer, seq))
                out.append(Delivery(entry_id=str(seq), group=group, attempts=attempts + 1))
            conn.executemany(
                "UPDATE entries SET state = 'leased', visible_at = ?, lease_owner = ?, "
                "attempts = attempts + 1 WHERE seq = ?",
                leased,
            )
            self._bump(conn, "redelivered_total", redelivered)
        return out

    def _ack(self, entry_ids: list[str]) -> None:
        seqs: list[int] = []
        for entry_id in entry_ids:
            try:
                seqs.append(int(entry_id))
            except (TypeError, ValueError):
                raise ValueError(f"{entry_id!r} is not an entry id of this queue") from None
        with self._write() as conn:
            acked = samples = 0
            for i in range(0, len(seqs), _ACK_CHUNK):
                chunk = seqs[i : i + _ACK_CHUNK]
                marks = ",".join("?" * len(chunk))
                # (no DELETE ... RETURNING: it needs SQLite >= 3.35)
                gone = conn.execute(
                    f"SELECT seq, members FROM entries WHERE state = 'leased' AND seq IN ({marks})", chunk
                ).fetchall()
                conn.executemany("DELETE FROM entries WHERE seq = ?", [(seq,) for seq, _ in gone])
                conn.executemany("DELETE FROM payloads WHERE seq = ?", [(seq,) for seq, _ in gone])
                acked += len(gone)
                samples += sum(int(n) for _, n in gone)
            self._bump(conn, "acked_total", acked)
            self._bump(conn, "samples_acked", samples)

    # ---- introspection -----------------------------------------------------------------
    def depth(self) -> int:
        return self._scalar("SELECT count(*) FROM entries")

    def stats(self) -> QueueStats:
        with self._lock:
            conn = self._conn()
            conn.execute("BEGIN")  # one consistent snapshot for all numbers
            try:
                depth = self._scalar("SELECT count(*) FROM entries")
                ready = self._scalar("SELECT count(*) FROM entries WHERE visible_at <= ?", (time.time(),))
                dead = self._scalar("SELECT count(*) FROM dead_letters")
                counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
            finally:
                conn.execute("COMMIT")
        return stats_of(depth, ready, dead, counters, self.capacity)

    def unacked_payloads(self) -> list[bytes]:
        with self._lock:
            rows = self._conn().execute("SELECT data FROM payloads ORDER BY seq").fetchall()
        return [bytes(data) for (data,) in rows]

    def dead_letters(self) -> list[DeadLetter]:
        with self._lock:
            rows = (
                self._conn()
                .execute(
                    "SELECT entry_id, group_id, reason, payload, attempts, dead_at FROM dead_letters ORDER BY id"
                )
                .fetchall()
            )
        return [
            DeadLetter(str(entry), str(group), str(reason), bytes(payload), int(attempts), float(dead_at))
            for entry, group, reason, payload, attempts, dead_at in rows
        ]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            db, self._db = self._db, None
            if db is not None and os.getpid() == self._pid:
                db.close()

    def __repr__(self) -> str:
        return (
            f"EmbeddedQueue({str(self.path)!r}, capacity={self.capacity}, "
            f"lease_seconds={self.lease_seconds}, synchronous={self.synchronous!r})"
        )
