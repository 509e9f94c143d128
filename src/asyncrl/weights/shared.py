"""The cluster weight store (``weights.kind: shared``): snapshots on a shared filesystem, pointer in Redis.

Everything about snapshots is :class:`~asyncrl.weights.local.LocalWeightStore`'s: the directory
layout, the atomic temp-dir + fsync + rename publish, sha256 verification of the very bytes
decoded, retention by rename-then-delete, and the fallback past corrupt or partial versions. Only
the **latest-version pointer** moves from the file ``latest`` to the Redis key
``asyncrl:{<sha1 of the store's absolute path>}:weights:latest`` (value ``{"version": N}``), so
readers on other machines learn of a new version without polling a network filesystem's
directory (whose metadata caches can lag) and every machine agrees on one pointer.

Ordering (writer): the snapshot directory is complete and renamed into place, the parent is
fsynced, and only then is the pointer set — by a Lua script that refuses to move it backwards, so
a delayed or duplicated publish can never rewind readers. Readers never see a version before its
directory exists; a directory newer than the pointer is an unfinished publish and is ignored.

Failures: a pointer that cannot be read (Redis unreachable after retries, or a corrupt value) is
a *problem*, exactly like an unreadable pointer file: readers use the newest valid directory and
report it. A pointer that is absent (a fresh Redis, or one restarted without persistence) means
"newest valid directory". Publishing while Redis is unreachable raises after the retries (the
trainer's supervisor restarts it from its checkpoint); versions still only increase because
``publish`` compares against the directories on disk as well as the pointer.

Mount the shared filesystem at the same path on every machine: the key is derived from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.config import SharedWeightsConfig, default_of
from asyncrl.credentials import key_prefix, mask_secrets, open_redis, with_retries
from asyncrl.weights.local import LocalWeightStore, parse_pointer

# KEYS: pointer; ARGV: version, value. Returns 1 if set, 0 if the pointer already names >= version.
_SET_POINTER_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, data = pcall(cjson.decode, cur)
  if ok and type(data) == 'table' and tonumber(data['version']) and tonumber(data['version']) >= tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""


def pointer_key(root: str | Path) -> str:
    """Redis key of the store's pointer (a Cluster hash tag keeps a run's keys in one slot)."""
    return f"{key_prefix(root)}:weights:latest"


class SharedWeightStore(LocalWeightStore):
    """Snapshots under ``root`` (a shared filesystem); the pointer in Redis at ``redis_url``."""

    def __init__(
        self,
        root: str | Path,
        redis_url: str,
        *,
        keep: int,
        socket_timeout_s: float = default_of(SharedWeightsConfig, "socket_timeout_s"),
    ) -> None:
        # connect first, under the one Redis retry policy (a role started while Redis restarts waits for
        # it); bad settings, or a Redis that stays down, fail with a UserError naming the field
        self._r: Any = open_redis(redis_url, "weights.redis_url", socket_timeout_s=socket_timeout_s)
        self.redis_url = redis_url
        self.key = pointer_key(root)
        self._set_pointer = self._r.register_script(_SET_POINTER_LUA)
        super().__init__(root, keep=keep)

    def __repr__(self) -> str:
        return f"SharedWeightStore({str(self.root)!r}, {mask_secrets(self.redis_url)!r}, keep={self.keep})"

    def _read_pointer(self) -> tuple[int | None, str | None]:
        import redis

        try:
            raw = with_retries(lambda: self._r.get(self.key))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return None, f"latest pointer unreadable (Redis at {mask_secrets(self.redis_url)}: {exc})"
        return (None, None) if raw is None else parse_pointer(raw)

    def _write_pointer(self, version: int) -> None:
        value = json.dumps({"version": version})
        with_retries(lambda: self._set_pointer(keys=[self.key], args=[version, value]))

    def close(self) -> None:
        self._r.close()
