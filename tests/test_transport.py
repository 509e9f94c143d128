"""Trajectory queue: the at-least-once contract, multi-process safety, crashes, back-pressure.

Contract tests run against every backend of the ``backend`` fixture ("embedded", and "redis"
against the server at ``$ASYNCRL_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/0``; those
are skipped when no server answers, unless ``ASYNCRL_REQUIRE_REDIS=1``). Child processes use the spawn start method and open the queue themselves.
This module deliberately does not import :mod:`asyncrl.config` at import time (it pulls in
torch), so spawned children start fast.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing as mp
import os
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncrl.records import Group, Task, Trajectory, Turn, encode, new_id
from asyncrl.telemetry.reports import QueueStats
from asyncrl.transport import (
    QUEUE_FILENAME,
    BackendUnavailableError,
    EmbeddedQueue,
    QueueClosedError,
    TrajectoryQueue,
    make_queue,
)
from helpers import wait_for

SPAWN = mp.get_context("spawn")
REDIS_URL = os.environ.get("ASYNCRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


# ---- trajectories ----------------------------------------------------------------------------
def make_traj(traj_id: str, model_tokens: int = 4, turns: int = 1) -> Group:
    """A valid one-member group (the queue's entry) of id ``traj_id``, its member's id too;
    ``model_tokens=400, turns=4`` encodes to about 20 KB."""
    parts = [Turn(role="env", token_ids=[30000 + j for j in range(model_tokens // 2 or 1)])]
    for k in range(turns):
        parts.append(
            Turn(
                role="model",
                token_ids=[30000 + j for j in range(model_tokens)],
                logprobs=[-0.123456789 - j * 1e-3 for j in range(model_tokens)],
                version=k,
            )
        )
    task = Task(id=f"task-{traj_id}", task_type="unit")
    return Group.of(task, [Trajectory(id=traj_id, task=task, turns=parts)], id=traj_id)


# ---- backends --------------------------------------------------------------------------------
def open_queue(kind: str, run_dir: str, capacity: int, lease_seconds: float) -> TrajectoryQueue:
    """Open a backend's queue without importing the config module (used in child processes)."""
    if kind == "embedded":
        return EmbeddedQueue(
            Path(run_dir) / QUEUE_FILENAME,
            capacity=capacity,
            lease_seconds=lease_seconds,
            busy_timeout_s=30.0,
        )
    if kind == "redis":
        from asyncrl.transport.redis_backend import RedisQueue

        return RedisQueue(
            REDIS_URL, run_dir, capacity=capacity, lease_seconds=lease_seconds, socket_timeout_s=30.0
        )
    raise ValueError(f"no test opener for backend {kind!r}")


@dataclass
class Backend:
    kind: str
    run_dir: Path
    opened: list[TrajectoryQueue]

    def make(self, capacity: int = 1024, lease_seconds: float = 60.0) -> TrajectoryQueue:
        from pydantic import TypeAdapter

        from asyncrl.config import TransportConfig

        data: dict[str, object] = {"kind": self.kind, "capacity": capacity, "lease_seconds": lease_seconds}
        if self.kind == "redis":
            data["redis_url"] = REDIS_URL
        cfg = TypeAdapter(TransportConfig).validate_python(data)
        q = make_queue(cfg, self.run_dir)
        self.opened.append(q)
        return q

    def inject_raw(self, traj_id: str, payload: bytes) -> None:
        """Store raw bytes as an entry, bypassing every check of put()."""
        if self.kind == "embedded":
            conn = sqlite3.connect(self.run_dir / QUEUE_FILENAME, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                now = time.time()
                cur = conn.execute(
                    "INSERT INTO entries (group_id, visible_at, enqueued_at, nbytes) VALUES (?, ?, ?, ?)",
                    (traj_id, now, now, len(payload)),
                )
                conn.execute("INSERT INTO payloads (seq, data) VALUES (?, ?)", (cur.lastrowid, payload))
                conn.execute("COMMIT")
            finally:
                conn.close()
        elif self.kind == "redis":
            from asyncrl.transport.redis_backend import RedisQueue

            q = RedisQueue(
                REDIS_URL, self.run_dir, capacity=64, lease_seconds=60.0, socket_timeout_s=30.0
            )  # creates the stream and group if needed
            q.close()
            r = _redis_client()
            entry_id = r.xadd(q.stream_key, {"id": traj_id, "data": payload})
            r.hset(q.ids_key, traj_id, entry_id)
            r.hset(q.entries_key, entry_id, traj_id)
            r.close()
        else:  # pragma: no cover - per-backend hook
            raise NotImplementedError(self.kind)

    def check_integrity(self) -> None:
        if self.kind == "embedded":
            conn = sqlite3.connect(self.run_dir / QUEUE_FILENAME)
            try:
                assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            finally:
                conn.close()
        elif self.kind == "redis":
            check_redis_invariants(self.run_dir)


def _redis_client() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def check_redis_invariants(run_dir: Path) -> None:
    """The run's keys agree: every stream entry has a queued id and back, pending ⊆ stream."""
    from asyncrl.transport.redis_backend import GROUP, key_prefix

    prefix = key_prefix(run_dir)
    r = _redis_client()
    try:
        stream = {eid.decode(): f[b"id"].decode() for eid, f in r.xrange(f"{prefix}:stream", "-", "+")}
        ids = {k.decode(): v.decode() for k, v in r.hgetall(f"{prefix}:ids").items()}
        entries = {k.decode(): v.decode() for k, v in r.hgetall(f"{prefix}:entries").items()}
        assert entries == stream, "entry -> id map disagrees with the stream"
        assert {v: k for k, v in stream.items()} == ids, "queued-id map disagrees with the stream"
        pending = r.xpending_range(f"{prefix}:stream", GROUP, min="-", max="+", count=100_000)
        assert {p["message_id"].decode() for p in pending} <= set(stream), "pending entry not in stream"
        known = {f"{prefix}:{k}" for k in ("stream", "ids", "entries", "counters", "dead")}
        assert {k.decode() for k in r.scan_iter(match=f"{prefix}*")} <= known
    finally:
        r.close()


def _redis_available() -> bool:
    try:
        r = _redis_client()
        try:
            return bool(r.ping())
        finally:
            r.close()
    except Exception:
        return False


def delete_redis_keys(prefix: str) -> int:
    r = _redis_client()
    try:
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            r.delete(*keys)
        assert not list(r.scan_iter(match=f"{prefix}*")), "keys left behind"
        return len(keys)
    finally:
        r.close()


@pytest.fixture
def redis_run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run directory whose Redis keys are deleted afterwards (skips if no server answers)."""
    from asyncrl.transport.redis_backend import key_prefix

    if not _redis_available():
        if os.environ.get("ASYNCRL_REQUIRE_REDIS") == "1":
            pytest.fail(f"no Redis server at {REDIS_URL} (ASYNCRL_REQUIRE_REDIS=1)")
        pytest.skip(f"no Redis server at {REDIS_URL}")
    run_dir = tmp_path / "run"
    prefix = key_prefix(run_dir)
    delete_redis_keys(prefix)
    yield run_dir
    delete_redis_keys(prefix)


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    # redis_run_dir skips without a server and deletes the run's keys afterwards.
    run_dir = request.getfixturevalue("redis_run_dir") if request.param == "redis" else tmp_path / "run"
    b = Backend(kind=request.param, run_dir=run_dir, opened=[])
    yield b
    for q in b.opened:
        q.close()


def drain(q: TrajectoryQueue, consumer: str = "trainer", timeout: float = 0.5) -> list[str]:
    """Take and ack everything currently deliverable; returns trajectory ids in delivery order."""
    ids: list[str] = []
    while batch := q.get_batch(64, timeout=timeout, consumer=consumer):
        ids.extend(d.group.id for d in batch)
        q.ack([d.entry_id for d in batch])
    return ids


# ---- child processes (module level: spawn imports them by name) --------------------------------
def _produce(kind: str, run_dir: str, capacity: int, prefix: str, n: int, log_path: str) -> None:
    """Put n trajectories, appending each id to log_path only after put() returned True."""
    q = open_queue(kind, run_dir, capacity, 60.0)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for i in range(n):
        tid = f"{prefix}-{i}"
        assert q.put(make_traj(tid), timeout=60.0)
        os.write(fd, f"{tid}\n".encode())  # unbuffered: survives kill -9 of this process
    os.close(fd)
    q.close()


def _consume(kind: str, run_dir: str, name: str, stop: Any, out_path: str) -> None:
    """Take batches until told to stop and the queue is empty; record every delivery."""
    q = open_queue(kind, run_dir, 1, 60.0)
    seen: list[list[Any]] = []
    while True:
        batch = q.get_batch(16, timeout=0.05, consumer=name)
        for d in batch:
            seen.append([d.group.id, d.entry_id, d.attempts])
        if batch:
            time.sleep(0.002)  # hold the leases a moment, so consumers overlap
            q.ack([d.entry_id for d in batch])
        elif stop.is_set():
            break
    Path(out_path).write_text(json.dumps(seen))
    q.close()


def _hold_leases(kind: str, run_dir: str, lease_seconds: float, n: int, out_path: str) -> None:
    """Lease n entries, report them, then hang without acking (until killed)."""
    q = open_queue(kind, run_dir, 1024, lease_seconds)
    batch = q.get_batch(n, timeout=10.0, consumer="doomed")
    tmp = out_path + ".tmp"
    Path(tmp).write_text(json.dumps([d.group.id for d in batch]))
    os.replace(tmp, out_path)
    time.sleep(600)


_wait_for = functools.partial(wait_for, every=0.02)


def _kill(proc: Any) -> None:
    if proc.is_alive():
        proc.kill()
    proc.join(10)


# ---- contract: single process ----------------------------------------------------------------
def test_a_group_is_one_entry_delivered_whole(backend: Backend) -> None:
    """Every member of a group travels in one entry: one slot of capacity, one delivery, one ack."""
    q = backend.make(capacity=1)
    task = Task(id="task-g", task_type="unit")
    members = [make_traj(f"m{i}").members[0] for i in range(3)]
    group = Group.of(task, members, id="g")
    assert q.put(group, timeout=0) and q.depth() == 1
    assert not q.put(make_traj("other"), timeout=0)  # capacity counts groups
    (d,) = q.get_batch(10)
    assert d.group.id == "g" and [m.id for m in d.group.members] == ["m0", "m1", "m2"]
    assert all(m.group_id == "g" for m in d.group.members) and d.group.episodes == 3
    q.ack([d.entry_id])
    assert q.depth() == 0


def test_a_group_with_a_foreign_member_is_refused_at_put(backend: Backend) -> None:
    q = backend.make()
    group = make_traj("g")
    group.members.append(make_traj("stranger").members[0])  # carries group id "stranger"
    with pytest.raises(ValueError, match="carries group id"):
        q.put(group)
    assert q.depth() == 0


def test_put_get_ack_round_trip(backend: Backend) -> None:
    q = backend.make()
    before = time.time()
    sent = [make_traj(f"t{i}") for i in range(5)]
    for t in sent:
        assert q.put(t)
        assert t.members[0].lifecycle.enqueued >= before
    assert q.depth() == 5
    batch = q.get_batch(3)
    assert [d.group.id for d in batch] == ["t0", "t1", "t2"]  # FIFO
    assert all(d.attempts == 1 for d in batch)
    assert all(m.lifecycle.dequeued >= m.lifecycle.enqueued > 0 for d in batch for m in d.group.members)
    assert batch[0].group.members[0].turns == sent[0].members[0].turns and batch[0].group.task == sent[0].task
    assert len({d.entry_id for d in batch}) == 3
    stats = q.stats()
    assert QueueStats.names() == list(stats.flat())
    assert (stats.depth, stats.ready, stats.leased) == (5, 2, 3)
    assert stats.put_total == 5 and stats.bytes_in == sum(len(encode(t)) for t in sent)
    q.ack([d.entry_id for d in batch])
    q.ack([d.entry_id for d in batch])  # idempotent
    q.ack([])
    assert q.depth() == 2 and q.stats().acked_total == 3
    assert drain(q) == ["t3", "t4"]
    assert q.depth() == 0 and q.get_batch(10) == []
    stats = q.stats()
    assert (stats.acked_total, stats.redelivered_total, stats.dead_letters) == (
        5,
        0,
        0,
    )


def test_get_batch_waits_for_timeout_then_returns_empty(backend: Backend) -> None:
    q = backend.make()
    t0 = time.monotonic()
    assert q.get_batch(4, timeout=0.2) == []
    assert 0.18 <= time.monotonic() - t0 < 2.0
    threading.Timer(0.1, lambda: q.put(make_traj("late"))).start()
    t0 = time.monotonic()
    batch = q.get_batch(4, timeout=5.0)
    assert [d.group.id for d in batch] == ["late"] and time.monotonic() - t0 < 2.0


def test_expired_lease_is_redelivered_and_late_ack_is_harmless(backend: Backend) -> None:
    q = backend.make(lease_seconds=0.3)
    q.put(make_traj("a"))
    first = q.get_batch(5, consumer="c1")
    assert [d.attempts for d in first] == [1]
    assert q.get_batch(5, consumer="c2") == []  # leased: invisible to others
    time.sleep(0.35)
    second = q.get_batch(5, consumer="c2")
    assert [(d.group.id, d.attempts) for d in second] == [("a", 2)]
    assert q.stats().redelivered_total == 1
    q.ack([first[0].entry_id])  # the first consumer's late ack still settles the entry
    q.ack([second[0].entry_id])
    assert q.depth() == 0 and q.stats().acked_total == 1


def test_idempotent_put_of_same_id(backend: Backend) -> None:
    q = backend.make(capacity=2)
    assert q.put(make_traj("dup")) and q.put(make_traj("dup"))
    assert q.depth() == 1 and q.stats().put_total == 1
    leased = q.get_batch(5)
    assert q.put(make_traj("dup"), timeout=0)  # still queued (leased): still a no-op
    assert q.put(make_traj("other"))
    assert q.put(make_traj("dup"), timeout=0)  # at capacity, but already queued: True at once
    q.ack([d.entry_id for d in leased])
    assert q.put(make_traj("dup"))  # after the ack it is a new entry (consumers de-duplicate)
    assert sorted(drain(q)) == ["dup", "other"]


def test_back_pressure_blocks_times_out_and_unblocks_after_ack(backend: Backend) -> None:
    q = backend.make(capacity=3)
    for i in range(3):
        assert q.put(make_traj(f"t{i}"), timeout=0)
    assert not q.put(make_traj("x"), timeout=0)
    cpu0, t0 = time.process_time(), time.monotonic()
    assert not q.put(make_traj("x"), timeout=0.5)
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    assert 0.45 <= wall < 3.0
    assert cpu < 0.5 * wall, f"blocked put burned {cpu:.3f}s CPU in {wall:.3f}s: busy-spinning"
    batch = q.get_batch(1)
    assert not q.put(make_traj("x"), timeout=0.05)  # leased entries still count against capacity

    result: list[bool] = []
    blocked = threading.Thread(target=lambda: result.append(q.put(make_traj("x"), timeout=10.0)))
    blocked.start()
    time.sleep(0.2)
    assert blocked.is_alive() and not result
    t0 = time.monotonic()
    q.ack([d.entry_id for d in batch])
    blocked.join(5.0)
    assert result == [True] and time.monotonic() - t0 < 1.0
    assert q.depth() == 3


def test_malformed_stored_entry_is_dead_lettered_rest_delivered(backend: Backend) -> None:
    q = backend.make()
    q.put(make_traj("good-0"))
    backend.inject_raw("garbage", b"\xc1\x00not msgpack at all")
    q.put(make_traj("good-1"))
    wrong_version = make_traj("old-schema")
    wrong_version.schema_version = 999
    backend.inject_raw("old-schema", encode(wrong_version))
    invalid = make_traj("no-logprobs")
    invalid.members[0].turns[1].logprobs = None  # decodes, but fails validation
    backend.inject_raw("no-logprobs", encode(invalid))
    backend.inject_raw("mismatch", encode(make_traj("someone-else")))
    q.put(make_traj("good-2"))

    batch = q.get_batch(10)
    assert [d.group.id for d in batch] == ["good-0", "good-1", "good-2"]
    dead = q.dead_letters()
    assert [d.group_id for d in dead] == ["garbage", "old-schema", "no-logprobs", "mismatch"]
    assert "schema_version" in dead[1].reason and "log-prob" in dead[2].reason and "differs" in dead[3].reason
    assert dead[0].payload == b"\xc1\x00not msgpack at all" and all(d.attempts == 1 for d in dead)
    stats = q.stats()
    assert stats.dead_letters == 4 and stats.depth == 3
    q.ack([d.entry_id for d in batch])
    assert q.get_batch(10) == [] and q.depth() == 0
    # A batch made only of poison returns empty (after dead-lettering) instead of raising.
    backend.inject_raw("garbage-2", b"\x00")
    assert q.get_batch(10, timeout=0.1) == [] and len(q.dead_letters()) == 5


def test_put_rejects_trajectory_that_could_never_be_consumed(backend: Backend) -> None:
    q = backend.make()
    bad = make_traj("bad")
    bad.members[0].turns[1].version = None
    with pytest.raises(ValueError, match="version"):
        q.put(bad)
    assert q.depth() == 0


def test_reopen_after_close_keeps_unacked_entries(backend: Backend) -> None:
    q = backend.make(lease_seconds=0.3)
    for i in range(5):
        q.put(make_traj(f"t{i}"))
    batch = q.get_batch(2)
    q.ack([batch[0].entry_id])  # t0 done, t1 leased and never acked
    q.close()
    q.close()  # idempotent
    with pytest.raises(QueueClosedError):
        q.depth()
    q2 = backend.make(lease_seconds=0.3)
    assert q2.depth() == 4
    assert q2.stats().put_total == 5  # counters are durable too
    rest = q2.get_batch(10)
    assert [d.group.id for d in rest] == ["t2", "t3", "t4"]
    q2.ack([d.entry_id for d in rest])
    time.sleep(0.35)
    again = q2.get_batch(10)
    assert [(d.group.id, d.attempts) for d in again] == [("t1", 2)]


def test_unacked_members_lists_ready_and_leased_entries(backend: Backend) -> None:
    """The end-of-run accounting reads the un-acked entries' members; reading leases nothing."""
    q = backend.make(lease_seconds=30)
    for i in range(4):
        q.put(make_traj(f"t{i}"))
    batch = q.get_batch(2)
    q.ack([batch[0].entry_id])  # t0 done, t1 leased, t2 and t3 ready
    assert sorted(q.unacked_members()) == ["t1", "t2", "t3"]
    assert [d.group.id for d in q.get_batch(10)] == ["t2", "t3"]  # the read took no lease


def test_run_accounting_counts_a_partly_fated_group_once(backend: Backend) -> None:
    """A group held un-acked at the end of a run with one member's fate recorded (dropped stale):
    that member is consumed, the other left over, nothing lost and nothing counted twice."""
    from asyncrl.jobs.summary import sample_accounting

    q = backend.make(lease_seconds=30)
    task = Task(id="task-g", task_type="unit")
    members = [make_traj(f"g-{k}").members[0] for k in range(2)]
    q.put(Group.of(task, members, id="g"))
    q.put(make_traj("done"))
    done = [d for d in q.get_batch(2) if d.group.id == "done"]
    q.ack([done[0].entry_id])
    qs, unacked = q.stats(), q.unacked_members()
    assert sample_accounting(qs, unacked, {"done", "g-0"}, consumed=2) == (3, 1, 0)
    assert sample_accounting(qs, unacked, {"done"}, consumed=1) == (3, 2, 0)
    assert sample_accounting(qs, unacked, {"done"}, consumed=2)[2] == -1  # a fate nothing accounts for


def test_threads_share_one_handle(backend: Backend) -> None:
    q = backend.make(capacity=16)
    n_threads, per_thread = 4, 50
    got: list[str] = []
    done = threading.Event()

    def produce(k: int) -> None:
        for i in range(per_thread):
            assert q.put(make_traj(f"p{k}-{i}"), timeout=30.0)

    def consume() -> None:
        while not (done.is_set() and q.depth() == 0):
            batch = q.get_batch(8, timeout=0.05)
            got.extend(d.group.id for d in batch)
            q.ack([d.entry_id for d in batch])

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(n_threads)]
    consumers = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads + consumers:
        t.start()
    for t in threads:
        t.join(30)
    done.set()
    for t in consumers:
        t.join(30)
    assert Counter(got) == Counter(f"p{k}-{i}" for k in range(n_threads) for i in range(per_thread))


@pytest.mark.redis
def test_make_queue_redis_opens_a_per_run_stream(redis_run_dir: Path) -> None:
    from asyncrl.config import RedisTransportConfig
    from asyncrl.transport.redis_backend import RedisQueue, key_prefix

    cfg = RedisTransportConfig(redis_url=REDIS_URL, capacity=7, lease_seconds=3.0)
    with contextlib.closing(make_queue(cfg, redis_run_dir)) as q:
        assert isinstance(q, RedisQueue)
        assert (q.capacity, q.lease_seconds, q.prefix) == (7, 3.0, key_prefix(redis_run_dir))
        assert q.put(make_traj("a"))
    # Another run directory is another stream: nothing collides.
    other = redis_run_dir.parent / "other-run"
    assert key_prefix(other) != key_prefix(redis_run_dir)
    with contextlib.closing(
        RedisQueue(REDIS_URL, other, capacity=64, lease_seconds=60.0, socket_timeout_s=30.0)
    ) as q2:
        try:
            assert q2.depth() == 0 and q2.get_batch(5) == []
        finally:
            delete_redis_keys(key_prefix(other))
    assert issubclass(BackendUnavailableError, NotImplementedError)


def test_make_queue_unknown_kind_is_refused(tmp_path: Path) -> None:
    from asyncrl.config import EmbeddedTransportConfig

    cfg = EmbeddedTransportConfig.model_construct(kind="kafka")  # bypass validation on purpose
    with pytest.raises(BackendUnavailableError, match="kafka"):
        make_queue(cfg, tmp_path)


def test_redis_retry_wrapper_backs_off_then_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis
    import redis.retry

    from asyncrl.credentials import mask_secrets, with_retries

    sleeps: list[float] = []
    monkeypatch.setattr(redis.retry, "sleep", sleeps.append)  # the one policy is redis-py's own Retry
    calls = iter([redis.ConnectionError("down"), redis.TimeoutError("slow"), "ok"])

    def flaky() -> str:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    assert with_retries(flaky) == "ok"
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] >= 0.04
    sleeps.clear()

    def down() -> None:
        raise redis.ConnectionError("down")

    with pytest.raises(redis.ConnectionError):
        with_retries(down)
    assert len(sleeps) == 9 and max(sleeps) <= 0.8 * 1.2 and sum(sleeps) >= 3.0  # rides out a few seconds
    with pytest.raises(redis.ResponseError):  # other errors are not retried
        with_retries(lambda: (_ for _ in ()).throw(redis.ResponseError("WRONGTYPE")))
    assert len(sleeps) == 9
    assert mask_secrets("rediss://:s3cret@host:6380/1") == "rediss://:***@host:6380/1"
    assert mask_secrets("redis://u:pw@h/0") == "redis://u:***@h/0"
    assert mask_secrets("redis://h:6379/0") == "redis://h:6379/0"


