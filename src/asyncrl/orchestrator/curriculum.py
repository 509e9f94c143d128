"""Task buckets and the adaptive curriculum.

A **bucket** is a (task type, difficulty) pair, written ``"type:difficulty"`` (e.g.
``"arithmetic:3"``); the buckets of a run are the task source's ``task_types`` x its active
difficulties. Each bucket keeps the outcomes of its last ``window`` episodes.

Weight rule (``orchestrator.curriculum``): with ``p`` the bucket's success rate over its window,

    w = floor + (ceiling - floor) * 4 p (1 - p)            once it has >= min_episodes episodes
    w = ceiling                                            before that (unexplored buckets first)

so buckets with low-but-non-zero success (the learning frontier) rise towards ``ceiling``, and
hopeless (p = 0) and converged (p = 1) buckets fall to ``floor`` -- never to zero, so a bucket
that becomes learnable is noticed again.

The run starts where the signal is (``curriculum.start_from_eval``): the initial held-out evaluation
(the policy RL starts from; no extra episode) gives each bucket a *prior* success ``p0``, used until the
bucket's own window holds ``min_episodes`` episodes. A bucket whose ``p0`` lies in the learnable band
(``orchestrator.signal.band_low``–``band_high``) weighs ``floor + (ceiling - floor) * 4 p0 (1 - p0)``;
one outside it weighs ``start_floor`` — left out for now, still drawn now and then, and weighted by its
own success once its window fills (so a bucket that moves into the band is reached). A bucket the
evaluation did not play keeps ``ceiling`` (unexplored first). Adaptive group sizes read ``p0`` too. The orchestrator multiplies a bucket's weight by the
drift rule's down-weight while that is in force and sets it to zero while its breaker is open
(:mod:`asyncrl.control.directives`; bucket helpers: :mod:`asyncrl.control.buckets`). Workers sample a
bucket with probability proportional to its weight, then a task of that bucket; the replay buffer can
be steered to the same proportions (``curriculum.steer_buffer``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from asyncrl.config import CurriculumConfig
from asyncrl.learning_signal import group_size_for


class Curriculum:
    """Per-bucket success windows and the weight rule of the module docstring."""

    def __init__(self, buckets: list[str], c: CurriculumConfig) -> None:
        self.c = c
        self.outcomes: dict[str, deque[int]] = {b: deque(maxlen=c.window) for b in buckets}
        self.prior: dict[str, float] = {}
        """Bucket -> success in the initial evaluation (:meth:`start`), until its window fills."""
        self.band = (0.0, 1.0)

    def start(self, counts: dict[str, tuple[int, int]], band: tuple[float, float]) -> str:
        """Take each bucket's ``(successes, episodes)`` of the initial evaluation as its prior success;
        return one line naming the buckets the run starts on and those it leaves out, and why."""
        self.band = band
        self.prior = {b: k / n for b, (k, n) in counts.items() if n > 0 and b in self.outcomes}
        low, high = band
        inside = sorted(b for b, p in self.prior.items() if low <= p <= high)
        below = sorted(b for b, p in self.prior.items() if p < low)
        above = sorted(b for b, p in self.prior.items() if p > high)
        parts = [
            f"curriculum starts on {_names(inside) if inside else 'no bucket'} (in the band {low:.0%}-{high:.0%})"
        ]
        if below:
            parts.append(f"left out for now: {_names(below)} (success under {low:.0%})")
        if above:
            parts.append(f"{_names(above)} (success over {high:.0%})")
        tail = " — drawn at start_floor until their own episodes say otherwise" if below or above else ""
        return "; ".join(parts) + tail

    def observe(self, bucket: str, success: bool) -> None:
        self.outcomes.setdefault(bucket, deque(maxlen=self.c.window)).append(int(success))

    def success(self, bucket: str) -> float | None:
        q = self.outcomes.get(bucket)
        return sum(q) / len(q) if q else None

    def weight(self, bucket: str) -> float:
        q = self.outcomes.get(bucket)
        c = self.c
        if q is None or len(q) < c.min_episodes:
            p0 = self.prior.get(bucket)
            if p0 is None:
                return c.ceiling
            if not self.band[0] <= p0 <= self.band[1]:
                return c.start_floor
            return c.floor + (c.ceiling - c.floor) * 4.0 * p0 * (1.0 - p0)
        p = sum(q) / len(q)
        return c.floor + (c.ceiling - c.floor) * 4.0 * p * (1.0 - p)

    def measured(self, bucket: str) -> float | None:
        """The bucket's success once its window holds ``min_episodes`` episodes; before, its prior from
        the initial evaluation (``None`` without one)."""
        q = self.outcomes.get(bucket)
        if q is not None and len(q) >= self.c.min_episodes:
            return sum(q) / len(q)
        return self.prior.get(bucket)

    def group_sizes(self, base: int, most: int, band_low: float) -> dict[str, int]:
        """Adaptive group size (``rollout.adaptive_group_size``): bucket -> the smallest ``G`` that gives
        half its groups a reward difference at its measured success ``p``
        (:func:`asyncrl.learning_signal.group_size_for`), between ``base`` and ``most``, for each bucket of rare
        success (``0 < p < band_low``) that needs more than ``base``."""
        out: dict[str, int] = {}
        for b in sorted(self.outcomes):
            p = self.measured(b)
            g = group_size_for(p, 0.5) if p is not None and 0.0 < p < band_low else None
            if g is not None and min(most, g) > base:
                out[b] = min(most, g)
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
        return {
            "outcomes": {b: list(q) for b, q in self.outcomes.items()},
            "prior": dict(self.prior),
            "band": list(self.band),
        }

    def restore(self, doc: dict[str, Any]) -> None:
        for b, xs in doc.get("outcomes", {}).items():
            self.outcomes[str(b)] = deque((int(x) for x in xs), maxlen=self.c.window)
        self.prior = {str(b): float(p) for b, p in doc.get("prior", {}).items()}
        low, high = doc.get("band", [0.0, 1.0])
        self.band = (float(low), float(high))


NAMES_SHOWN = 6
"""Buckets a one-line summary names before it counts the rest."""


def _names(buckets: list[str]) -> str:
    """``a:0, a:1, … (N buckets)``: a list short enough for one line."""
    shown = ", ".join(buckets[:NAMES_SHOWN])
    return shown + (f", … ({len(buckets)} buckets)" if len(buckets) > NAMES_SHOWN else "")
