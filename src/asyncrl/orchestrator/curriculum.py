"""Task buckets and the adaptive curriculum.

A **bucket** is a (task type, difficulty) pair, written ``"type:difficulty"`` (e.g.
``"arithmetic:3"``); the buckets of a run are the task source's ``task_types`` x its active
difficulties. Each bucket keeps the outcomes of its last ``window`` episodes.

Weight rule (``orchestrator.curriculum``): with ``p`` the bucket's success rate over its window,

    w = floor + (ceiling - floor) * 4 p (1 - p)            once it has >= min_episodes episodes
    w = ceiling                                            before that (unexplored buckets first)

so buckets with low-but-non-zero success (the learning frontier) rise towards ``ceiling``, and
hopeless (p = 0) and converged (p = 1) buckets fall to ``floor`` -- never to zero, so a bucket
that becomes learnable is noticed again. The orchestrator multiplies a bucket's weight by the
drift rule's down-weight while that is in force and sets it to zero while its breaker is open
(:mod:`asyncrl.control.directives`; bucket helpers: :mod:`asyncrl.control.buckets`). Workers sample a
bucket with probability proportional to its weight, then a task of that bucket; the replay buffer can
be steered to the same proportions (``curriculum.steer_buffer``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from asyncrl.config import CurriculumConfig
from asyncrl.signal import group_size_for


class Curriculum:
    """Per-bucket success windows and the weight rule of the module docstring."""

    def __init__(self, buckets: list[str], c: CurriculumConfig) -> None:
        self.c = c
        self.outcomes: dict[str, deque[int]] = {b: deque(maxlen=c.window) for b in buckets}

    def observe(self, bucket: str, success: bool) -> None:
        self.outcomes.setdefault(bucket, deque(maxlen=self.c.window)).append(int(success))

    def success(self, bucket: str) -> float | None:
        q = self.outcomes.get(bucket)
        return sum(q) / len(q) if q else None

    def weight(self, bucket: str) -> float:
        q = self.outcomes.get(bucket)
        c = self.c
        if q is None or len(q) < c.min_episodes:
            return c.ceiling
        p = sum(q) / len(q)
        return c.floor + (c.ceiling - c.floor) * 4.0 * p * (1.0 - p)

    def measured(self, bucket: str) -> float | None:
        """The bucket's success once its window holds ``min_episodes`` episodes (``None`` before)."""
        q = self.outcomes.get(bucket)
        return sum(q) / len(q) if q is not None and len(q) >= self.c.min_episodes else None

    def group_sizes(self, base: int, most: int, band_low: float) -> dict[str, int]:
        """Adaptive group size (``rollout.adaptive_group_size``): bucket -> the smallest ``G`` that gives
        half its groups a reward difference at its measured success ``p``
        (:func:`asyncrl.signal.group_size_for`), between ``base`` and ``most``, for each bucket of rare
        success (``0 < p < band_low``) that needs more than ``base``."""
        out: dict[str, int] = {}
        for b in sorted(self.outcomes):
            p = self.measured(b)
            g = group_size_for(p, 0.5) if p is not None and 0.0 < p < band_low else None
            if g is not None and g > base:
                out[b] = max(base, min(most, g))
        return out

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
    def state(self) -> dict[str, object]:
        return {"outcomes": {b: list(q) for b, q in self.outcomes.items()}}

    def restore(self, doc: dict[str, Any]) -> None:
        for b, xs in doc.get("outcomes", {}).items():
            self.outcomes[str(b)] = deque((int(x) for x in xs), maxlen=self.c.window)