@pytest.mark.redis
def test_redis_reconnects_after_server_drops_the_connection(redis_run_dir: Path) -> None:
    from asyncrl.transport.redis_backend import RedisQueue

    q = RedisQueue(REDIS_URL, redis_run_dir, capacity=64, lease_seconds=5.0, socket_timeout_s=30.0)
    try:
        assert q.put(make_traj("before"))
        name = f"asyncrl-test-{new_id()}"
        q._client().client_setname(name)
        admin = _redis_client()
        try:
            assert admin.client_kill_filter(_type="normal", skipme=True) >= 1  # drop every other client
        finally:
            admin.close()
        assert q.put(make_traj("after"))  # transparently reconnected
        assert [d.group.id for d in q.get_batch(5)] == ["before", "after"]
        assert "***" not in repr(q) and "RedisQueue(" in repr(q)
    finally:
        q.close()
    check_redis_invariants(redis_run_dir)


@pytest.mark.redis
def test_redis_poison_entry_with_no_fields_and_late_ack_of_dead_letter(redis_run_dir: Path) -> None:
    from asyncrl.transport.redis_backend import RedisQueue

    q = RedisQueue(REDIS_URL, redis_run_dir, capacity=64, lease_seconds=0.2, socket_timeout_s=30.0)
    try:
        _redis_client().xadd(q.stream_key, {"junk": b"x"})  # neither id nor data
        assert q.put(make_traj("ok"))
        batch = q.get_batch(10)
        assert [d.group.id for d in batch] == ["ok"]
        dead = q.dead_letters()
        assert len(dead) == 1 and dead[0].group_id == "" and dead[0].payload == b""
        q.ack([dead[0].entry_id])  # acking a dead-lettered entry changes nothing
        q.ack([d.entry_id for d in batch])
        stats = q.stats()
        assert (stats.depth, stats.acked_total, stats.dead_letters) == (0, 1, 1)
    finally:
        q.close()
    check_redis_invariants(redis_run_dir)


