"""Redis Streams trajectory queue (``transport.kind: redis``).

Delivery semantics: :mod:`asyncrl.transport.base`.

Keys (one set per run; ``P = asyncrl:{<sha1(abs run_dir)[:12]>}``, the braces are a Redis
Cluster hash tag so every key of a run lives in one slot and Lua scripts may touch them all):

* ``P:stream`` - the stream; each entry has the fields ``id`` (group id) and ``data``
  (``records.encode(group)``, MessagePack; nothing is pickled). Consumer group ``trainers``.
* ``P:ids`` - HASH group id -> stream id of every queued (ready or leased) entry.
* ``P:entries`` - HASH stream id -> group id (lets ``ack`` find the id to release).
* ``P:counters`` - HASH of the queue-wide totals (shared by every process).
* ``P:dead`` - the dead-letter stream.

How the guarantees are met
--------------------------
* **Idempotent put, back-pressure.** One Lua script (atomic on the server) checks ``P:ids``,
  checks ``XLEN < capacity`` (acked entries are ``XDEL``'d, so ``XLEN`` = ready + leased) and
  ``XADD``\\ s. A full queue is polled with 5-20 ms sleeps.
* **Leases** are the consumer group's pending entries list (PEL). ``get_batch`` first
  ``XAUTOCLAIM``\\ s entries idle for at least ``lease_seconds`` (redelivery; ``attempts`` is
  the PEL delivery counter), then ``XREADGROUP ... >`` for new ones, blocking in short slices
  so expired leases are noticed while waiting. Idle times are measured by the server clock.
* **Ack** is a Lua script: ``XACK``; when that settled a pending entry, ``XDEL`` it and release
  its group id. Unknown or already-acked ids are ignored.
* **Poison entries** are moved by a Lua script to ``P:dead`` (with the reason) and
  ``XACK``'d + ``XDEL``'d, only if this handle's ``XACK`` settled them (no double counting). One
  that never went through ``put`` (bytes added with ``XADD`` from outside: no ``P:entries`` row) is also
  counted in ``dead_foreign_total`` (stat ``queue/dead_letters_foreign``), so that the run's
  accounting (accepted = trained + dropped + queued + dead-lettered) does not subtract it.
* **Reconnects.** Every command runs under the one Redis retry policy of
  :func:`asyncrl.credentials.redis_retry` (redis-py's ``Retry``, ~5 s of jittered back-off) on
  connection errors and timeouts. Retrying is safe: put is idempotent, ack is idempotent,
  and a lost ``XREADGROUP`` reply only leaves entries leased until their lease expires.
* **Durability** is the server's: ``put`` returns ``True`` once Redis executed the write. Run
  Redis with ``appendonly yes`` (``appendfsync everysec`` loses at most ~1 s on a server
  crash; ``always`` loses nothing) to survive a Redis restart.
* **Connection.** ``redis_url`` carries everything (password, ACL user, database, TLS):
  :mod:`asyncrl.credentials`, ``docs/transport.md``.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import redis

from asyncrl.credentials import key_prefix, mask_secrets, open_redis, redis_text, with_retries
from asyncrl.telemetry.reports import QueueStats
from asyncrl.transport.base import (
    DeadLetter,
    Delivery,
    QueueClosedError,
    TrajectoryQueue,
    check_batch_args,
    leased_group,
    stats_of,
)

T = TypeVar("T")

GROUP = "trainers"
"""The consumer group every handle reads through."""

_BLOCK_SLICE_S = 0.1
"""Longest single ``XREADGROUP BLOCK``: expired leases are re-checked at least this often."""
_ACK_CHUNK = 500
_STATS_SCAN_MAX = 100_000
_ENTRY_ID = re.compile(r"^\d+(-\d+)?$")

# KEYS: stream ids entries counters; ARGV: group_id payload capacity members
# returns 1: already queued, 0: full, else the new stream id
_PUT_LUA = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 1 end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
local id = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'n', ARGV[4], 'data', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], id)
redis.call('HSET', KEYS[3], id, ARGV[1])
redis.call('HINCRBY', KEYS[4], 'put_total', 1)
redis.call('HINCRBY', KEYS[4], 'samples_in', tonumber(ARGV[4]))
redis.call('HINCRBY', KEYS[4], 'bytes_in', string.len(ARGV[2]))
return id
"""

# KEYS: stream ids entries counters; ARGV: group, entry ids...; returns the number settled
_ACK_LUA = """
local n = 0
local samples = 0
for i = 2, #ARGV do
  local e = ARGV[i]
  if redis.call('XACK', KEYS[1], ARGV[1], e) == 1 then
    local row = redis.call('XRANGE', KEYS[1], e, e)
    if row[1] then
      local f = row[1][2]
      for j = 1, #f, 2 do if f[j] == 'n' then samples = samples + tonumber(f[j + 1]) end end
    end
    redis.call('XDEL', KEYS[1], e)
    local tid = redis.call('HGET', KEYS[3], e)
    redis.call('HDEL', KEYS[3], e)
    if tid and redis.call('HGET', KEYS[2], tid) == e then redis.call('HDEL', KEYS[2], tid) end
    n = n + 1
  end
end
if n > 0 then redis.call('HINCRBY', KEYS[4], 'acked_total', n) end
if samples > 0 then redis.call('HINCRBY', KEYS[4], 'samples_acked', samples) end
return n
"""

