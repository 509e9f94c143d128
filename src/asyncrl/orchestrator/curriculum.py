"""Task buckets and the adaptive curriculum.

A **bucket** is a (task type, difficulty) pair, written ``"type:difficulty"`` (e.g.
``"arithmetic:3"``); the buckets of a run are the task source's ``task_types`` x its active
difficulties. Each bucket keeps the outcomes of its last ``window`` episodes.

Weight rule (``control.curriculum``): with ``p`` the bucket's success rate over its window,

    w = floor + (ceiling - floor) * 4 p (1 - p)            once it has >= min_episodes episodes
    w = ceiling                                            before that (unexplored buckets first)

so buckets with low-but-non-zero success (the learning frontier) rise towards ``ceiling``, and
hopeless (p = 0) and converged (p = 1) buckets fall to ``floor`` -- never to zero, so a bucket
that becomes learnable is noticed again. The orchestrator multiplies a bucket's weight by the
drift rule's down-weight while that is in force and sets it to zero while its breaker is open
(see :mod:`asyncrl.orchestrator.directives`). Workers sample a bucket with probability
proportional to its weight, then a task of that bucket; the replay buffer can be steered to the
same proportions (``curriculum.steer_buffer``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from asyncrl.config import CurriculumConfig, RunConfig
from asyncrl.records import Task


def bucket_of(task: Task) -> str:
    return f"{task.task_type}:{task.difficulty}"


def split_bucket(bucket: str) -> tuple[str, int]:
    task_type, _, difficulty = bucket.rpartition(":")
    return task_type, int(difficulty)


def buckets_of_source(source: Any, probes: int = 64) -> list[str]:
    """The buckets a task source produces: its task types x its active difficulties.

    With several task types not every pair need exist (a template may have one difficulty), so
    the source is probed: ``probes`` draws per difficulty, with a fixed seed."""
    types = tuple(getattr(source, "task_types", ()) or ())
    diffs = tuple(getattr(source, "active_difficulties", None) or getattr(source, "difficulties", ()) or ())
    if len(types) <= 1:
        return [f"{t}:{d}" for t in types for d in diffs]
    rng = random.Random(0)
    found = {bucket_of(source.sample(rng, difficulty=d)) for d in diffs for _ in range(probes)}
    return sorted(found)


def sample_in_bucket(source: Any, rng: random.Random, bucket: str, attempts: int = 200) -> Task:
    """A training task of ``bucket``: draws at the bucket's difficulty until the type matches.

    Sources draw a task type at random, so this is rejection sampling over types; after
    ``attempts`` misses it returns the last draw (of the right difficulty, another type)."""
    task_type, difficulty = split_bucket(bucket)
    task = source.sample(rng, difficulty=difficulty)
    for _ in range(attempts - 1):
        if task.task_type == task_type:
            break
        task = source.sample(rng, difficulty=difficulty)
    return task  # type: ignore[no-any-return]


def weighted_choice(weights: dict[str, float], rng: random.Random) -> str | None:
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return None
    x = rng.random() * total
    for bucket, w in sorted(weights.items()):
        if w <= 0:
            continue
        x -= w
        if x <= 0:
            return bucket
    return max(weights, key=lambda b: weights[b])


class Curriculum:
    """Per-bucket success windows and the weight rule of the module docstring."""

    def __init__(self, buckets: list[str], c: CurriculumConfig) -> None:
        self.window, self.min_episodes, self.floor, self.ceiling = (
            c.window,
            c.min_episodes,
            c.floor,
            c.ceiling,
        )
        self.outcomes: dict[str, deque[int]] = {b: deque(maxlen=c.window) for b in buckets}

    @classmethod
    def of(cls, cfg: RunConfig, buckets: list[str]) -> Curriculum:
        return cls(buckets, cfg.control.curriculum)

    def observe(self, bucket: str, success: bool) -> None:
        self.outcomes.setdefault(bucket, deque(maxlen=self.window)).append(int(success))

    def success(self, bucket: str) -> float | None:
        q = self.outcomes.get(bucket)
        return sum(q) / len(q) if q else None

    def weight(self, bucket: str) -> float:
        q = self.outcomes.get(bucket)
        if q is None or len(q) < self.min_episodes:
            return self.ceiling
        p = sum(q) / len(q)
        return self.floor + (self.ceiling - self.floor) * 4.0 * p * (1.0 - p)

    def weights(self) -> dict[str, float]:
        return {b: self.weight(b) for b in sorted(self.outcomes)}

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in sorted(self.outcomes):
            out[f"curriculum/weight/{b}"] = self.weight(b)
            s = self.success(b)
            if s is not None:
                out[f"curriculum/success/{b}"] = s
        return out

    # -- snapshot --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"outcomes": {b: list(q) for b, q in self.outcomes.items()}}

    def restore(self, doc: dict[str, Any]) -> None:
        for b, xs in doc.get("outcomes", {}).items():
            self.outcomes[str(b)] = deque((int(x) for x in xs), maxlen=self.window)