def test_bad_arguments(backend: Backend) -> None:
    q = backend.make()
    with pytest.raises(ValueError):
        q.get_batch(0)
    with pytest.raises(TypeError):
        q.ack("1")
    with pytest.raises(ValueError):
        q.ack(["not-an-id"])
    q.ack(["123456"])  # unknown ids are ignored


def test_dead_letters_say_which_entry_died_and_when(backend: Backend) -> None:
    q = backend.make()
    before = time.time()
    backend.inject_raw("poison-a", b"\x00")
    backend.inject_raw("poison-b", b"\xc1")
    assert q.get_batch(10, timeout=0.2) == []
    dead = q.dead_letters()
    assert [d.group_id for d in dead] == ["poison-a", "poison-b"]
    assert all(isinstance(d.entry_id, str) and d.entry_id not in ("", "None") for d in dead)
    assert dead[0].entry_id != dead[1].entry_id
    assert all(isinstance(d.dead_at, float) and before <= d.dead_at <= time.time() for d in dead)


def test_ack_message_and_acks_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ack() of more ids than one SQL chunk deletes every one of them and counts each once."""
    from asyncrl.transport import embedded

    monkeypatch.setattr(embedded, "_ACK_CHUNK", 2)
    q = Backend(kind="embedded", run_dir=tmp_path / "run", opened=[]).make()
    with pytest.raises(TypeError, match=r"^ack\(\) takes a sequence of entry ids, not a single string$"):
        q.ack("1")
    with pytest.raises(ValueError, match=r"^'x1' is not an entry id of this queue$"):
        q.ack(["x1"])
    for i in range(5):
        q.put(make_traj(f"t{i}"))
    batch = q.get_batch(5)
    q.ack([d.entry_id for d in batch])
    assert q.depth() == 0 and q.stats().acked_total == 5
    q.close()


def test_embedded_lease_records_its_owner_and_survives_a_missing_payload(tmp_path: Path) -> None:
    """The consumer's name is stored with its lease (for whoever inspects queue.sqlite), and an entry
    whose payload row is gone is dead-lettered with an empty payload instead of crashing the consumer."""
    b = Backend(kind="embedded", run_dir=tmp_path / "run", opened=[])
    q = b.make()
    q.put(make_traj("kept"))
    q.put(make_traj("hollow"))
    conn = sqlite3.connect(tmp_path / "run" / QUEUE_FILENAME, isolation_level=None)
    try:
        conn.execute("DELETE FROM payloads WHERE seq = (SELECT seq FROM entries WHERE group_id = 'hollow')")
        batch = q.get_batch(10, consumer="trainer-7")
        assert [d.group.id for d in batch] == ["kept"]
        q.put(make_traj("later"))
        assert [d.group.id for d in q.get_batch(10)] == ["later"]  # the default consumer's name
        owners = conn.execute("SELECT group_id, lease_owner FROM entries ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert owners == [("kept", "trainer-7"), ("later", "trainer")]
    dead = q.dead_letters()
    assert [(d.group_id, d.payload) for d in dead] == [("hollow", b"")]
    assert dead[0].reason.startswith("not a valid group record")
    for q_ in b.opened:
        q_.close()


def test_embedded_put_to_a_queue_filled_behind_its_back_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock-free fullness check can be stale (a rival filled the queue since): the check under
    the write lock refuses the put, and a queue holds exactly ``capacity`` entries."""
    q = Backend(kind="embedded", run_dir=tmp_path / "run", opened=[]).make(capacity=2)
    assert q.put(make_traj("a"), timeout=0.1) and q.put(make_traj("b"), timeout=0.1)
    assert not q.put(make_traj("c"), timeout=0.1) and q.depth() == 2
    real = q._scalar  # type: ignore[attr-defined]
    monkeypatch.setattr(
        q, "_scalar", lambda sql, *a: 0 if sql == "SELECT count(*) FROM entries" else real(sql, *a)
    )
    assert q._try_put("d", encode(make_traj("d")), 1) is False  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert q.depth() == 2
    q.close()


