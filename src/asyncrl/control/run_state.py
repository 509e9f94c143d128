"""The run's shared control state, typed: the one interface every role uses.

The rollout workers, the trainer, the evaluator, the launcher's services and the orchestrator share
a few numbers, flags, a ledger and two documents. They live in a :class:`~asyncrl.control.store.StateStore`
(SQLite by default, Redis for several machines), but no role names a key: each reads and writes
through :class:`RunState`, whose methods say what happens — :meth:`RunState.admit` a group,
:meth:`RunState.release` admissions, read the :meth:`RunState.effective_max_staleness`, :meth:`RunState.paused`,
announce a version. The staleness rules (:mod:`asyncrl.staleness`) are applied here, in
one place, against those numbers.

What is stored (the key names are private to this module):

* the **admission budget** — ``admitted`` (episodes granted), ``dropped`` (samples the trainer dropped
  or skipped), ``released`` (admissions given back: held-out probes, episodes that produced nothing,
  a dead worker's in-flight episodes), and per worker ``inflight:NAME`` (admitted, not yet delivered);
* the **versions** — ``version`` (the trainer's newest), ``published`` and ``versions_published`` /
  ``versions_republished``, ``weights_corrupt`` (highest version a worker found corrupt, + 1);
* the **effective limits** — ``max_staleness`` and ``sync_every`` (rule 6: the orchestrator may
  tighten them);
* **flags** — ``paused`` (queue above high water), ``stop`` (end of run: every role stops),
  ``trainer_done``, ``halt`` (someone asked the orchestrator to stop the run: ``asyncrl stop``;
  ``halt_now`` without the grace period);
* **liveness** — ``orchestrator_at``, the orchestrator's heartbeat (every role stops by itself when it
  is older than ``launcher.orphan_timeout_s``: no orphans), and ``trainer_step``;
* **load balancing** — ``load:NAME`` and its heartbeat ``load_at:NAME``;
* the **ledger** — one fate per trajectory id (``trained``, ``dropped_*``, ``skipped``, ...);
* **documents** — the orchestrator's :class:`~asyncrl.control.directives.Directives` and its own
  snapshot (restored on ``--resume``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.control.directives import Directives
from asyncrl.control.store import StateStore, make_state_store
from asyncrl.staleness import StalenessPolicy

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

Fate = tuple[str, str, int, int]
"""A ledger row: ``(trajectory id, fate, trainer step, age)``."""

_DIRECTIVES, _SNAPSHOT = "control", "orchestrator"
_WATCH_EVERY_S = 1.0
"""A role reads the orchestrator's heartbeat at most this often."""

log = logging.getLogger("asyncrl.control")


@dataclass(frozen=True)
class Tallies:
    """The run's totals, for the summary and the fault tests."""

    admitted: int
    duplicates: int
    """Ledger inserts of an id that already had a fate (each is a redelivery that was not trained)."""
    versions_published: int
    versions_republished: int
    last_published: int
    resumes: int


