"""Orchestrator state in Redis (``control.state.kind: redis``): the :class:`StateStore` of a run
whose roles live on several machines, so that no SQLite file on a shared filesystem is needed.

Same semantics as :class:`~asyncrl.control.store.sqlite.SQLiteStateStore`. Keys (one set per run,
``P`` = ``control.state.prefix`` or ``asyncrl:{<sha1(abs run_dir)[:12]>}:state``):

* ``P:counters`` - HASH name -> integer; ``P:flags`` - HASH name -> 0/1.
* ``P:ledger`` - HASH trajectory id -> JSON ``{"fate", "step", "age", "at", "op"}``;
  ``P:fates`` - HASH fate -> rows with that fate; ``P:ages`` - LIST of the ``age`` of every
  ``trained`` row (the staleness histogram).
* ``P:docs`` - HASH name -> JSON document (replaced whole by one HSET: atomic).
* ``P:op:<token>`` - short-lived (1 h) receipts of counter updates, see *retries* below.

Guarantees
----------
* **Atomic counters.** ``add`` is one ``HINCRBY``. ``try_add_within`` is optimistic
  concurrency: ``WATCH P:counters``, read every counter, evaluate ``limit_fn`` in Python,
  then ``MULTI / HINCRBY / EXEC``; when another process changed any counter in between, ``EXEC``
  fails and the whole check is redone. So two processes can never both take the last slot.
* **Idempotent ledger.** ``record`` is one Lua script (atomic on the server): ``HSETNX`` per id;
  an id already present is counted as a duplicate (added to counter ``duplicates`` and returned),
  exactly like SQLite's ``INSERT OR IGNORE`` + primary key.
* **Retries.** Every call runs under the one Redis retry policy
  (:func:`asyncrl.credentials.with_retries`: ~5 s of retries on connection errors and timeouts). A write whose reply was lost may be retried, so writes carry a fresh operation
  token: ``add`` / ``try_add_within`` store a receipt under ``P:op:<token>`` in the same
  transaction and a retry that finds it returns the recorded result instead of applying the
  delta again; a ledger row written by the same ``record`` call (same token) is not a duplicate.
* **Connection.** The URL rules of :mod:`asyncrl.credentials` (masked password from
  ``$ASYNCRL_REDIS_PASSWORD``, TLS with ``rediss://``); opening pings with the same back-off, then
  fails with a :class:`~asyncrl.errors.UserError` naming ``control.state.redis_url`` (URL masked).
  Entry points (``asyncrl train``, ``asyncrl role``) check it before any work.
* **No pickle.** Values are integers and JSON text; documents must be JSON objects.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis

from asyncrl.config import RedisStateConfig, default_of
from asyncrl.control.store.base import StateStore
from asyncrl.credentials import key_prefix, open_redis, redis_text, with_retries

_OP_TTL_S = 3600
"""Seconds a counter update's receipt is kept (far longer than any retry)."""

# KEYS: ledger fates ages counters; ARGV: op now (traj_id fate step age)...; returns duplicates
_RECORD_LUA = """
local dup = 0
for i = 3, #ARGV, 4 do
  local tid, fate = ARGV[i], ARGV[i + 1]
  local row = cjson.encode({fate = fate, step = tonumber(ARGV[i + 2]), age = tonumber(ARGV[i + 3]),
                            at = tonumber(ARGV[2]), op = ARGV[1]})
  if redis.call('HSETNX', KEYS[1], tid, row) == 1 then
    redis.call('HINCRBY', KEYS[2], fate, 1)
    if fate == 'trained' then redis.call('RPUSH', KEYS[3], ARGV[i + 3]) end
  else
    local old = cjson.decode(redis.call('HGET', KEYS[1], tid))
    if old['op'] ~= ARGV[1] then dup = dup + 1 end
  end
end
if dup > 0 then redis.call('HINCRBY', KEYS[4], 'duplicates', dup) end
return dup
"""

# KEYS: counters receipt; ARGV: name delta ttl; returns the new value (once per receipt)
_ADD_LUA = """
local done = redis.call('GET', KEYS[2])
if done then return tonumber(done) end
local v = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], v, 'EX', ARGV[3])
return v
"""


