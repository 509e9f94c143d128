"""The orchestrator's own metric row: flow control state, throughput and utilisation per role, alerts, cost.

Throughput and utilisation are rates over the interval since the previous row, computed from the
cumulative counters in every role process's latest row (per process, so a restarted role — whose
counters start again at zero — never produces a negative rate).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

COUNTERS = {
    "rollout": ("rollout/episodes", "rollout/tokens", "rollout/gen_busy_seconds"),
    "trainer": ("trainer/samples_trained", "trainer/tokens_trained", "trainer/busy_seconds"),
}


def count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


class FlowMeter:
    def __init__(self) -> None:
        self._prev: dict[tuple[str, int], dict[str, float]] = {}
        self._t = time.time()

    def rates(self, per_process: dict[tuple[str, int], dict[str, Any]]) -> dict[str, float]:
        now = time.time()
        dt = max(now - self._t, 1e-9)
        self._t = now
        sums: dict[str, float] = {}
        busy: dict[str, float] = {}
        for (role, pid), row in per_process.items():
            kind = "trainer" if role == "trainer" else "rollout" if role.startswith("rollout") else None
            if kind is None:
                continue
            prev = self._prev.setdefault((role, pid), {})
            for key in COUNTERS[kind]:
                cur = float(row.get(key) or 0.0)
                delta = max(0.0, cur - prev.get(key, 0.0))
                prev[key] = cur
                sums[key] = sums.get(key, 0.0) + delta
                if key.endswith("busy_seconds"):
                    busy[role] = busy.get(role, 0.0) + delta
        rollouts = [r for r in busy if r.startswith("rollout")]
        out = {
            "throughput/rollout_samples_per_s": sums.get("rollout/episodes", 0.0) / dt,
            "throughput/rollout_tokens_per_s": sums.get("rollout/tokens", 0.0) / dt,
            "throughput/trainer_samples_per_s": sums.get("trainer/samples_trained", 0.0) / dt,
            "throughput/trainer_tokens_per_s": sums.get("trainer/tokens_trained", 0.0) / dt,
        }
        for role, b in busy.items():
            out[f"utilisation/{role}"] = min(1.0, b / dt)
        if "trainer" in busy:
            out["idle/trainer"] = 1.0 - out["utilisation/trainer"]
        if rollouts:
            out["idle/rollout"] = 1.0 - sum(out[f"utilisation/{r}"] for r in rollouts) / len(rollouts)
        return out
