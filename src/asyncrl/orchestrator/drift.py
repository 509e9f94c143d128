"""Reward drift (per-bucket two-sided CUSUM) and suspected reward hacking.

**Drift.** Every finished group contributes its mean final reward to its bucket's stream. The
first ``warmup`` points of a bucket fix a reference mean ``mu`` and standard deviation ``sd``
(sample std, floored at ``min_std``). Each later point ``x`` updates the two one-sided CUSUM
statistics (Page, 1954) on ``z = (x - mu) / sd``::

    S+ = max(0, S+ + z - k)        S- = max(0, S- - z - k)

and an alarm is raised when either exceeds ``h``. On an alarm the orchestrator emits a
``reward_drift`` alert (direction, reference, recent mean, statistic), multiplies the bucket's
curriculum weight by ``downweight`` for ``hold_s`` seconds, and the bucket re-learns its
reference from the next ``warmup`` points (a new normal after a lasting change). Defaults
``warmup = 30, k = 0.75, h = 10`` (in reference standard deviations); docs/orchestrator.md gives the measured
false-positive rate on stationary streams and the detection delay on a jump.

**Reward hacking.** Pairs (training-batch reward, held-out success) are collected whenever a
held-out probe group finishes (``drift.heldout_rate`` of groups run on held-out tasks and are not
trained). Over the last ``hacking_window`` pairs, if the training reward's second-half mean
exceeds its first-half mean by at least ``hacking_rise`` while held-out success did not rise,
a ``reward_hacking`` alert is raised (evidence only: no automatic action) and the window restarts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from asyncrl.config import DriftConfig
from asyncrl.orchestrator.alerts import Alert


@dataclass
class Cusum:
    """Two-sided CUSUM on one stream with a self-learned reference (see module docstring)."""

    warmup: int
    k: float
    h: float
    min_std: float
    """``orchestrator.drift.warmup``, ``k``, ``h``, ``min_std``."""
    ref: list[float] = field(default_factory=list)
    mu: float = 0.0
    sd: float = 0.0
    pos: float = 0.0
    neg: float = 0.0
    n: int = 0
    recent: list[float] = field(default_factory=list)

    def update(self, x: float) -> dict[str, float | str] | None:
        """Add one point; returns the alarm evidence when the CUSUM fires, else None."""
        self.n += 1
        self.recent = [*self.recent, x][-10:]
        if len(self.ref) < self.warmup:
            self.ref.append(x)
            if len(self.ref) == self.warmup:
                m = sum(self.ref) / len(self.ref)
                var = sum((r - m) ** 2 for r in self.ref) / (len(self.ref) - 1)
                self.mu, self.sd = m, max(math.sqrt(var), self.min_std)
            return None
        z = (x - self.mu) / self.sd
        self.pos = max(0.0, self.pos + z - self.k)
        self.neg = max(0.0, self.neg - z - self.k)
        if self.pos <= self.h and self.neg <= self.h:
            return None
        evidence = {
            "direction": "up" if self.pos > self.h else "down",
            "reference_mean": self.mu,
            "reference_std": self.sd,
            "recent_mean": sum(self.recent) / len(self.recent),
            "cusum": max(self.pos, self.neg),
            "points": self.n,
        }
        self.ref, self.pos, self.neg = [], 0.0, 0.0  # re-learn the reference after a lasting change
        return evidence


class DriftMonitor:
    """One :class:`Cusum` per bucket, plus the down-weighting hold after an alarm."""

    def __init__(self, d: DriftConfig) -> None:
        self.d = d
        self.streams: dict[str, Cusum] = {}
        self.held_until: dict[str, float] = {}
        self.alarms = 0

    def observe(self, bucket: str, group_mean_reward: float, now: float) -> list[Alert]:
        d = self.d
        stream = self.streams.setdefault(bucket, Cusum(d.warmup, d.k, d.h, d.min_std))
        evidence = stream.update(group_mean_reward)
        if evidence is None:
            return []
        self.alarms += 1
        self.held_until[bucket] = now + d.hold_s
        action = f"weight x{d.downweight:g} for {d.hold_s:g}s; reference re-learned"
        return [Alert(kind="reward_drift", bucket=bucket, evidence=evidence, action=action)]

    def factors(self, now: float) -> dict[str, float]:
        """Curriculum weight multipliers in force at ``now``."""
        return {b: self.d.downweight for b, until in self.held_until.items() if now < until}

    def metrics(self, now: float) -> dict[str, float]:
        return {"drift/alarms": float(self.alarms), "drift/downweighted": float(len(self.factors(now)))}

    def snapshot(self) -> dict[str, object]:
        return {
            "streams": {b: asdict(s) for b, s in self.streams.items()},
            "held_until": self.held_until,
            "alarms": self.alarms,
        }

    def restore(self, doc: dict[str, Any]) -> None:
        self.streams = {str(b): Cusum(**s) for b, s in doc.get("streams", {}).items()}
        self.held_until = {str(b): float(t) for b, t in doc.get("held_until", {}).items()}
        self.alarms = int(doc.get("alarms", 0))


class HackingMonitor:
    """Rising training reward with flat or falling held-out success (module docstring)."""

    def __init__(self, d: DriftConfig) -> None:
        self.window, self.rise = d.hacking_window, d.hacking_rise
        self.pairs: deque[tuple[float, float]] = deque(maxlen=d.hacking_window)
        self.flags = 0

    def observe(self, train_reward: float, heldout_success: float) -> list[Alert]:
        self.pairs.append((train_reward, heldout_success))
        if len(self.pairs) < self.window:
            return []
        half = self.window // 2
        xs = list(self.pairs)

        def change(i: int) -> float:
            first = [p[i] for p in xs[:half]]
            second = [p[i] for p in xs[-half:]]
            return sum(second) / len(second) - sum(first) / len(first)

        d_train, d_heldout = change(0), change(1)
        if d_train >= self.rise and d_heldout <= 0.0:
            self.flags += 1
            self.pairs.clear()
            evidence = {
                "train_reward_change": d_train,
                "heldout_success_change": d_heldout,
                "window": self.window,
            }
            return [Alert(kind="reward_hacking", bucket="", evidence=evidence, action="flagged for review")]
        return []

    def snapshot(self) -> dict[str, object]:
        return {"pairs": [list(p) for p in self.pairs], "flags": self.flags}

    def restore(self, doc: dict[str, Any]) -> None:
        self.pairs = deque((tuple(p) for p in doc.get("pairs", [])), maxlen=self.window)
        self.flags = int(doc.get("flags", 0))