class RedisStateStore(StateStore):
    """Counters, flags, ledger and documents of one run in Redis (see the module docstring)."""

    def __init__(
        self,
        url: str,
        run_dir: str | Path,
        *,
        prefix: str | None = None,
        socket_timeout_s: float = default_of(RedisStateConfig, "socket_timeout_s"),
    ) -> None:
        self.prefix = prefix or f"{key_prefix(run_dir)}:state"
        self._counters = f"{self.prefix}:counters"
        self._flags = f"{self.prefix}:flags"
        self._ledger = f"{self.prefix}:ledger"
        self._fates = f"{self.prefix}:fates"
        self._ages = f"{self.prefix}:ages"
        self._docs = f"{self.prefix}:docs"
        # a role (re)started during a Redis restart rides through it, like every Redis client
        self._r: redis.Redis = open_redis(url, "control.state.redis_url", socket_timeout_s=socket_timeout_s)
        self._record_script = self._r.register_script(_RECORD_LUA)
        self._add_script = self._r.register_script(_ADD_LUA)

    def _receipt(self) -> str:
        return f"{self.prefix}:op:{uuid.uuid4().hex}"

    # -- counters ---------------------------------------------------------------------------
    def get(self, name: str, default: int = 0) -> int:
        value = with_retries(lambda: self._r.hget(self._counters, name))
        return int(value) if value is not None else default

    def set_value(self, name: str, value: int) -> None:
        with_retries(lambda: self._r.hset(self._counters, name, int(value)))

    def add(self, name: str, delta: int) -> int:
        keys = [self._counters, self._receipt()]
        return int(with_retries(lambda: self._add_script(keys=keys, args=[name, int(delta), _OP_TTL_S])))

    def try_add_within(self, name: str, delta: int, limit_fn: Callable[[dict[str, int]], int]) -> bool:
        receipt = self._receipt()

        def attempt() -> bool:
            with self._r.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(self._counters, receipt)  # type: ignore[no-untyped-call]
                        if pipe.exists(receipt):  # a retry after a lost EXEC reply: it was applied
                            return True
                        counters = {redis_text(k): int(v) for k, v in pipe.hgetall(self._counters).items()}
                        if counters.get(name, 0) + int(delta) > int(limit_fn(counters)):
                            return False
                        pipe.multi()
                        pipe.hincrby(self._counters, name, int(delta))
                        pipe.set(receipt, 1, ex=_OP_TTL_S)
                        pipe.execute()
                        return True
                    except redis.WatchError:
                        continue

        return with_retries(attempt)

    def counters(self) -> dict[str, int]:
        raw = with_retries(lambda: self._r.hgetall(self._counters))
        return {redis_text(k): int(v) for k, v in raw.items()}

    # -- flags ------------------------------------------------------------------------------
    def flag(self, name: str) -> bool:
        value = with_retries(lambda: self._r.hget(self._flags, name))
        return bool(value is not None and int(value))

    def set_flag(self, name: str, value: bool) -> None:
        with_retries(lambda: self._r.hset(self._flags, name, int(bool(value))))

    # -- ledger -----------------------------------------------------------------------------
    def record(self, rows: Iterable[tuple[str, str, int, int]]) -> int:
        args: list[Any] = [uuid.uuid4().hex, time.time()]
        for traj_id, fate, step, age in rows:
            args += [str(traj_id), str(fate), int(step), int(age)]
        if len(args) == 2:
            return 0
        keys = [self._ledger, self._fates, self._ages, self._counters]
        return int(with_retries(lambda: self._record_script(keys=keys, args=args)))

    def ledger_ids(self) -> set[str]:
        return {redis_text(k) for k in with_retries(lambda: self._r.hkeys(self._ledger))}

    def ledger_counts(self) -> dict[str, int]:
        raw = with_retries(lambda: self._r.hgetall(self._fates))
        return {redis_text(k): int(v) for k, v in raw.items() if int(v)}

    def ages(self) -> list[int]:
        return [int(v) for v in with_retries(lambda: self._r.lrange(self._ages, 0, -1))]

    # -- documents --------------------------------------------------------------------------
    def put_doc(self, name: str, doc: dict[str, Any]) -> None:
        body = json.dumps(doc, sort_keys=True)
        with_retries(lambda: self._r.hset(self._docs, name, body))

    def get_doc(self, name: str) -> dict[str, Any] | None:
        body = with_retries(lambda: self._r.hget(self._docs, name))
        if body is None:
            return None
        doc = json.loads(redis_text(body))
        return doc if isinstance(doc, dict) else None

    def close(self) -> None:
        self._r.close()
