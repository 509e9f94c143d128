"""The typed alert stream: what the orchestrator noticed, the evidence, and what it did about it.

Every rule that acts (a breaker opening, a drift alarm, a staleness tightening, a scaling
decision, suspected reward hacking, an environment fault rate above its threshold, a weight version a
worker refused because its engine did not serve it as published, training groups without a reward
difference — a run or bucket that cannot learn —, a bucket's sampling temperature raised against entropy
collapse) emits one :class:`Alert`. :class:`AlertLog` appends it as a
JSON line to ``run_dir/alerts.jsonl`` (the run's record), keeps the most recent ones for the live
display, and counts them by kind (the ``alerts/*`` metrics).
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

AlertKind = Literal[
    "breaker_open",
    "breaker_half_open",
    "breaker_closed",
    "reward_drift",
    "reward_hacking",
    "staleness_runaway",
    "staleness_recovered",
    "scale_up",
    "scale_down",
    "exploration",
    "env_faults",
    "stall",
    "weight_canary",
    "no_signal",
    "temperature",
]


@dataclass(frozen=True)
class Alert:
    """One alert: when, what kind, which bucket (``""`` for run-wide), the evidence, the action taken."""

    kind: AlertKind
    bucket: str
    evidence: Mapping[str, object]
    action: str
    time: float = field(default_factory=time.time)


class AlertLog:
    """Append-only alert log (``alerts.jsonl``) plus the last ``keep`` alerts (``telemetry.recent_alerts``)
    and counts by kind."""

    def __init__(self, path: Path | None, keep: int) -> None:
        self.path = path
        self.recent: deque[Alert] = deque(maxlen=keep)
        self.counts: dict[str, int] = {}

    def emit(self, alert: Alert) -> None:
        self.recent.append(alert)
        self.counts[alert.kind] = self.counts.get(alert.kind, 0) + 1
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(asdict(alert), sort_keys=True) + "\n")

    def extend(self, alerts: list[Alert]) -> None:
        for a in alerts:
            self.emit(a)

    def metrics(self) -> dict[str, float]:
        out = {f"alerts/{k}": float(v) for k, v in sorted(self.counts.items())}
        out["alerts/total"] = float(sum(self.counts.values()))
        return out

    # -- snapshot --------------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        return {"counts": dict(self.counts), "recent": [asdict(a) for a in self.recent]}

    def restore(self, doc: dict[str, Any]) -> None:
        self.counts = {str(k): int(v) for k, v in doc.get("counts", {}).items()}
        self.recent.clear()
        for a in doc.get("recent", []):
            self.recent.append(Alert(**a))