def test_embedded_dead_letter_reason_names_an_unexpected_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder failure that is not a RecordDecodeError is dead-lettered with its type in the reason."""
    from asyncrl.transport import base

    def boom(data: bytes) -> Group:
        raise ValueError("boom")

    q = Backend(kind="embedded", run_dir=tmp_path / "run", opened=[]).make()
    q.put(make_traj("t0"))
    monkeypatch.setattr(base, "decode_group", boom)  # the decoder every backend leases through
    assert q.get_batch(10, timeout=0.1) == []
    assert [d.reason for d in q.dead_letters()] == ["ValueError: boom"]
    q.close()


# ---- contract: multiple processes ------------------------------------------------------------
def test_multiprocess_producers_and_consumers_deliver_everything_once(
    backend: Backend, tmp_path: Path
) -> None:
    n_producers, per_producer, capacity = 3, 300, 64
    backend.make(capacity=capacity)  # create the queue before the children race to
    stop = SPAWN.Event()
    run_dir = str(backend.run_dir)
    producers = [
        SPAWN.Process(
            target=_produce,
            args=(backend.kind, run_dir, capacity, f"p{k}", per_producer, str(tmp_path / f"p{k}.log")),
        )
        for k in range(n_producers)
    ]
    consumers = [
        SPAWN.Process(
            target=_consume, args=(backend.kind, run_dir, f"c{k}", stop, str(tmp_path / f"c{k}.json"))
        )
        for k in range(2)
    ]
    try:
        for p in producers + consumers:
            p.start()
        for p in producers:
            p.join(60)
            assert p.exitcode == 0
        stop.set()
        for p in consumers:
            p.join(60)
            assert p.exitcode == 0
    finally:
        for p in producers + consumers:
            _kill(p)

    deliveries = [row for k in range(2) for row in json.loads((tmp_path / f"c{k}.json").read_text())]
    per_consumer = [len(json.loads((tmp_path / f"c{k}.json").read_text())) for k in range(2)]
    expected = {f"p{k}-{i}" for k in range(n_producers) for i in range(per_producer)}
    counts = Counter(row[0] for row in deliveries)
    assert set(counts) == expected  # nothing lost
    assert max(counts.values()) == 1  # leases are exclusive: nothing delivered twice
    assert all(row[2] == 1 for row in deliveries)
    assert len({row[1] for row in deliveries}) == len(deliveries)
    assert min(per_consumer) > 0, per_consumer  # both consumers took part
    q = backend.make()
    stats = q.stats()
    assert stats.put_total == stats.acked_total == len(expected)
    assert stats.depth == 0 and stats.redelivered_total == 0
    backend.check_integrity()


def test_killed_consumer_leases_are_redelivered(backend: Backend, tmp_path: Path) -> None:
    lease = 1.0
    q = backend.make(lease_seconds=lease)
    ids = [f"t{i}" for i in range(20)]
    for tid in ids:
        q.put(make_traj(tid))
    out = tmp_path / "held.json"
    child = SPAWN.Process(target=_hold_leases, args=(backend.kind, str(backend.run_dir), lease, 8, str(out)))
    child.start()
    try:
        _wait_for(out.exists, 30, "the consumer to lease entries")
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
    finally:
        _kill(child)
    held = json.loads(out.read_text())
    assert held == ids[:8]
    leased_at = time.monotonic()
    first = drain(q, timeout=0.0)
    assert first == ids[8:]  # the dead consumer's entries stay leased until the lease runs out
    assert q.stats().leased == 8
    redelivered = q.get_batch(20, timeout=lease + 5.0)
    assert time.monotonic() - leased_at < lease + 5.0
    assert sorted(d.group.id for d in redelivered) == sorted(held)
    assert all(d.attempts == 2 for d in redelivered)
    q.ack([d.entry_id for d in redelivered])
    assert q.depth() == 0 and q.stats().redelivered_total == 8
    backend.check_integrity()


def test_killed_producer_loses_no_acknowledged_put(backend: Backend, tmp_path: Path) -> None:
    q = backend.make(capacity=100_000)
    log = tmp_path / "producer.log"
    child = SPAWN.Process(
        target=_produce, args=(backend.kind, str(backend.run_dir), 100_000, "k", 100_000, str(log))
    )
    child.start()
    try:
        _wait_for(lambda: log.exists() and log.read_text().count("\n") >= 150, 30, "the producer to put")
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]  # mid-stream, likely mid-transaction
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
    finally:
        _kill(child)
    confirmed = set(log.read_text().split())
    delivered = drain(q)
    assert confirmed <= set(delivered), f"lost {len(confirmed - set(delivered))} confirmed puts"
    assert len(delivered) - len(confirmed) <= 1  # at most the put in flight when killed
    assert len(delivered) == len(set(delivered))
    backend.check_integrity()


# ---- throughput (printed, not asserted) ------------------------------------------------------
@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
def test_embedded_throughput(synchronous: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = 400 if synchronous == "NORMAL" else 150
    trajs = [make_traj(f"t{i}", model_tokens=400, turns=4) for i in range(n)]
    size = len(encode(trajs[0]))
    q = EmbeddedQueue(
        tmp_path / QUEUE_FILENAME,
        capacity=n,
        lease_seconds=60.0,
        busy_timeout_s=30.0,
        synchronous=synchronous,
    )  # type: ignore[arg-type]
    t0 = time.perf_counter()
    for t in trajs:
        assert q.put(t)
    put_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = 0
    while got < n:
        batch = q.get_batch(32)
        q.ack([d.entry_id for d in batch])
        got += len(batch)
    get_s = time.perf_counter() - t0
    q.close()
    with capsys.disabled():
        print(
            f"\n[queue throughput] synchronous={synchronous} {size / 1024:.1f} KB trajectories: "
            f"put {n / put_s:,.0f}/s ({n * size / put_s / 2**20:.1f} MiB/s), "
            f"get_batch(32)+ack {n / get_s:,.0f}/s"
        )
