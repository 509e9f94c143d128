"""The orchestrator <-> rollout-worker channel: directives one way, group reports the other.

Directives
----------
The orchestrator publishes one typed document, :class:`Directives` (through
:meth:`asyncrl.control.RunState.publish_directives`): ``weights`` per bucket, the ``open`` and
``half_open`` breakers, the ``exploration`` settings, the ``heldout_rate``, the live ``workers`` and
those told to ``retire``. ``weights`` are the curriculum weights times the drift down-weights, 0 for
open breakers and the curriculum floor for half-open ones (:func:`compose`). Each worker reads it
(at most every ``control.refresh_s``) through :class:`WorkerControl`, which also

* picks the next task: with probability ``heldout_rate`` a held-out probe (run, reported, never
  trained); else with probability ``exploration_rate`` an exploration task (hardest difficulty
  among the sampled buckets); else a bucket by weight and a task of that bucket;
* applies **load balancing**: a worker's load is its in-flight episode steps (for each running
  episode, the model turns it may still take: ``max_turns - turns taken``), published with a
  heartbeat (:meth:`~asyncrl.control.RunState.publish_load`). A worker may start a group only if its
  load is less than one group's worth (``group_size x max_turns``) above the smallest load among the
  live workers named in ``workers`` (heartbeat within ``control.heartbeat_s``), so new groups go to
  the least-loaded worker by steps, not by episode count;
* tells a worker named in ``retire`` to stop starting groups (elastic scale-down).

Group reports
-------------
A worker reports each finished group as one ``rollout/group`` metric event (:func:`group_report`):
the rules (curriculum, breakers, drift, exploration) consume exactly these fields.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.control.buckets import (
    bucket_of,
    buckets_of_source,
    sample_in_bucket,
    split_bucket,
    weighted_choice,
)
from asyncrl.records import Task, Trajectory

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.control.run_state import RunState


@dataclass(frozen=True)
class Exploration:
    """The exploration settings in force (the orchestrator may raise them above the config's)."""

    temperature_jitter: float
    exploration_rate: float


@dataclass(frozen=True)
class Directives:
    """What the orchestrator tells every rollout worker (module docstring). ``exploration`` None: the
    config's own settings (no orchestrator has spoken yet)."""

    weights: dict[str, float] = field(default_factory=dict)
    open: list[str] = field(default_factory=list)
    half_open: list[str] = field(default_factory=list)
    exploration: Exploration | None = None
    heldout_rate: float = 0.0
    workers: list[str] = field(default_factory=list)
    retire: list[str] = field(default_factory=list)
    at: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> Directives:
        if not doc:
            return cls()
        x = doc.get("exploration") or None
        return cls(
            weights={str(b): float(w) for b, w in (doc.get("weights") or {}).items()},
            open=[str(b) for b in doc.get("open", [])],
            half_open=[str(b) for b in doc.get("half_open", [])],
            exploration=Exploration(float(x["temperature_jitter"]), float(x["exploration_rate"]))
            if x
            else None,
            heldout_rate=float(doc.get("heldout_rate", 0.0)),
            workers=[str(w) for w in doc.get("workers", [])],
            retire=[str(w) for w in doc.get("retire", [])],
            at=float(doc.get("at", 0.0)),
        )


def compose(
    weights: dict[str, float],
    drift_factors: dict[str, float],
    open_buckets: list[str],
    half_open: list[str],
    floor: float,
    exploration: Exploration | None,
    heldout_rate: float,
    workers: list[str],
    retire: list[str],
) -> Directives:
    w = {b: x * drift_factors.get(b, 1.0) for b, x in weights.items()}
    for b in half_open:
        w[b] = floor
    for b in open_buckets:
        w[b] = 0.0
    return Directives(
        weights=w,
        open=sorted(open_buckets),
        half_open=sorted(half_open),
        exploration=exploration,
        heldout_rate=heldout_rate,
        workers=sorted(workers),
        retire=sorted(retire),
        at=time.time(),
    )


class WorkerControl:
    """A rollout worker's view of the orchestrator's directives (module docstring)."""

    def __init__(self, cfg: RunConfig, state: RunState, name: str, source: Any) -> None:
        self.cfg, self.state, self.name, self.source = cfg, state, name, source
        self.refresh_s = cfg.control.refresh_s
        self.doc = Directives()
        self._read_at = 0.0
        self._published = (-1, 0.0)
        self._loads: list[int] = []
        self._loads_at = 0.0
        self.buckets = buckets_of_source(source)
        self.group_steps = cfg.rollout.group_size * cfg.env.max_turns

    def directives(self) -> Directives:
        now = time.time()
        if now - self._read_at >= self.refresh_s:
            self.doc = self.state.directives()
            self._read_at = now
        return self.doc

    def _exploration(self, d: Directives) -> Exploration:
        rc = self.cfg.rollout
        return d.exploration or Exploration(rc.temperature_jitter, rc.exploration_rate)

    # -- what to run ---------------------------------------------------------------------------
    def next_task(self, rng: random.Random) -> tuple[Task, bool]:
        """(task, is_heldout_probe)."""
        d = self.directives()
        if d.heldout_rate and rng.random() < d.heldout_rate:
            return rng.choice(self.source.heldout()), True
        weights = self._weights(d)
        rate = self._exploration(d).exploration_rate
        if rate and rng.random() < rate:
            live = [b for b, w in weights.items() if w > 0] or self.buckets
            if live:
                hardest = max(split_bucket(b)[1] for b in live)
                return sample_in_bucket(
                    self.source, rng, rng.choice([b for b in live if b.endswith(f":{hardest}")])
                ), False
            return self.source.sample(rng, difficulty=self.cfg.env.max_difficulty), False
        if not self.cfg.control.curriculum.enabled and not d.open:
            return self.source.sample(rng), False
        bucket = weighted_choice(weights, rng)
        if bucket is None:
            return self.source.sample(rng), False
        return sample_in_bucket(self.source, rng, bucket), False

    def _weights(self, d: Directives) -> dict[str, float]:
        known = d.weights
        w = {b: float(known.get(b, 1.0)) for b in self.buckets} if self.buckets else dict(known)
        if not self.cfg.control.curriculum.enabled:
            w = {b: (0.0 if x == 0 else 1.0) for b, x in w.items()}
        if w and not any(x > 0 for x in w.values()):  # every bucket open: probe them all
            w = {b: 1.0 for b in w}
        return w

    def temperature_jitter(self) -> float:
        return self._exploration(self.directives()).temperature_jitter

    # -- whether to start ----------------------------------------------------------------------
    def retiring(self) -> bool:
        return self.name in self.directives().retire

    def publish_load(self, load: int, force: bool = False) -> None:
        now = time.time()
        last, at = self._published
        if force or (load != last and now - at >= 0.2) or now - at > 1.0:
            self.state.publish_load(self.name, load, now)
            self._published = (load, now)

    def may_take(self, load: int) -> bool:
        """Load balancing: within one group's steps of the least-loaded live worker."""
        if not self.cfg.control.balance:
            return True
        workers = [w for w in self.directives().workers if w != self.name]
        if not workers:
            return True
        now = time.time()
        if now - self._loads_at >= 0.2:  # read at most five times a second
            self._loads = self.state.live_loads(workers, now, self.cfg.control.heartbeat_s)
            self._loads_at = now
        return not self._loads or load - min(self._loads) < self.group_steps


def anomaly_of(traj: Trajectory, reward_min: float, reward_max: float) -> str | None:
    """The anomaly kind of a finished trajectory (first guard fault, env_error, reward range) or None:
    what the circuit breakers count."""
    for turn in traj.turns:
        if turn.fault is not None:
            return str(turn.fault.kind)
    if traj.outcome == "env_error":
        return "exception"
    if not reward_min <= traj.final_reward <= reward_max:
        return "reward_range"
    return None


def group_report(
    trajs: list[Trajectory], heldout: bool, reward_min: float, reward_max: float
) -> dict[str, Any]:
    """The ``rollout/group`` event of a finished group: everything the orchestrator's rules consume."""
    return {
        "bucket": bucket_of(trajs[0].task),
        "started": min(t.lifecycle.rollout_start for t in trajs),
        "heldout": heldout,
        "outcomes": [t.outcome for t in trajs],
        "rewards": [t.final_reward for t in trajs],
        "anomalies": [anomaly_of(t, reward_min, reward_max) for t in trajs],
    }
