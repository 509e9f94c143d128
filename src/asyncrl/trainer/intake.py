"""The trainer's side of the trajectory queue: de-duplication and **acknowledgement by fate**.

The rule
--------
A queue entry is one whole :class:`~asyncrl.records.Group`; fates are per member (one ledger row per
trajectory id). The trainer acknowledges an entry exactly when the *fate* of every member is durable,
and not before:

* **duplicate** — every member's id is already in the ledger (a redelivery, or a re-put of a group
  whose fates are recorded): acknowledged at once. A redelivered group of which only some members
  have a fate (dropped ones, after a crash) is held with the others, which count as missing members;
* **dropped** (stale, invalid, non-finite, evicted) or **skipped** (part of a non-finite step):
  the fate is written to the ledger now and the entry acknowledged now. Such a fate does not
  depend on the model's weights, so no checkpoint has to cover it;
* **trained**: the fate is written and the entry acknowledged right after the next checkpoint is on
  disk — the weights that learnt from it must be durable first. A group the learner left out of the
  gradient (no reward difference, ``trainer.skip_equal_reward_groups``) was consumed by its step all
  the same: its fate is ``trained`` too, on the same terms. A crash before that leaves the
  entry un-acknowledged: it is redelivered after its lease and the resumed trainer (restored to that
  checkpoint, whose consumed ids are the ledger) trains it once;
* **buffered** (no fate yet): held under its lease; an expired lease is redelivered to the trainer,
  which recognises the id and keeps holding it.

Why back-pressure cannot deadlock against the checkpoint
--------------------------------------------------------
Producers block only while ``depth ≥ capacity``. A live trainer holds at most
``T + F`` un-acknowledged entries (:func:`asyncrl.config.max_trainer_held`): ``T`` trained since the
last checkpoint — at most ``checkpoint_every − 1`` steps (the step that reaches ``checkpoint_every``
checkpoints in the same iteration), each of at most ``batch_size`` groups (a batch takes whole groups
until it holds ``batch_size`` samples, and a group holds at least one) — and ``F ≤ buffer_steps ×
batch_size`` buffered groups (the buffer evicts beyond that many samples, and an eviction is a fate). Dropped, skipped and duplicate entries are acknowledged in the
iteration that saw them, so they hold nothing. Entries leased by a dead trainer become ready after
``lease_seconds``. The config requires ``capacity ≥ T_max + F_max + 2 × batch_size``
(:func:`asyncrl.config.min_queue_capacity`), so a full queue always holds a ready (or soon-expired)
entry the trainer can take; taking it either completes a batch (a step: after at most
``checkpoint_every`` of them, a checkpoint acknowledges ``T``), or grows the buffer until an eviction
acknowledges an entry, or is dropped and acknowledged. Every case frees a slot or moves the trainer towards its checkpoint, so
the producers are never blocked forever. ``tests/test_recovery_model.py`` checks this with
Hypothesis over interleavings of put / lease / drop / train / checkpoint / crash / lease expiry.

Exactly-once training: the ledger's primary key (one fate per trajectory id) plus the rule above —
a trained fate is recorded only with the checkpoint holding its update, and every delivery of an id
in the ledger is acknowledged without training.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from asyncrl.control import Fate, RunState
from asyncrl.records import Trajectory

if TYPE_CHECKING:
    from asyncrl.trainer.buffer import ReplayBuffer
    from asyncrl.transport.base import TrajectoryQueue


class Intake:
    """Takes groups into the replay buffer and acknowledges each entry once its members' fates are durable."""

    def __init__(self, queue: TrajectoryQueue, state: RunState, *, pull_size: int) -> None:
        self.queue, self.state, self.pull_size = queue, state, pull_size
        self.done_ids: set[str] = state.ids_with_fate()
        """Trajectory ids whose fate is durable (the checkpointed consumed-id set, plus fates recorded since)."""
        self.entries: dict[str, list[str]] = {}
        """Group id -> its un-acknowledged entry ids (held: buffered, or trained since the checkpoint)."""
        self.pending: dict[str, set[str]] = {}
        """Group id -> its members without a durable fate yet (the entry is acknowledged when empty)."""
        self.group_of: dict[str, str] = {}
        """Trajectory id -> its held group's id."""
        self.trained: dict[str, tuple[int, int]] = {}
        """Trajectory id -> (step, age), trained since the last checkpoint."""

    def held(self) -> int:
        """Un-acknowledged entries this trainer holds (buffered + trained since the checkpoint)."""
        return sum(len(e) for e in self.entries.values())

    def pull(self, buffer: ReplayBuffer, timeout: float = 0.05) -> int:
        """Lease what the queue has into ``buffer``; duplicates are acknowledged at once. Returns new samples."""
        duplicates: list[str] = []
        added = 0
        for d in self.queue.get_batch(self.pull_size, timeout=timeout, consumer="trainer"):
            group = d.group
            held = self.entries.get(group.id)
            if held is not None:  # a redelivery of an entry we hold (expired lease), or a second entry
                if d.entry_id not in held:
                    held.append(d.entry_id)
                continue
            fresh = [t for t in group.members if t.id not in self.done_ids]
            if not fresh:  # every fate is durable already: nothing left to do with it
                duplicates.append(d.entry_id)
                continue
            self.entries[group.id] = [d.entry_id]
            self.pending[group.id] = {t.id for t in fresh}
            self.group_of.update((t.id, group.id) for t in fresh)
            missing = len(group.members) - len(fresh)
            group.members = fresh
            buffer.add(group, missing)
            added += len(fresh)
        if duplicates:
            self.queue.ack(duplicates)
        return added

    def _fated(self, ids: Iterable[str]) -> list[str]:
        """``ids`` have a durable fate now: the entries of the groups they completed."""
        acks: list[str] = []
        for tid in ids:
            self.done_ids.add(tid)
            gid = self.group_of.pop(tid, None)
            if gid is None:
                continue
            left = self.pending[gid]
            left.discard(tid)
            if not left:
                del self.pending[gid]
                acks += self.entries.pop(gid)
        return acks

    def settle(self, rows: Iterable[Fate]) -> None:
        """Record fates that need no checkpoint (dropped, skipped), then acknowledge the entries they complete."""
        rows = list(rows)
        if not rows:
            return
        # fate first: a crash before the ack only causes a de-duplicated redelivery
        self.state.record_fates(rows)
        self.queue.ack(self._fated(r[0] for r in rows))

    def mark_trained(self, batch: list[Trajectory], step: int, ages: list[int]) -> None:
        """Samples of a step not yet covered by a checkpoint: acknowledged by :meth:`checkpointed`."""
        for t, age in zip(batch, ages, strict=True):
            self.trained[t.id] = (step, age)

    def record_trained(self) -> list[str]:
        """First half of :meth:`checkpointed`: the trained fates into the ledger. Returns the entry ids
        of the groups they complete."""
        self.state.record_fates((tid, "trained", step, age) for tid, (step, age) in self.trained.items())
        acks = self._fated(list(self.trained))
        self.trained.clear()
        return acks

    def checkpointed(self) -> None:
        """Call once a checkpoint covering every trained step is on disk: record, then acknowledge."""
        self.queue.ack(self.record_trained())
