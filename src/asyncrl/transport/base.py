"""The trajectory queue interface between rollout workers (producers) and the trainer (consumer).

An entry is one :class:`~asyncrl.records.Group`: the samples played for one task, whole. A
half-delivered group cannot exist — the worker puts the group in one durable write, and the
trainer acknowledges the entry once every member's fate is durable (fates are per member).

Delivery semantics (every backend)
----------------------------------
* **At-least-once.** An entry accepted by :meth:`TrajectoryQueue.put` (it returned ``True``)
  is durable and is delivered until somebody acknowledges it. A consumer that takes entries
  with :meth:`~TrajectoryQueue.get_batch` holds a *lease* on them; if it does not
  :meth:`~TrajectoryQueue.ack` them within the lease (it crashed, hung or was killed), they
  become ready again and are redelivered with ``attempts + 1``. The same group can
  therefore reach the trainer more than once: **the consumer de-duplicates by trajectory id**
  (each member of ``Delivery.group``), and acks every delivery, duplicate or not.
* **Idempotent producers.** Putting a group whose id is already queued (ready or leased)
  is a no-op that returns ``True``, so a producer may retry a put whose outcome it does not
  know. Once an entry is acked it is gone; a later put of the same id enqueues it again
  (the consumer's de-duplication covers that case too).
* **Exclusive leases.** While a lease is live, no other consumer receives that entry.
* **Back-pressure.** At most ``capacity`` un-acked entries — groups — (ready + leased) exist; ``put``
  blocks beyond that until entries are acked, or returns ``False`` at its timeout.
* **Poison entries never block the queue.** A stored entry that does not decode or validate
  as a current :class:`~asyncrl.records.Group` is moved to a dead-letter area with the
  reason, counted, and skipped; the rest of the batch is delivered.
* **Order** is FIFO by enqueue time on a best-effort basis; redelivered entries come back in
  the order their leases expired. Nothing depends on order.

Ack ids (:attr:`Delivery.entry_id`) are opaque strings assigned by the backend; they are
never reused, so a late ack of an expired lease can never remove a different entry.

The interface maps onto Redis Streams: ``put`` = idempotency check + ``XADD``, ``get_batch``
= ``XAUTOCLAIM`` (expired leases) then ``XREADGROUP`` (new entries), ``ack`` = ``XACK`` +
``XDEL``, ``attempts`` = the PEL delivery counter. See ``docs/transport.md``.
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.errors import UserError
from asyncrl.records import Group, RecordDecodeError, decode_group, encode
from asyncrl.telemetry.reports import QueueStats


class QueueClosedError(RuntimeError):
    """An operation was attempted on a queue after :meth:`TrajectoryQueue.close`."""


class BackendUnavailableError(UserError, NotImplementedError):
    """The configured transport backend is not available in this build."""


@dataclass(frozen=True)
class Delivery:
    """One leased entry handed to a consumer."""

    entry_id: str
    """Queue-assigned id; pass it to :meth:`TrajectoryQueue.ack`."""
    group: Group
    """The decoded, validated group (every member's ``lifecycle.dequeued`` stamped at this delivery)."""
    attempts: int
    """1 on first delivery, 2 after one expired lease, ..."""


@dataclass(frozen=True)
class DeadLetter:
    """An entry set aside because it could not be delivered as a valid group."""

    entry_id: str
    group_id: str
    """Id the producer stored the entry under (the payload itself may not be readable)."""
    reason: str
    payload: bytes
    """The raw stored bytes, for inspection."""
    attempts: int
    """Deliveries attempted before it was set aside."""
    dead_at: float
    """Wall-clock time it was set aside."""


_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.020


def backoff_sleep(attempt: int, deadline: float | None) -> None:
    """Sleep 5 ms growing to 20 ms (with jitter), never past ``deadline``: how blocked producers and
    idle consumers poll without busy-spinning."""
    delay = min(_POLL_MAX_S, _POLL_MIN_S * (1.5**attempt)) * random.uniform(0.8, 1.2)
    if deadline is not None:
        delay = min(delay, max(0.0, deadline - time.monotonic()))
    time.sleep(delay)


def check_batch_args(max_items: int, timeout: float) -> None:
    if max_items < 1:
        raise ValueError(f"max_items must be >= 1, got {max_items}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")


def leased_group(payload: bytes, group_id: str, now: float) -> Group | str:
    """A leased entry's group, its members stamped dequeued at ``now``; or, for a poison entry (a payload
    that does not decode, or whose id is not the entry's), why, for its dead letter. Never raises: poison
    must never crash the consumer."""
    try:
        group = decode_group(payload)
    except Exception as exc:
        return str(exc) if isinstance(exc, RecordDecodeError) else f"{type(exc).__name__}: {exc}"
    if group.id != group_id:
        return f"payload id {group.id!r} differs from the entry's id {group_id!r}"
    for member in group.members:
        member.lifecycle.dequeued = now
    return group


COUNTERS = (
    "put_total",
    "acked_total",
    "redelivered_total",
    "bytes_in",
    "samples_in",
    "samples_acked",
    "samples_dead",
)
"""The queue-wide totals every backend keeps (besides the dead letters never put: ``dead_foreign_total``)."""


def stats_of(depth: int, ready: int, dead: int, counters: dict[str, int], capacity: int) -> QueueStats:
    """The :class:`QueueStats` every backend's :meth:`TrajectoryQueue.stats` returns."""
    return QueueStats(
        depth=float(depth),
        ready=float(ready),
        leased=float(depth - ready),
        dead_letters=float(dead),
        # dead letters never accepted by put (written into the store from outside): not the run's to account
        dead_letters_foreign=float(counters.get("dead_foreign_total", 0)),
        capacity=float(capacity),
        **{name: float(counters.get(name, 0)) for name in COUNTERS},
    )


class TrajectoryQueue(ABC):
    """A durable, multi-producer multi-consumer, at-least-once queue of trajectory groups.

    Every method is safe to call from several threads of one process, and several processes
    may open the same queue at once (each opens its own handle with :func:`make_queue`).
    """

    def __init__(self, capacity: int, lease_seconds: float) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds}")
        self.capacity = capacity
        self.lease_seconds = float(lease_seconds)

    def put(self, group: Group, timeout: float | None = None) -> bool:
        """Enqueue ``group`` durably, whole; stamps each member's ``lifecycle.enqueued`` (on the caller's objects).

        Blocks while ``capacity`` un-acked entries exist. ``timeout=None`` waits forever,
        ``0`` tries once. Returns ``True`` once the entry is committed (or was already queued
        under the same id), ``False`` if the queue stayed full until the timeout.
        Raises ``ValueError`` (``RecordDecodeError``/``RecordEncodeError``) for a group
        that could never be decoded by the consumer.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
        group.validate()  # fail at the producer, not as a dead letter at the trainer
        deadline = None if timeout is None else time.monotonic() + timeout
        stamp = time.time()
        for member in group.members:
            member.lifecycle.enqueued = stamp
        payload = encode(group)
        attempt = 0
        while not self._try_put(group.id, payload, len(group.members)):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            backoff_sleep(attempt, deadline)
            attempt += 1
        return True

    @abstractmethod
    def _try_put(self, group_id: str, payload: bytes, members: int) -> bool:
        """One attempt: commit ``payload`` (a group of ``members`` samples) under ``group_id`` (True), find it already queued (True),
        or find the queue full (False)."""

    @abstractmethod
    def get_batch(self, max_items: int, timeout: float = 0.0, consumer: str = "trainer") -> list[Delivery]:
        """Lease up to ``max_items`` ready entries to ``consumer``.

        Expired leases of any consumer count as ready. Returns as soon as at least one entry
        is available, or an empty list after ``timeout`` seconds (``0``: do not wait).
        Undecodable entries are dead-lettered on the way and never raise.
        """

    def ack(self, entry_ids: Sequence[str]) -> None:
        """Acknowledge (and delete) delivered entries. Unknown or already-acked ids are ignored; a string
        that is no entry id of this backend is a ``ValueError``."""
        if isinstance(entry_ids, str):
            raise TypeError("ack() takes a sequence of entry ids, not a single string")
        ids = list(entry_ids)
        if ids:
            self._ack(ids)

    @abstractmethod
    def _ack(self, entry_ids: list[str]) -> None:
        """:meth:`ack` of a non-empty list."""

    @abstractmethod
    def depth(self) -> int:
        """Un-acked entries: ready + leased (what back-pressure counts)."""

    @abstractmethod
    def stats(self) -> QueueStats:
        """Gauges and counters (totals are queue-wide, all processes)."""

    @abstractmethod
    def dead_letters(self) -> list[DeadLetter]:
        """Entries set aside as undeliverable, oldest first."""

    @abstractmethod
    def unacked_payloads(self) -> list[bytes]:
        """The payloads of the un-acked entries (ready or leased), oldest first; leases untouched."""

    def unacked_members(self) -> list[str]:
        """Member ids of the un-acked entries that decode (read-only: for the end-of-run accounting, where
        a group redelivered after a crash can be held with some members' fates already recorded)."""
        out: list[str] = []
        for payload in self.unacked_payloads():
            try:
                out += [t.id for t in decode_group(payload).members]
            except Exception:  # poison: counted by its entry's member count alone
                continue
        return out

    @abstractmethod
    def close(self) -> None:
        """Release this handle's resources. Idempotent; the queue's contents persist."""
