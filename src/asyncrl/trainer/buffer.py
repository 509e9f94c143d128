"""The trainer-side replay buffer: staleness admission, whole groups, and batch assembly.

* Groups arrive from the queue whole (:class:`~asyncrl.records.Group`: the samples played for one
  task) and are held and taken whole: a batch is a list of groups, and group baselines are only
  computed over whole groups.
* **Staleness** (rule 4 of :mod:`asyncrl.staleness`) is checked when a batch is
  assembled, against the trainer's version at that moment: a too-old sample is dropped (and
  reported to the caller so it can be recorded and returned to the admission budget) or kept
  for down-weighting, by config. A sample with no model tokens (an environment that failed at
  reset) is dropped as invalid; one with a non-finite reward or behaviour log-prob is dropped on
  arrival as ``dropped_non_finite`` — **the sample alone, not its group or batch**: the rest of
  its group is trained as a group with a member missing (``reward_components["group_dropped"]``,
  as for a stale member), so one bad sample costs one sample.
* **Capacity** is expressed in training steps (``capacity_steps × batch_size`` samples); beyond
  it the oldest ready groups are evicted — reported as dropped, never silently lost.
* **Sampling** of ready groups: ``fifo`` (oldest first), ``freshness`` (newest policy version
  first), ``advantage`` (groups with the largest reward spread first — they carry the most
  signal), or ``behaviour_kl`` (groups whose behaviour policy differs most from the current one,
  by a scorer the trainer supplies); ``random_fraction`` of each batch is drawn uniformly
  instead, so no group starves.
* **Mix**: with ``task_mix`` and/or ``length_mix`` set, groups are taken so that each category's
  share of the batch (task type × short/long, split at ``length_split`` tokens) is as close as
  possible to the product of the configured proportions. Keys of the form ``"type:difficulty"``
  (the orchestrator's curriculum buckets, ``orchestrator.curriculum.steer_buffer``) match task type
  and difficulty.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from asyncrl.records import Group, Trajectory
from asyncrl.staleness import StalenessPolicy

if TYPE_CHECKING:
    from asyncrl.config import RunConfig


@dataclass
class Dropped:
    traj: Trajectory
    reason: Literal["dropped_stale", "dropped_invalid", "dropped_non_finite", "dropped_evicted"]
    age: int


@dataclass
class ReplayBuffer:
    batch_size: int
    staleness: StalenessPolicy
    capacity_steps: int = field(kw_only=True)
    """``trainer.buffer_steps`` (this and the fields below: :meth:`of` reads them from the config)."""
    sampling: Literal["fifo", "freshness", "advantage", "behaviour_kl"] = field(kw_only=True)
    random_fraction: float = field(kw_only=True)
    length_split: int = field(kw_only=True)
    seed: int = field(kw_only=True)
    task_mix: dict[str, float] | None = None
    length_mix: dict[str, float] | None = None
    scorer: Callable[[list[Trajectory]], float] | None = None
    """Behaviour-KL of a group's members under the current policy (``sampling: behaviour_kl``)."""
    _groups: OrderedDict[str, Group] = field(default_factory=OrderedDict)
    _rejected: list[Dropped] = field(default_factory=list)
    _missing: dict[str, int] = field(default_factory=dict)
    """Group id -> its members dropped so far (``group_dropped`` on the members trained)."""
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @classmethod
    def of(
        cls,
        cfg: RunConfig,
        staleness: StalenessPolicy,
        scorer: Callable[[list[Trajectory]], float] | None = None,
    ) -> ReplayBuffer:
        """The trainer's buffer, as ``trainer.buffer_*`` describe it."""
        tc = cfg.trainer
        return cls(
            tc.batch_size,
            staleness,
            capacity_steps=tc.buffer_steps,
            sampling=tc.buffer_sampling,
            random_fraction=tc.buffer_random_fraction,
            task_mix=tc.buffer_task_mix,
            length_mix={str(k): v for k, v in (tc.buffer_length_mix or {}).items()} or None,
            length_split=tc.buffer_length_split,
            scorer=scorer,
            seed=cfg.seed,
        )

    def __len__(self) -> int:
        return sum(len(g.members) for g in self._groups.values())

    def add(self, group: Group, missing: int = 0) -> None:
        """Hold ``group`` (``missing``: members it had that are not in it — their fate is already
        recorded). A member with a non-finite reward or log-prob is set aside alone, reported by the
        next :meth:`take`."""
        keep = [t for t in group.members if _finite(t)]
        self._rejected += [Dropped(t, "dropped_non_finite", 0) for t in group.members if not _finite(t)]
        missing += len(group.members) - len(keep)
        if not keep:
            return
        group.members = keep
        if missing:
            self._missing[group.id] = missing
        self._groups[group.id] = group

    def take(
        self, version: int, max_staleness: int | None = None
    ) -> tuple[list[Group] | None, list[Dropped]]:
        """Assemble one batch of whole groups at trainer ``version``; returns (batch or None, dropped samples)."""
        dropped, self._rejected = self._rejected, []
        dropped += self._screen(version, max_staleness)
        # batch first, then evict: evicting first can throw away the very groups that complete a batch
        batch = self._assemble()
        dropped += self._evict()
        return batch, dropped

    def _assemble(self) -> list[Group] | None:
        if len(self) < self.batch_size:
            return None
        chosen: list[str] = []
        count = 0
        for key in self._order(list(self._groups)):
            if count >= self.batch_size:
                break
            chosen.append(key)
            count += len(self._groups[key].members)
        return [self._pop(k) for k in chosen]

    def _pop(self, key: str) -> Group:
        self._missing.pop(key, None)
        return self._groups.pop(key)

    # -- helpers -------------------------------------------------------------------------------
    def _screen(self, version: int, max_staleness: int | None) -> list[Dropped]:
        out: list[Dropped] = []
        for key, group in list(self._groups.items()):
            keep: list[Trajectory] = []
            for t in group.members:
                oldest = t.oldest_version()
                if oldest is None:
                    out.append(Dropped(t, "dropped_invalid", 0))
                elif self.staleness.stale_policy == "drop" and self.staleness.too_stale(
                    version, oldest, max_staleness
                ):
                    out.append(Dropped(t, "dropped_stale", self.staleness.age(version, oldest)))
                else:
                    keep.append(t)
            missing = self._missing.get(key, 0) + len(group.members) - len(keep)
            if not keep:
                self._pop(key)
                continue
            if missing:
                self._missing[key] = missing
                for t in keep:
                    t.reward_components["group_dropped"] = float(missing)
            group.members = keep
        return out

    def _evict(self) -> list[Dropped]:
        out: list[Dropped] = []
        limit = self.capacity_steps * self.batch_size
        while len(self) > limit and self._groups:
            key = next(iter(self._groups))
            out += [Dropped(t, "dropped_evicted", 0) for t in self._pop(key).members]
        return out

    def _order(self, ready: list[str]) -> list[str]:
        if self.sampling == "freshness":
            ordered = sorted(
                ready, key=lambda k: -min(t.oldest_version() or 0 for t in self._groups[k].members)
            )
        elif self.sampling == "advantage":
            ordered = sorted(ready, key=lambda k: -self._spread(k))
        elif self.sampling == "behaviour_kl" and self.scorer is not None:
            scorer = self.scorer
            ordered = sorted(ready, key=lambda k: -scorer(self._groups[k].members))
        else:
            ordered = list(ready)
        if self.random_fraction > 0 and len(ordered) > 1:
            n_random = round(self.random_fraction * len(ordered))
            picked = self._rng.sample(ordered, n_random)
            ordered = picked + [k for k in ordered if k not in picked]
        if self.task_mix or self.length_mix:
            ordered = self._mix(ordered)
        return ordered

    def _spread(self, key: str) -> float:
        rewards = [t.final_reward for t in self._groups[key].members]
        return statistics.pstdev(rewards) if len(rewards) > 1 else 0.0

    def _category(self, key: str) -> tuple[str, str]:
        group = self._groups[key].members
        t0 = group[0].task
        bucketed = any(":" in k for k in self.task_mix or {})  # curriculum bucket keys
        task = (f"{t0.task_type}:{t0.difficulty}" if bucketed else t0.task_type) if self.task_mix else "*"
        mean_len = sum(len(t.token_ids()) for t in group) / len(group)
        length = ("long" if mean_len > self.length_split else "short") if self.length_mix else "*"
        return task, length

    def _mix(self, ordered: list[str]) -> list[str]:
        """Greedy: repeatedly take the next group of the category furthest below its target share."""

        def shares(mix: dict[str, float] | None) -> dict[str, float]:
            if not mix:
                return {"*": 1.0}
            total = sum(mix.values()) or 1.0
            return {k: v / total for k, v in mix.items()}

        tasks, lengths = shares(self.task_mix), shares(self.length_mix)
        target = {(t, b): tasks[t] * lengths[b] for t in tasks for b in lengths}
        taken: dict[tuple[str, str], int] = {}
        queue = list(ordered)
        out: list[str] = []
        while queue:
            n = sum(taken.values()) or 1

            def deficit(key: str, n: int = n) -> float:
                cat = self._category(key)
                return target.get(cat, 0.0) - taken.get(cat, 0) / n

            best = max(queue, key=deficit)
            queue.remove(best)
            out.append(best)
            cat = self._category(best)
            taken[cat] = taken.get(cat, 0) + len(self._groups[best].members)
        return out


def _finite(traj: Trajectory) -> bool:
    """Whether the reward and every behaviour log-prob of ``traj`` are finite numbers."""
    if not math.isfinite(traj.final_reward):
        return False
    return all(math.isfinite(x) for turn in traj.turns if turn.logprobs for x in turn.logprobs)