# KEYS: stream ids entries counters dead; ARGV: group entry_id group_id reason payload attempts dead_at members
_DEAD_LUA = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('XADD', KEYS[5], '*', 'entry_id', ARGV[2], 'group_id', ARGV[3], 'reason', ARGV[4],
           'payload', ARGV[5], 'attempts', ARGV[6], 'dead_at', ARGV[7])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('HDEL', KEYS[3], ARGV[2]) == 0 then
  redis.call('HINCRBY', KEYS[4], 'dead_foreign_total', 1)  -- written by XADD from outside, never put
else
  redis.call('HINCRBY', KEYS[4], 'samples_dead', tonumber(ARGV[8]))
end
if redis.call('HGET', KEYS[2], ARGV[3]) == ARGV[2] then redis.call('HDEL', KEYS[2], ARGV[3]) end
redis.call('HINCRBY', KEYS[4], 'dead_lettered_total', 1)
return 1
"""

# KEYS: stream counters dead; ARGV: group lease_ms scan_max
# returns {xlen, pending, expired, dead, counters...}
_STATS_LUA = """
local len = redis.call('XLEN', KEYS[1])
local summary = redis.call('XPENDING', KEYS[1], ARGV[1])
local pending = tonumber(summary[1])
local expired = 0
if pending > 0 then
  local n = math.min(pending, tonumber(ARGV[3]))
  expired = #redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[2], '-', '+', n)
