"""Staleness runaway: rule 6 of :mod:`asyncrl.staleness`, as a pure controller.

Fed the trained samples' mean age (one point per trainer report) and the queue fill (one per
tick), it returns the effective ``max_staleness`` and ``sync_every``:

* mean age above the configured bound for ``window`` reports in a row -> bound - 1 and
  sync_every - 1 (tighter bound, weights published more often; at bound 0 every episode starts on the
  newest weights: "online mode"), with a ``staleness_runaway`` alert;
* mean age at most half the bound -> bound + 1 back towards the configured value
  (``staleness_recovered`` alert when it gets there);
* queue fill under ``low_fill`` for ``fill_window`` ticks -> sync_every - 1 (an under-used queue: sync
  faster); at or above it for ``fill_window`` ticks -> sync_every + 1 back towards the configured value;
* always ``sync_every <= bound + 1``.
"""

from __future__ import annotations

from collections import deque

from asyncrl.config import GovernorConfig
from asyncrl.orchestrator.alerts import Alert


class StalenessGovernor:
    """Rule 6 (module docstring); the windows and the fill threshold are ``orchestrator.governor``."""

    def __init__(self, max_staleness: int, sync_every: int, gc: GovernorConfig) -> None:
        self.configured, self.configured_sync, self.low_fill = max_staleness, sync_every, gc.low_fill
        self.ages: deque[float] = deque(maxlen=gc.window)
        self.fills: deque[float] = deque(maxlen=gc.fill_window)

    def observe_age(self, mean_age: float) -> None:
        self.ages.append(mean_age)

    def step(self, current: int, sync: int, fill: float) -> tuple[int, int, list[Alert]]:
        alerts: list[Alert] = []
        ages = self.ages
        self.fills.append(fill)
        if len(ages) == ages.maxlen and min(ages) > self.configured and current > 0:
            evidence = {"mean_ages": list(ages), "limit": self.configured}
            current, sync = current - 1, max(1, sync - 1)
            alerts.append(
                Alert("staleness_runaway", "", evidence, f"max_staleness -> {current}, sync_every -> {sync}")
            )
            ages.clear()
        elif ages and max(ages) <= self.configured / 2 and current < self.configured:
            current += 1
            if current == self.configured:
                alerts.append(
                    Alert("staleness_recovered", "", {"mean_ages": list(ages)}, f"max_staleness -> {current}")
                )
        fills = self.fills
        if len(fills) == fills.maxlen and max(fills) < self.low_fill:
            sync = max(1, sync - 1)
            fills.clear()
        elif len(fills) == fills.maxlen and min(fills) >= self.low_fill and sync < self.configured_sync:
            sync += 1
        return current, min(sync, current + 1), alerts
