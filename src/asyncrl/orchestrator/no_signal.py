"""The no-signal rule: a run that cannot learn says so while it trains.

A training group whose members were all rewarded alike carries no GRPO gradient (:mod:`asyncrl.learning_signal`).
The curriculum already steers sampling away from such buckets (weight ``floor + (ceiling − floor) ·
4p(1 − p)``); this rule says when that is not enough. It keeps, per bucket and over the whole run,
whether each of the last ``W`` training groups had a reward difference, with ``W =
orchestrator.signal.window_steps × max(1, trainer.batch_size // rollout.group_size)`` (a trainer step's
worth of groups times the window). Once a window is full and at least ``no_signal_share`` of it had no
difference, it raises one ``no_signal`` alert — bucket ``type:difficulty``, or ``""`` for the whole run
("no bucket has signal") — with the evidence (share without a difference, success, expected share
``s(p, G)``) and the likely fix (:func:`asyncrl.learning_signal.advice`), logs it as a warning, and stays quiet
for that bucket until its share falls below the threshold again (one alert per excursion). Held-out
probe groups are not trained and are not counted.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from asyncrl.config import SignalConfig
from asyncrl.learning_signal import advice, signal_share
from asyncrl.orchestrator.alerts import Alert

log = logging.getLogger("asyncrl.orchestrator")
RUN = ""
"""The key of the run-wide window (an alert's bucket ``""``)."""


@dataclass(frozen=True)
class GroupSignal:
    """One training group, as the rule keeps it: did its rewards differ, and how many members succeeded."""

    differs: bool
    successes: int
    size: int


class SignalMonitor:
    """Per-bucket and run-wide windows of :class:`GroupSignal` and the rule of the module docstring."""

    def __init__(self, c: SignalConfig, window: int, group_size: int) -> None:
        self.c, self.window, self.group_size = c, window, group_size
        self.windows: dict[str, deque[GroupSignal]] = {}
        self.alerted: set[str] = set()
        """Windows in an excursion above the threshold (alerted once; re-armed below it)."""

    def observe(self, bucket: str, rewards: list[float], outcomes: list[str]) -> list[Alert]:
        """One finished training group of ``bucket``; returns the alerts it raises (none, one or two)."""
        if not self.c.enabled or not rewards:
            return []
        g = GroupSignal(len(set(rewards)) > 1, sum(o == "success" for o in outcomes), len(rewards))
        out = []
        for key in (bucket, RUN):
            self.windows.setdefault(key, deque(maxlen=self.window)).append(g)
            alert = self._check(key)
            if alert is not None:
                log.warning("no learning signal%s: %s", f" in {key}" if key else "", alert.action)
                out.append(alert)
        return out

    def no_signal_share(self, key: str) -> float | None:
        """Share of the window's groups without a reward difference (``None``: no group yet)."""
        q = self.windows.get(key)
        return sum(not g.differs for g in q) / len(q) if q else None

    def success(self, key: str) -> float | None:
        q = self.windows.get(key)
        n = sum(g.size for g in q) if q else 0
        return sum(g.successes for g in q) / n if q and n else None

    def mean_size(self, key: str) -> int:
        """The window's mean group size, rounded (the configured size before any group)."""
        q = self.windows.get(key)
        return round(sum(g.size for g in q) / len(q)) if q else self.group_size

    def _check(self, key: str) -> Alert | None:
        q, share = self.windows[key], self.no_signal_share(key)
        if share is None or len(q) < self.window:
            return None
        if share < self.c.no_signal_share:
            self.alerted.discard(key)
            return None
        if key in self.alerted:
            return None
        self.alerted.add(key)
        return self._alert(key, share)

    def _alert(self, key: str, share: float) -> Alert:
        p = self.success(key) or 0.0
        differs = 1.0 - share
        evidence = {
            "groups": len(self.windows[key]),
            "no_signal_share": round(share, 4),
            "success": round(p, 4),
            "expected_signal_share": round(signal_share(p, self.group_size), 4),
            "group_size": self.group_size,
        }
        q = self.windows[key]
        solved = sum(g.successes > 0 for g in q) / len(q)  # pass@G over the window's groups
        fix = advice(
            p, differs, self.group_size, self.c.band_low, self.c.band_high, lowest=None, pass_at_g=solved
        )
        if key == RUN:
            action = (
                f"no bucket has signal: {share:.0%} of the last {len(self.windows[key])} training groups had "
                f"no reward difference (success {p:.0%}); the run is not learning — {fix}"
            )
        else:
            action = (
                f"{share:.0%} of {key}'s last {len(self.windows[key])} training groups had no reward "
                f"difference (success {p:.0%}); the curriculum lowers its weight — {fix}"
            )
        return Alert("no_signal", key, evidence, action)

    def metrics(self) -> dict[str, float]:
        """``signal/no_signal_share`` (run-wide) and ``signal/no_signal_share/{bucket}`` over their windows."""
        out: dict[str, float] = {}
        for key in sorted(self.windows):
            share = self.no_signal_share(key)
            if share is not None:
                out["signal/no_signal_share" + (f"/{key}" if key else "")] = share
        return out

    # -- snapshot --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        return {
            "windows": {k: [[g.differs, g.successes, g.size] for g in q] for k, q in self.windows.items()},
            "alerted": sorted(self.alerted),
        }

    def restore(self, doc: dict[str, Any]) -> None:
        self.windows = {
            str(k): deque((GroupSignal(bool(d), int(s), int(n)) for d, s, n in q), maxlen=self.window)
            for k, q in doc.get("windows", {}).items()
        }
        self.alerted = {str(k) for k in doc.get("alerted", [])}
