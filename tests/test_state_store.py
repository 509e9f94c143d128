"""Contract tests of the orchestrator state store, run against both backends (``sqlite``, ``redis``).

The Redis backend runs against ``$ASYNCRL_TEST_REDIS_URL`` (default the shared server at
``redis://127.0.0.1:6379/0``) with a unique key prefix per test, deleted afterwards; those tests
skip when no server answers, unless ``ASYNCRL_REQUIRE_REDIS=1``. Child processes use spawn and
open the store themselves.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asyncrl.config import RunConfig, load_config
from asyncrl.control.store import SQLiteStateStore, StateStore, make_state_store
from asyncrl.errors import UserError

REDIS_URL = os.environ.get("ASYNCRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

Opener = Callable[[], StateStore]


def _redis_or_skip() -> None:
    import redis

    try:
        r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=2)
        r.ping()
        r.close()
    except Exception:
        if os.environ.get("ASYNCRL_REQUIRE_REDIS") == "1":
            pytest.fail(f"no Redis server at {REDIS_URL} (ASYNCRL_REQUIRE_REDIS=1)")
        pytest.skip(f"no Redis server at {REDIS_URL}")


def _delete(prefix: str) -> None:
    import redis

    r = redis.Redis.from_url(REDIS_URL)
    keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


def redis_cfg(prefix: str) -> RunConfig:
    return load_config(
        None,
        [
            "control.state.kind=redis",
            f"control.state.redis_url={REDIS_URL}",
            f"control.state.prefix={prefix}",
        ],
    )


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Opener, str]]:
    """``(kind, open a new handle on the same store, the argument a child process needs)``."""
    opened: list[StateStore] = []
    if request.param == "sqlite":
        cfg, where = load_config(None, []), str(tmp_path)
    else:
        _redis_or_skip()
        where = f"asyncrl-test:{uuid.uuid4().hex[:12]}"
        cfg = redis_cfg(where)

    def open_one() -> StateStore:
        st = make_state_store(cfg, tmp_path)
        opened.append(st)
        return st

    yield request.param, open_one, where
    for st in opened:
        st.close()
    if request.param == "redis":
        _delete(where)


def test_counters_and_flags(opener: tuple[str, Opener, str]) -> None:
    _, open_one, _ = opener
    st, other = open_one(), open_one()
    assert st.get("admitted") == 0 and st.get("version", 7) == 7 and st.counters() == {}
    st.set_value("version", 3)
    assert other.get("version") == 3
    assert st.add("admitted", 5) == 5 and other.add("admitted", -2) == 3
    assert st.counters() == {"version": 3, "admitted": 3}
    assert st.try_add_within("admitted", 2, lambda c: c["version"] + 2) is True  # 5 <= 5
    assert other.try_add_within("admitted", 1, lambda c: c["version"] + 2) is False  # 6 > 5: unchanged
    assert st.get("admitted") == 5
    assert other.try_add_within("fresh", 4, lambda c: 4) and st.get("fresh") == 4
    assert not st.flag("stop")
    st.set_flag("stop", True)
    assert other.flag("stop")
    other.set_flag("stop", False)
    assert not st.flag("stop")


def test_ledger_is_idempotent_and_counts_duplicates(opener: tuple[str, Opener, str]) -> None:
    _, open_one, _ = opener
    st, other = open_one(), open_one()
    assert st.record([]) == 0
    assert st.record([("a", "trained", 1, 0), ("b", "dropped_stale", 1, 3), ("c", "trained", 2, 1)]) == 0
    assert other.record([("a", "trained", 2, 0), ("d", "trained", 3, 2)]) == 1  # "a": a second fate
    assert st.record([("a", "dropped_stale", 4, 5)]) == 1
    assert st.get("duplicates") == 2
    assert other.ledger_ids() == {"a", "b", "c", "d"}
    assert other.ledger_counts() == {"trained": 3, "dropped_stale": 1}  # the first fate stays
    assert sorted(st.ages()) == [0, 1, 2]


def test_documents_are_json_replaced_whole(opener: tuple[str, Opener, str]) -> None:
    _, open_one, _ = opener
    st, other = open_one(), open_one()
    assert st.get_doc("control") is None
    st.put_doc("control", {"weights": {"a:1": 0.5}, "open": ["a:2"], "n": 1})
    assert other.get_doc("control") == {"weights": {"a:1": 0.5}, "open": ["a:2"], "n": 1}
    other.put_doc("control", {"n": 2})
    assert st.get_doc("control") == {"n": 2}


def test_factory_picks_the_backend(opener: tuple[str, Opener, str], tmp_path: Path) -> None:
    kind, open_one, _ = opener
    st = open_one()
    st.put_doc("x", {"a": [1, 2]})
    if kind == "sqlite":
        assert isinstance(st, SQLiteStateStore)
        assert SQLiteStateStore(tmp_path / "control.sqlite").get_doc("x") == {"a": [1, 2]}
    else:
        from asyncrl.control.store.redis_backend import RedisStateStore

        assert isinstance(st, RedisStateStore) and not (tmp_path / "control.sqlite").exists()


def _grab(kind: str, where: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    cfg = load_config(None, []) if kind == "sqlite" else redis_cfg(where)
    st = make_state_store(cfg, where)
    got = sum(st.try_add_within("admitted", 1, lambda c: 50 + c.get("dropped", 0)) for _ in range(n))
    st.add("done", 1)
    st.close()
    out.put(got)


def test_admission_is_atomic_across_processes(opener: tuple[str, Opener, str]) -> None:
    kind, open_one, where = opener
    st = open_one()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_grab, args=(kind, where, 40, out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    grants = [out.get(timeout=10) for _ in procs]
    assert sum(grants) == 50  # 120 attempts, exactly the 50 slots granted
    assert st.get("admitted") == 50 and st.get("done") == 3


def test_redis_kind_needs_a_url_and_fails_fast() -> None:
    with pytest.raises(UserError, match=r"control\.state\.redis_url"):
        load_config(None, ["control.state.kind=redis"])
    cfg = load_config(
        None, ["control.state.kind=redis", "control.state.redis_url=redis://:s3cret@127.0.0.1:1/0"]
    )
    with pytest.raises(UserError, match=r"control\.state\.redis_url") as err:
        make_state_store(cfg, "/tmp/nowhere")
    assert "s3cret" not in str(err.value) and "***" in str(err.value)
    with pytest.raises(UserError, match=r"control\.state"):
        load_config(None, ["control.state.kind=redis", "control.state.redis_url=http://h/0"])


@pytest.mark.redis
def test_redis_retried_writes_apply_once() -> None:
    """A write whose reply was lost is retried by the client; the operation token makes it count once."""
    _redis_or_skip()
    from asyncrl.control.store.redis_backend import RedisStateStore

    prefix = f"asyncrl-test:{uuid.uuid4().hex[:12]}"
    st = RedisStateStore(REDIS_URL, "/tmp/unused", prefix=prefix)
    try:
        keys = [f"{prefix}:counters", f"{prefix}:op:fixed"]
        assert st._add_script(keys=keys, args=["admitted", 3, 60]) == 3
        assert st._add_script(keys=keys, args=["admitted", 3, 60]) == 3  # the retry: same receipt
        assert st.get("admitted") == 3
        lkeys = [f"{prefix}:ledger", f"{prefix}:fates", f"{prefix}:ages", f"{prefix}:counters"]
        args = ["op1", 1.0, "t1", "trained", 1, 0]
        assert st._record_script(keys=lkeys, args=args) == 0
        assert st._record_script(keys=lkeys, args=args) == 0  # same call retried: not a duplicate
        assert st._record_script(keys=lkeys, args=["op2", 2.0, "t1", "trained", 2, 0]) == 1
        assert st.ledger_counts() == {"trained": 1} and st.get("duplicates") == 1
    finally:
        st.close()
        _delete(prefix)
