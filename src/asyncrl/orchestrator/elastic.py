"""Elastic rollout capacity: when to add or remove a rollout worker.

Every tick the orchestrator feeds one :class:`FlowSample` -- production rate (episodes/s finished
by all workers), consumption rate (samples/s the trainer trained), queue fill (ready entries /
capacity), the trainer's busy fraction over the last interval, and the mean staleness of the
trained samples against its limit. Over the last ``window`` samples (``orchestrator.elastic``):

* **scale up** (one worker, if below ``max_workers``) when in every sample the queue is nearly
  empty (``fill <= starve_fill``), the trainer is starving (``busy < starve_busy``), production
  does not exceed consumption (``production <= 1.1 x consumption``), and staleness is within its
  limit (more workers would only age the samples further);
* **scale down** (one worker, if above ``min_workers``) when in every sample the queue is backing
  up (``fill >= overflow_fill``) and production exceeds consumption, or the staleness is above
  its limit in every sample with the queue not empty.

At most one decision per ``cooldown_s``; each comes back as a ``scale_up``/``scale_down``
:class:`~asyncrl.orchestrator.alerts.Alert` whose evidence holds the window's means. The local
launcher applies it: a new ``rollout-i`` process is started, or the newest worker is asked to
retire (it starts no new groups, delivers the running ones, and exits).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from asyncrl.config import ElasticConfig
from asyncrl.orchestrator.alerts import Alert, AlertKind


@dataclass(frozen=True)
class FlowSample:
    production: float
    consumption: float
    fill: float
    busy: float
    staleness: float
    staleness_limit: float


class ElasticController:
    def __init__(self, e: ElasticConfig) -> None:
        self.e = e
        self.samples: deque[FlowSample] = deque(maxlen=e.window)
        self.last_decision = float("-inf")
        self.decisions = 0

    def observe(self, sample: FlowSample, workers: int, now: float) -> tuple[int, list[Alert]]:
        """Add one sample; returns (change in worker count: -1, 0 or +1, alerts)."""
        self.samples.append(sample)
        e, s = self.e, list(self.samples)
        if len(s) < e.window or now - self.last_decision < e.cooldown_s:
            return 0, []
        starving = all(
            x.fill <= e.starve_fill
            and x.busy < e.starve_busy
            and x.production <= 1.1 * x.consumption + 1e-9
            and x.staleness <= x.staleness_limit
            for x in s
        )
        overflowing = all(x.fill >= e.overflow_fill and x.production > x.consumption for x in s)
        too_stale = all(x.staleness > x.staleness_limit and x.fill > e.starve_fill for x in s)
        if starving and workers < e.max_workers:
            return self._decide(+1, workers, now, "trainer starving: queue empty, trainer idle")
        if (overflowing or too_stale) and workers > e.min_workers:
            why = (
                "queue overflowing: production exceeds consumption"
                if overflowing
                else "staleness above limit"
            )
            return self._decide(-1, workers, now, why)
        return 0, []

    def _decide(self, delta: int, workers: int, now: float, reason: str) -> tuple[int, list[Alert]]:
        s = [asdict(x) for x in self.samples]
        mean = {k: sum(float(x[k]) for x in s) / len(s) for k in s[0]}
        self.last_decision, self.decisions = now, self.decisions + 1
        self.samples.clear()
        kind: AlertKind = "scale_up" if delta > 0 else "scale_down"
        evidence = {"reason": reason, "workers_before": workers, "window": len(s), **mean}
        return delta, [
            Alert(kind=kind, bucket="", evidence=evidence, action=f"workers {workers} -> {workers + delta}")
        ]

    def snapshot(self) -> dict[str, object]:
        return {"last_decision": self.last_decision if self.decisions else None, "decisions": self.decisions}

    def restore(self, doc: dict[str, Any]) -> None:
        last = doc.get("last_decision")
        self.last_decision = float(last) if last is not None else float("-inf")
        self.decisions = int(doc.get("decisions", 0))