end
return {len, pending, expired, redis.call('XLEN', KEYS[3]), redis.call('HGETALL', KEYS[2])}
"""


class RedisQueue(TrajectoryQueue):
    """The Redis-Streams-backed :class:`TrajectoryQueue` (``transport.kind: redis``)."""

    def __init__(
        self,
        url: str,
        run_dir: str | Path,
        *,
        capacity: int,
        lease_seconds: float,
        socket_timeout_s: float,
        prefix: str | None = None,
    ) -> None:
        super().__init__(capacity, lease_seconds)
        self.url = url
        self.prefix = prefix if prefix is not None else key_prefix(run_dir)
        self.stream_key = f"{self.prefix}:stream"
        self.ids_key = f"{self.prefix}:ids"
        self.entries_key = f"{self.prefix}:entries"
        self.counters_key = f"{self.prefix}:counters"
        self.dead_key = f"{self.prefix}:dead"
        self._lease_ms = max(1, int(self.lease_seconds * 1000))
        self._lock = threading.Lock()
        self._closed = False
        # from_url takes password, username, db and TLS (rediss://) from the URL; the client carries the
        # one retry policy and rides through a Redis restart at start-up too
        self._r: redis.Redis | None = open_redis(
            url, "transport.redis_url", socket_timeout_s=max(socket_timeout_s, _BLOCK_SLICE_S + 5.0)
        )
        self._put_script = self._r.register_script(_PUT_LUA)
        self._ack_script = self._r.register_script(_ACK_LUA)
        self._dead_script = self._r.register_script(_DEAD_LUA)
        self._stats_script = self._r.register_script(_STATS_LUA)
        self._ensure_group()

    # ---- plumbing ----------------------------------------------------------------------
    def _client(self) -> redis.Redis:
        if self._closed or self._r is None:
            raise QueueClosedError(f"queue {self.prefix} on {mask_secrets(self.url)} is closed")
        return self._r

    def _ensure_group(self) -> None:
        def create() -> None:
            try:
                self._client().xgroup_create(self.stream_key, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        with_retries(create)

    def _call(self, fn: Callable[[Any], Any]) -> Any:
        """One command (or pipeline/script) with reconnect back-off; recreates a lost group.

        (Typed ``Any``: redis-py's reply types are a union over its sync/async clients.)
        """

        def run() -> Any:
            try:
                return fn(self._client())
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._ensure_group()
                return fn(self._client())

        return with_retries(run)

    # ---- producer ----------------------------------------------------------------------
    def _try_put(self, group_id: str, payload: bytes, members: int) -> bool:
        keys = [self.stream_key, self.ids_key, self.entries_key, self.counters_key]
        args = [group_id, payload, self.capacity, members]
        result = self._call(lambda r: self._put_script(keys=keys, args=args))
        return bool(result != 0)

    # ---- consumer ----------------------------------------------------------------------
    def get_batch(self, max_items: int, timeout: float = 0.0, consumer: str = "trainer") -> list[Delivery]:
        check_batch_args(max_items, timeout)
        deadline = time.monotonic() + timeout
        while True:
            out = self._reclaim(max_items, consumer)
            if len(out) < max_items:
                block_s = 0.0 if out else min(_BLOCK_SLICE_S, max(0.0, deadline - time.monotonic()))
                out.extend(self._read_new(max_items - len(out), consumer, block_s))
            if out or time.monotonic() >= deadline:
                return out
            # Nothing (or only poison, now dead-lettered): look again until the deadline.

    def _reclaim(self, max_items: int, consumer: str) -> list[Delivery]:
        """Claim entries whose lease expired (redelivery), at most ``max_items``."""
        claimed: list[tuple[bytes, dict[bytes, bytes]]] = []
        cursor: Any = "0-0"
        while len(claimed) < max_items:
            count = max_items - len(claimed)
            reply = self._call(
                functools.partial(self._xautoclaim, consumer=consumer, start=cursor, count=count)
            )
            cursor = reply[0]
            claimed.extend((eid, fields) for eid, fields in reply[1] if fields is not None)
            if redis_text(cursor) == "0-0":
                break
        if not claimed:
            return []

        def counts(r: redis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for eid, _ in claimed:
                pipe.xpending_range(self.stream_key, GROUP, min=eid, max=eid, count=1)
            return pipe.execute()

        attempts = [int(rows[0]["times_delivered"]) if rows else 2 for rows in self._call(counts)]
        out = self._decode(claimed, attempts, consumer)
        redelivered = len(out)
        if redelivered:
            self._call(lambda r: r.hincrby(self.counters_key, "redelivered_total", redelivered))
        return out

    def _xautoclaim(self, r: Any, *, consumer: str, start: Any, count: int) -> Any:
        return r.xautoclaim(self.stream_key, GROUP, consumer, self._lease_ms, start_id=start, count=count)

    def _read_new(self, n: int, consumer: str, block_s: float) -> list[Delivery]:
        block_ms = int(block_s * 1000)
        reply = self._call(
            lambda r: r.xreadgroup(
                GROUP, consumer, {self.stream_key: ">"}, count=n, block=block_ms if block_ms > 0 else None
            )
        )
        entries = [(eid, fields) for _, rows in (reply or []) for eid, fields in rows if fields is not None]
        return self._decode(entries, [1] * len(entries), consumer)

    def _decode(
        self, entries: list[tuple[bytes, dict[bytes, bytes]]], attempts: list[int], consumer: str
    ) -> list[Delivery]:
        out: list[Delivery] = []
        now = time.time()
        keys = [self.stream_key, self.ids_key, self.entries_key, self.counters_key, self.dead_key]
        for (raw_id, fields), tries in zip(entries, attempts, strict=True):
            entry_id = redis_text(raw_id)
            group_id = redis_text(fields.get(b"id", b""))
            payload = bytes(fields.get(b"data", b""))
            group = leased_group(payload, group_id, now)
            if isinstance(group, str):  # poison: a dead letter, with why
                members = redis_text(fields.get(b"n", b"0"))
                args: list[bytes | str | int] = [GROUP, entry_id, group_id, group, payload, tries, repr(now)]
                args.append(int(members) if members.isdigit() else 0)
                self._call(functools.partial(self._dead_script, keys, args))
                continue
            out.append(Delivery(entry_id=entry_id, group=group, attempts=tries))
        return out

    def _ack(self, ids: list[str]) -> None:
        for entry_id in ids:
            if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
                raise ValueError(f"{entry_id!r} is not an entry id of this queue")
        keys = [self.stream_key, self.ids_key, self.entries_key, self.counters_key]
        for i in range(0, len(ids), _ACK_CHUNK):
            chunk = ids[i : i + _ACK_CHUNK]
            self._call(functools.partial(self._ack_script, keys, [GROUP, *chunk]))

    # ---- introspection -----------------------------------------------------------------
    def depth(self) -> int:
        return int(self._call(lambda r: r.xlen(self.stream_key)))

    def stats(self) -> QueueStats:
        keys = [self.stream_key, self.counters_key, self.dead_key]
        length, pending, expired, dead, flat = self._call(
            lambda r: self._stats_script(keys=keys, args=[GROUP, self._lease_ms, _STATS_SCAN_MAX])
        )
        counters = {redis_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        leased = int(pending) - int(expired)
        return stats_of(int(length), int(length) - leased, int(dead), counters, self.capacity)

    def unacked_payloads(self) -> list[bytes]:
        rows = self._call(lambda r: r.xrange(self.stream_key, "-", "+"))
        return [bytes(f.get(b"data", b"")) for _, f in rows]

    def dead_letters(self) -> list[DeadLetter]:
        rows = self._call(lambda r: r.xrange(self.dead_key, "-", "+"))
        return [
            DeadLetter(
                entry_id=redis_text(f[b"entry_id"]),
                group_id=redis_text(f[b"group_id"]),
                reason=redis_text(f[b"reason"]),
                payload=bytes(f[b"payload"]),
                attempts=int(f[b"attempts"]),
                dead_at=float(f[b"dead_at"]),
            )
            for _, f in rows
        ]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            r, self._r = self._r, None
            if r is not None:
                # Idle connections only: a command still in flight on another thread finishes
                # normally (its connection is closed when the pool is garbage-collected).
                r.connection_pool.disconnect(inuse_connections=False)

    def __repr__(self) -> str:
        return (
            f"RedisQueue({mask_secrets(self.url)!r}, prefix={self.prefix!r}, capacity={self.capacity}, "
            f"lease_seconds={self.lease_seconds})"
        )
