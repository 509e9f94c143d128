"""A rollout worker's side of the directives: which task next, whether to start a group, whether to
retire. The rules are in :mod:`asyncrl.control.directives`."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from asyncrl.config import RunConfig
from asyncrl.control.buckets import (
    bucket_of,
    bucket_prior,
    buckets_of_source,
    sample_in_bucket,
    split_bucket,
    weighted_choice,
)
from asyncrl.control.directives import Directives, Exploration
from asyncrl.control.run_state import RunState
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.envs.base import TaskSource


class WorkerControl:
    """A rollout worker's view of the orchestrator's directives (module docstring)."""

    def __init__(
        self, cfg: RunConfig, state: RunState, name: str, source: TaskSource, *, curriculum: bool
    ) -> None:
        self.cfg, self.state, self.name, self.source = cfg, state, name, source
        self.curriculum = curriculum
        """``orchestrator.curriculum.enabled`` (:class:`~asyncrl.config.RolloutSettings`)."""
        self.refresh_s = cfg.control.refresh_s
        self.doc = Directives()
        self._read_at = 0.0
        self._published = (-1, 0.0)
        self._loads: list[int] = []
        self._loads_at = 0.0
        self.buckets = buckets_of_source(source)
        self.prior = bucket_prior(source)
        """``env.kind: mix``: each bucket's share from its environment's weight (curriculum weights scale it)."""
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
        if not self.curriculum and not d.open:
            return self.source.sample(rng), False
        bucket = weighted_choice(weights, rng)
        if bucket is None:
            return self.source.sample(rng), False
        return sample_in_bucket(self.source, rng, bucket), False

    def _weights(self, d: Directives) -> dict[str, float]:
        known = d.weights
        w = {b: float(known.get(b, 1.0)) for b in self.buckets} if self.buckets else dict(known)
        if not self.curriculum:
            w = {b: (0.0 if x == 0 else 1.0) for b, x in w.items()}
        if w and not any(x > 0 for x in w.values()):  # every bucket open: probe them all
            w = {b: 1.0 for b in w}
        if self.prior:
            w = {b: x * self.prior.get(b, 0.0) for b, x in w.items()}
        return w

    def group_size(self, task: Task, heldout: bool) -> int:
        """Episodes of the group to play for ``task``: its bucket's adaptive size for a training group
        (``rollout.adaptive_group_size``; the orchestrator decides, :mod:`asyncrl.control.directives`),
        else ``rollout.group_size``."""
        base = self.cfg.rollout.group_size
        return base if heldout else self.directives().group_sizes.get(bucket_of(task), base)

    def temperature_factor(self, task: Task) -> float:
        """The factor on ``rollout.sampling.temperature`` for ``task``'s episodes: its bucket's entry in the
        directives (``orchestrator.signal.raise_temperature``), else 1."""
        return self.directives().temperature_factors.get(bucket_of(task), 1.0)

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