class RunState:
    """Typed access to the shared control state of one run (module docstring). Every method is atomic
    across processes; several processes each open their own."""

    def __init__(self, store: StateStore, staleness: StalenessPolicy, sync_every: int) -> None:
        self.store, self.staleness, self.sync_every = store, staleness, sync_every
        self._orphan_after: float | None = None
        self._watched_at, self._orphaned = 0.0, False
        self._stop_here = False

    @classmethod
    def open(cls, cfg: RunConfig, run_dir: str | Path) -> RunState:
        """The run's state, in the store ``control.state`` names."""
        return cls(make_state_store(cfg, run_dir), cfg.staleness_policy(), cfg.trainer.sync_every)

    @classmethod
    def for_role(cls, cfg: RunConfig, run_dir: str | Path) -> RunState:
        """A role process's view: :meth:`open`, and :meth:`stopping` also turns true once the
        orchestrator's heartbeat is older than ``launcher.orphan_timeout_s`` (no orphans)."""
        state = cls.open(cfg, run_dir)
        state._orphan_after = cfg.launcher.orphan_timeout_s
        return state

    def close(self) -> None:
        self.store.close()

    # -- the run's life -------------------------------------------------------------------------
    def begin(self, resume: bool) -> None:
        """The orchestrator starts (or resumes) the run: clear ``stop``; a fresh run starts at version 0
        with the configured ``max_staleness``."""
        self.store.set_flag("stop", False)
        self.beat()
        if not resume:
            self.store.set_value("max_staleness", self.staleness.max_staleness)
            self.store.set_value("version", 0)

    def holds_a_run(self) -> bool:
        """Anything stored yet (a Redis prefix already used by another run)."""
        return bool(self.store.counters())

    def stopping(self) -> bool:
        """The run is ending (the ``stop`` flag), or — in a role process — its orchestrator is gone."""
        return self._stop_here or self.store.flag("stop") or self.orphaned()

    def stop_here(self) -> None:
        """This process alone stops at its next safe point (a role service sent SIGTERM by its manager)."""
        self._stop_here = True

    # -- liveness: no orphans ----------------------------------------------------------------------
    def beat(self, now: float | None = None) -> None:
        """The orchestrator is alive (every tick)."""
        self.store.set_value("orchestrator_at", int(now if now is not None else time.time()))

    def orchestrator_silent_s(self, now: float | None = None) -> float | None:
        """Seconds since the orchestrator's last heartbeat; None if it never beat."""
        at = self.store.get("orchestrator_at")
        return None if not at else (now if now is not None else time.time()) - at

    def orphaned(self) -> bool:
        """A role whose orchestrator has been silent longer than ``launcher.orphan_timeout_s`` (only for
        states opened with :meth:`for_role`; the heartbeat is read at most once a second). Sticky: a
        role that saw its orchestrator gone stops, even if a resumed one beats again meanwhile."""
        if self._orphan_after is None or self._orphaned:
            return self._orphaned
        now = time.time()
        if now - self._watched_at < _WATCH_EVERY_S:
            return False
        self._watched_at = now
        silent = self.orchestrator_silent_s(now)
        if silent is not None and silent > self._orphan_after:
            log.warning(
                "the orchestrator has not been seen for %.0f s (launcher.orphan_timeout_s=%.0f): this role stops",
                silent,
                self._orphan_after,
            )
            self._orphaned = True
        return self._orphaned

    def request_halt(self, now: bool = False) -> None:
        """Ask the orchestrator to stop the run as a signal would (``asyncrl stop``); ``now``: no grace."""
        self.store.set_flag("halt_now" if now else "halt", True)

    def halt_requested(self) -> tuple[bool, bool]:
        """(a stop was asked for, without grace) — cleared once the run is stopped (a stop asked for while
        the run is being prepared is honoured when its supervision begins)."""
        return self.store.flag("halt") or self.store.flag("halt_now"), self.store.flag("halt_now")

    def request_stop(self) -> None:
        self.store.set_flag("stop", True)

    def trainer_finished(self) -> bool:
        return self.store.flag("trainer_done")

    def mark_trainer_finished(self) -> None:
        self.store.set_flag("trainer_done", True)

    # -- flow control ----------------------------------------------------------------------------
    def paused(self) -> bool:
        """Admission paused: the queue is above high water."""
        return self.store.flag("paused")

    def set_paused(self, paused: bool) -> None:
        if self.store.flag("paused") != paused:
            self.store.set_flag("paused", paused)

    def effective_max_staleness(self) -> int:
        """The ``max_staleness`` in force (rule 6: never above the configured one)."""
        return self.store.get("max_staleness", self.staleness.max_staleness)

    def effective_sync_every(self) -> int:
        """Publish every this many trainer steps (rule 6: the orchestrator may lower it)."""
        return self.store.get("sync_every", self.sync_every)

    def set_effective(self, max_staleness: int, sync_every: int) -> None:
        self.store.set_value("max_staleness", max_staleness)
        self.store.set_value("sync_every", sync_every)

    # -- admission (rule 1) ------------------------------------------------------------------------
    def admit(self, worker: str, group: int, worker_version: int) -> bool:
        """Admit ``group`` episodes on ``worker`` (weights at ``worker_version``) if the staleness budget
        allows — the budget check and the grant are one transaction, so two workers never share the last
        slot; then they count as ``worker``'s in flight until delivered (a second write: a crash in between
        loses the admission to the budget, as before)."""
        if self.paused() or self.stopping():
            return False
        bound = self.effective_max_staleness()

        def limit(c: dict[str, int]) -> int:
            budget = self.staleness.admission_limit(c.get("version", 0), bound, worker_version=worker_version)
            return budget + c.get("dropped", 0) + c.get("released", 0) + c.get("beyond_batch", 0)

        if not self.store.try_add_within("admitted", group, limit):
            return False
        self.store.add(f"inflight:{worker}", group)  # returned to the budget if the worker dies
        return True

    def delivered(self, worker: str, n: int = 1) -> None:
        """``n`` admitted samples of ``worker`` are in the queue (the trainer accounts for them now)."""
        self.store.add(f"inflight:{worker}", -n)

    def release(self, worker: str, n: int) -> None:
        """``n`` admissions of ``worker`` will never reach the trainer (held-out probes, episodes that
        produced nothing): back to the budget."""
        if n:
            self.store.add("released", n)
            self.store.add(f"inflight:{worker}", -n)

    def reclaim(self, worker: str) -> int:
        """A dead worker's undelivered admissions go back to the budget, and its load to 0. Returns them."""
        lost = self.store.get(f"inflight:{worker}")
        if lost:
            self.store.add("released", lost)
            self.store.set_value(f"inflight:{worker}", 0)
        self.store.set_value(f"load:{worker}", 0)
        return lost

    def workers_in_flight(self) -> list[str]:
        """Workers holding undelivered admissions."""
        return sorted(
            k.split(":", 1)[1] for k, v in self.store.counters().items() if k.startswith("inflight:") and v
        )

    def record_dropped(self, n: int) -> None:
        """The trainer dropped (or skipped) ``n`` samples: their slots go back to the budget."""
        if n:
            self.store.add("dropped", n)

    def record_beyond_batch(self, n: int) -> None:
        """The trainer's batch held ``n`` samples beyond ``trainer.batch_size`` (whole groups larger than
        what was left to fill it, ``rollout.adaptive_group_size``): the budget counts ``batch_size`` a
        version, so those slots go back to it — without them the excess accumulates until no group fits
        and the run stalls with an empty queue."""
        if n > 0:
            self.store.add("beyond_batch", n)

    # -- versions ----------------------------------------------------------------------------------
    def version(self) -> int:
        """The trainer's newest version (the one the admission budget counts)."""
        return self.store.get("version")

    def announce_version(self, version: int) -> None:
        self.store.set_value("version", version)

    def record_step(self, step: int) -> None:
        """The trainer's optimiser steps so far (the summary's ``trainer_steps`` after a resume)."""
        self.store.set_value("trainer_step", step)

    def trainer_step(self) -> int:
        return self.store.get("trainer_step")

    def record_publish(self, version: int, *, republished: bool = False) -> None:
        self.store.set_value("published", version)
        self.store.add("versions_published", 1)
        if republished:
            self.store.add("versions_republished", 1)

    def report_corrupt(self, version: int) -> None:
        """A worker found ``version`` corrupt: raise the reported version to at least it, atomically (the
        trainer answers by publishing its current weights again as a new version)."""
        value = version + 1  # stored + 1, so that 0 means none

        def unchanged_since(cur: int) -> Callable[[dict[str, int]], int]:
            return lambda c: value if c.get("weights_corrupt", 0) == cur else -1  # a race: read again

        while (cur := self.store.get("weights_corrupt")) < value:
            if self.store.try_add_within("weights_corrupt", value - cur, unchanged_since(cur)):
                return

    def corrupt_version(self) -> int | None:
        """The highest version a worker reported corrupt, or None."""
        bad = self.store.get("weights_corrupt") - 1
        return bad if bad >= 0 else None

    def record_start(self, resumed: bool) -> None:
        """A trainer process started (``resumed``: from a checkpoint)."""
        if resumed:
            self.store.add("resumes", 1)

    # -- the ledger --------------------------------------------------------------------------------
    def record_fates(self, rows: Iterable[Fate]) -> int:
        """Record fates; returns how many ids already had one (counted in ``duplicates``)."""
        return self.store.record(rows)

    def ids_with_fate(self) -> set[str]:
        return self.store.ledger_ids()

    def fate_counts(self) -> dict[str, int]:
        return self.store.ledger_counts()

    def trained_ages(self) -> list[int]:
        """Age of every trained sample (the staleness histogram)."""
        return self.store.ages()

    # -- documents ---------------------------------------------------------------------------------
    def publish_directives(self, directives: Directives) -> None:
        self.store.put_doc(_DIRECTIVES, directives.to_doc())

    def directives(self) -> Directives:
        return Directives.from_doc(self.store.get_doc(_DIRECTIVES))

    def save_snapshot(self, doc: dict[str, Any]) -> None:
        """The orchestrator's own state, restored on ``--resume``."""
        self.store.put_doc(_SNAPSHOT, doc)

    def snapshot(self) -> dict[str, Any] | None:
        return self.store.get_doc(_SNAPSHOT)

    # -- load balancing ----------------------------------------------------------------------------
    def publish_load(self, worker: str, load: int, now: float) -> None:
        self.store.set_value(f"load:{worker}", load)
        self.store.set_value(f"load_at:{worker}", int(now))

    def live_loads(self, workers: list[str], now: float, heartbeat_s: float) -> list[int]:
        """Loads of those ``workers`` whose heartbeat is at most ``heartbeat_s`` old."""
        c = self.store.counters()
        return [c.get(f"load:{w}", 0) for w in workers if now - c.get(f"load_at:{w}", 0) <= heartbeat_s]

    # -- totals ------------------------------------------------------------------------------------
    def tallies(self) -> Tallies:
        c = self.store.counters()
        return Tallies(
            admitted=c.get("admitted", 0),
            duplicates=c.get("duplicates", 0),
            versions_published=c.get("versions_published", 0),
            versions_republished=c.get("versions_republished", 0),
            last_published=c.get("published", 0),
            resumes=c.get("resumes", 0),
        )
