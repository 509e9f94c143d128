"""The orchestrator -> rollout-worker channel, through the state store.

The orchestrator writes one JSON document, ``control``::

    {"weights": {bucket: w}, "open": [bucket, ...], "half_open": [...],
     "exploration": {"temperature_jitter": x, "exploration_rate": y},
     "heldout_rate": r, "workers": [name, ...], "retire": [name, ...], "at": unix_time}

``weights`` are the curriculum weights times the drift down-weights, 0 for open breakers and the
curriculum floor for half-open ones (:func:`compose`). Each worker reads it (at most every
``refresh_s``) through :class:`WorkerControl`, which also

* picks the next task: with probability ``heldout_rate`` a held-out probe (run, reported, never
  trained); else with probability ``exploration_rate`` an exploration task (hardest difficulty
  among the sampled buckets); else a bucket by weight and a task of that bucket;
* applies **load balancing**: a worker's load is its in-flight episode steps (for each running
  episode, the model turns it may still take: ``max_turns - turns taken``), published as counter
  ``load:{name}`` with a heartbeat ``load_at:{name}``. A worker may start a group only if its load
  is less than one group's worth (``group_size x max_turns``) above the smallest load among the
  live workers named in ``workers`` (heartbeat within 5 s), so new groups go to the least-loaded
  worker by steps, not by episode count;
* tells a worker named in ``retire`` to stop starting groups (elastic scale-down).
"""

from __future__ import annotations

import random
import time
from typing import Any

from asyncrl.orchestrator.curriculum import buckets_of_source, sample_in_bucket, split_bucket, weighted_choice
from asyncrl.records import Task

DOC = "control"
HEARTBEAT_S = 5.0


def compose(
    weights: dict[str, float],
    drift_factors: dict[str, float],
    open_buckets: list[str],
    half_open: list[str],
    floor: float,
    exploration: dict[str, float],
    heldout_rate: float,
    workers: list[str],
    retire: list[str],
) -> dict[str, Any]:
    w = {b: x * drift_factors.get(b, 1.0) for b, x in weights.items()}
    for b in half_open:
        w[b] = floor
    for b in open_buckets:
        w[b] = 0.0
    return {
        "weights": w,
        "open": sorted(open_buckets),
        "half_open": sorted(half_open),
        "exploration": exploration,
        "heldout_rate": heldout_rate,
        "workers": sorted(workers),
        "retire": sorted(retire),
        "at": time.time(),
    }


class WorkerControl:
    """A rollout worker's view of the orchestrator's directives (module docstring)."""

    def __init__(self, cfg: Any, state: Any, name: str, source: Any, refresh_s: float = 0.5) -> None:
        self.cfg, self.state, self.name, self.source, self.refresh_s = cfg, state, name, source, refresh_s
        self.doc: dict[str, Any] = {}
        self._read_at = 0.0
        self._published = (-1, 0.0)
        self._counters: dict[str, int] = {}
        self._counters_at = 0.0
        self.buckets = buckets_of_source(source)
        self.group_steps = cfg.rollout.group_size * cfg.env.max_turns

    def directives(self) -> dict[str, Any]:
        now = time.time()
        if now - self._read_at >= self.refresh_s:
            self.doc = self.state.get_doc(DOC) or {}
            self._read_at = now
        return self.doc

    # -- what to run ---------------------------------------------------------------------------
    def next_task(self, rng: random.Random) -> tuple[Task, bool]:
        """(task, is_heldout_probe)."""
        d, rc = self.directives(), self.cfg.rollout
        if d.get("heldout_rate", 0.0) and rng.random() < float(d["heldout_rate"]):
            return rng.choice(self.source.heldout()), True
        weights = self._weights(d)
        rate = float(d.get("exploration", {}).get("exploration_rate", rc.exploration_rate))
        if rate and rng.random() < rate:
            live = [b for b, w in weights.items() if w > 0] or self.buckets
            if live:
                hardest = max(split_bucket(b)[1] for b in live)
                return sample_in_bucket(
                    self.source, rng, rng.choice([b for b in live if b.endswith(f":{hardest}")])
                ), False
            return self.source.sample(rng, difficulty=self.cfg.env.max_difficulty), False
        if not self.cfg.control.curriculum.enabled and not d.get("open"):
            return self.source.sample(rng), False
        bucket = weighted_choice(weights, rng)
        if bucket is None:
            return self.source.sample(rng), False
        return sample_in_bucket(self.source, rng, bucket), False

    def _weights(self, d: dict[str, Any]) -> dict[str, float]:
        known = d.get("weights") or {}
        w = {b: float(known.get(b, 1.0)) for b in self.buckets} if self.buckets else dict(known)
        if not self.cfg.control.curriculum.enabled:
            w = {b: (0.0 if x == 0 else 1.0) for b, x in w.items()}
        if w and not any(x > 0 for x in w.values()):  # every bucket open: probe them all
            w = {b: 1.0 for b in w}
        return w

    def temperature_jitter(self) -> float:
        d = self.directives()
        return float(d.get("exploration", {}).get("temperature_jitter", self.cfg.rollout.temperature_jitter))

    # -- whether to start ----------------------------------------------------------------------
    def retiring(self) -> bool:
        return self.name in self.directives().get("retire", [])

    def publish_load(self, load: int, force: bool = False) -> None:
        now = time.time()
        last, at = self._published
        if force or (load != last and now - at >= 0.2) or now - at > 1.0:
            self.state.set_value(f"load:{self.name}", load)
            self.state.set_value(f"load_at:{self.name}", int(now))
            self._published = (load, now)

    def may_take(self, load: int) -> bool:
        """Load balancing: within one group's steps of the least-loaded live worker."""
        if not self.cfg.control.balance:
            return True
        workers = [w for w in self.directives().get("workers", []) if w != self.name]
        if not workers:
            return True
        now = time.time()
        if now - self._counters_at >= 0.2:
            self._counters, self._counters_at = self.state.counters(), now
        counters = self._counters
        loads = [
            counters.get(f"load:{w}", 0)
            for w in workers
            if now - counters.get(f"load_at:{w}", 0) <= HEARTBEAT_S
        ]
        return not loads or load - min(loads) < self.group_steps
