"""Staleness: the single statement of asyncrl's off-policy rules. Every role calls these functions.

It sits on the lowest floor (it imports nothing of asyncrl), so that the configuration
(``RunConfig.staleness_policy``, the ``sync_every`` check), the report and every role above ask this
one module — none re-derives a rule (``tests/test_architecture.py`` checks that no other module
compares ``mode`` or maps ``sync``/``one_step_off`` to a bound).

Definitions
-----------
* A **version** is the trainer step count of a set of weights. Version 0 is the warm start;
  the trainer publishes version ``v`` after its ``v``-th optimiser step (every ``sync_every``
  steps, so published versions are multiples of ``sync_every``).
* The **age** of a sample, when the trainer is at version ``v``, is ``v − oldest``, where
  ``oldest`` is the oldest version that produced any of its tokens (a multi-turn episode can
  span several versions when weights are updated between its turns).
* The **bound** is ``max_staleness`` (``control.max_staleness``): the largest age a trained sample may
  have, and how far a worker's weights may fall behind the newest version. The code says *age* for
  the distance and *bound* (or ``max_staleness``) for the limit, never "lag", which read as either.

Rules
-----
1. **Admission (who may start what).** A worker whose weights are at version ``w`` may start an
   episode only if, counting it,
   ``admitted − dropped ≤ (max_staleness + min(v, w) + 1) × batch_size`` where ``admitted``
   counts every episode ever started, ``dropped`` every sample the trainer dropped (plus
   admissions of a dead worker, returned by the orchestrator, and the episodes a batch of whole groups
   held beyond ``batch_size``, which the batch took early), and ``v`` is the trainer's current
   version. Episodes are admitted a whole group at a time, atomically across all workers. Why:
   in admission order, episode number ``n`` (net of drops) falls into batch ``⌊n / batch_size⌋``,
   which is trained at that version, and its oldest token comes from ``w`` (or later, with
   in-flight updates), so the bound makes its age at most ``max_staleness``. AReaL's rule uses
   ``v`` alone, which assumes every worker is on the newest weights; in ``one_step_off`` a worker
   still finishing episodes on ``v − 1`` would then admit episodes for batch ``v + 1`` — age 2,
   dropped (a third of all samples were). With ``max_staleness = 0`` exactly one batch is
   generated per version: the synchronous schedule. The budget never stalls the trainer: the batch
   it waits for, ``v``, fits under the limit of any worker with ``w ≥ v − max_staleness`` (rule 2
   and ``sync_every ≤ max_staleness + 1`` keep workers there); samples that arrive out of order
   (stragglers) may still age out under rule 4. ``w`` is the worker's newest *usable* version: when
   the newest versions are corrupt the worker keeps an older one and reports the corrupt version; the
   trainer then publishes its current weights again as a new version, so ``w`` catches up and this
   rule cannot stop both sides (``max_staleness + 1`` corrupt versions in a row did, before).
2. **Refresh before starting.** A worker whose weights are behind the newest version by more than
   ``max_staleness`` loads the newest weights before it starts another episode. The gateway answers
   an agent's call only with weights within that bound (:meth:`StalenessPolicy.admits_call`): it
   refreshes first (async), else holds the call or answers 429. A worker that
   may load weights now (in-flight updates, or no episode running) loads any newer version before
   admission, so rule 1 counts it against the freshest weights; in ``one_step_off`` and ``sync`` a
   worker refused admission finishes its running episodes, then loads and is admitted again.
3. **In-flight updates.** In ``async`` mode a worker also loads new weights between the turns of
   running episodes (each turn records the version that produced it); in ``one_step_off`` and
   ``sync`` it loads only before starting new episodes.
4. **Too old to train (what happens to it).** When a batch is assembled at version ``v``, a sample
   with ``age > max_staleness`` is *dropped* (counted, recorded in the ledger, and returned to
   the admission budget) when ``stale_policy = drop``; with ``downweight`` it is kept and the loss
   weights its tokens by ``staleness_gamma ** age``. A gateway session whose first call is more
   than ``max_staleness`` versions behind the newest weights is finished as stale at its next call
   (:meth:`StalenessPolicy.session_expired`): its samples would be dropped at assembly anyway.
5. **Modes.** ``sync``: ``max_staleness = 0`` and no in-flight updates — the barrier schedule
   (generate one batch with the current version, train, publish). ``one_step_off``:
   ``max_staleness = 1``, no in-flight updates — batch ``k+1`` is generated while batch ``k``
   trains. ``async``: the configured ``max_staleness`` with in-flight updates. Publishing every
   ``sync_every`` steps trains a version's samples up to ``sync_every − 1`` steps later, so
   ``sync_every ≤ max_staleness + 1`` (:attr:`StalenessPolicy.max_sync_every`, checked by the config).
6. **Adaptive tightening.** The orchestrator may lower the effective ``max_staleness`` (never
   below 0, never above the configured value) when the measured mean age stays above the limit,
   and publish more often (a lower effective ``sync_every``, never above the bound + 1); every rule above
   reads the effective values from the control state. Only in ``async`` mode
   (:attr:`StalenessPolicy.adapts`): the other modes fix the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["async", "one_step_off", "sync"]


@dataclass(frozen=True)
class StalenessPolicy:
    mode: Mode
    max_staleness: int
    batch_size: int
    stale_policy: Literal["drop", "downweight"]

    @classmethod
    def from_config(
        cls, mode: Mode, max_staleness: int, batch_size: int, stale_policy: str
    ) -> StalenessPolicy:
        """Apply rule 5: the mode fixes the bound for ``sync`` and ``one_step_off``."""
        bound = {"sync": 0, "one_step_off": 1}.get(mode, max_staleness)
        policy: Literal["drop", "downweight"] = "downweight" if stale_policy == "downweight" else "drop"
        return cls(mode=mode, max_staleness=bound, batch_size=batch_size, stale_policy=policy)

    @property
    def inflight_updates(self) -> bool:
        """Rule 3."""
        return self.mode == "async"

    @property
    def barrier(self) -> bool:
        """Rule 5, ``sync``: generating and training take turns (one batch, train, publish)."""
        return self.mode == "sync"

    @property
    def adapts(self) -> bool:
        """Rule 6 applies: the orchestrator may tighten the bound (``async`` only)."""
        return self.mode == "async"

    @property
    def max_sync_every(self) -> int:
        """Rule 5: the largest ``trainer.sync_every`` the bound allows."""
        return self.max_staleness + 1

    def admission_limit(
        self, version: int, max_staleness: int | None = None, worker_version: int | None = None
    ) -> int:
        """Rule 1: the most episodes (net of drops) that may have been started when the trainer is at
        ``version`` and the starting worker's weights are at ``worker_version`` (default: the same)."""
        bound = self.max_staleness if max_staleness is None else max_staleness
        w = version if worker_version is None else min(version, worker_version)
        return (bound + w + 1) * self.batch_size

    def must_refresh(
        self, worker_version: int, latest_version: int, max_staleness: int | None = None
    ) -> bool:
        """Rule 2."""
        bound = self.max_staleness if max_staleness is None else max_staleness
        return latest_version - worker_version > bound

    def age(self, trainer_version: int, oldest_version: int) -> int:
        return max(0, trainer_version - oldest_version)

    def too_stale(self, trainer_version: int, oldest_version: int, max_staleness: int | None = None) -> bool:
        """Rule 4: True when the sample may not be trained as is."""
        bound = self.max_staleness if max_staleness is None else max_staleness
        return self.age(trainer_version, oldest_version) > bound

    def admits_call(self, worker_version: int, newest_version: int, max_staleness: int | None = None) -> bool:
        """Rule 2 for a gateway call: weights at ``worker_version`` may answer it now."""
        return not self.must_refresh(worker_version, newest_version, max_staleness)

    def session_expired(
        self, first_version: int, newest_version: int, max_staleness: int | None = None
    ) -> bool:
        """Rule 4 for a gateway session whose first call was answered by ``first_version``: True when
        it is more than ``max_staleness`` versions behind the newest weights."""
        return self.too_stale(newest_version, first_version, max_staleness)
