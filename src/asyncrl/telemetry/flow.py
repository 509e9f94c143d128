"""The orchestrator's own metric row: flow control state, throughput and utilisation per role, alerts, cost.

Throughput and utilisation are rates over the interval since the previous row, computed from the
cumulative counters in every role process's latest report (per process, so a restarted role — whose
counters start again at zero — never produces a negative rate).
"""

from __future__ import annotations

import time
from pathlib import Path

from asyncrl.telemetry.reports import TrainerReport, WorkerReport


def count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def _counters(r: WorkerReport | TrainerReport) -> tuple[str, float, float, float]:
    """(kind, samples, tokens, busy seconds) of a process's report, all cumulative."""
    if isinstance(r, TrainerReport):
        t = r.trainer
        return "trainer", t.samples_trained, t.tokens_trained, t.busy_seconds
    w = r.rollout
    return "rollout", w.episodes, w.tokens, w.gen_busy_seconds


class FlowMeter:
    def __init__(self) -> None:
        self._prev: dict[tuple[str, int], tuple[float, float, float]] = {}
        self._t = time.time()

    def rates(self, per_process: dict[tuple[str, int], WorkerReport | TrainerReport]) -> dict[str, float]:
        now = time.time()
        dt = max(now - self._t, 1e-9)
        self._t = now
        sums = {f"{kind}_{what}": 0.0 for kind in ("rollout", "trainer") for what in ("samples", "tokens")}
        busy: dict[str, float] = {}
        for (role, pid), report in per_process.items():
            kind, *cur = _counters(report)
            prev = self._prev.get((role, pid), (0.0, 0.0, 0.0))
            samples, tokens, busy_s = (max(0.0, c - p) for c, p in zip(cur, prev, strict=True))
            self._prev[(role, pid)] = (cur[0], cur[1], cur[2])
            sums[f"{kind}_samples"] += samples
            sums[f"{kind}_tokens"] += tokens
            busy[role] = busy.get(role, 0.0) + busy_s
        out = {f"throughput/{k}_per_s": v / dt for k, v in sums.items()}
        out |= {f"utilisation/{role}": min(1.0, b / dt) for role, b in busy.items()}
        if "trainer" in busy:
            out["idle/trainer"] = 1.0 - out["utilisation/trainer"]
        if rollouts := [r for r in busy if r.startswith("rollout")]:
            out["idle/rollout"] = 1.0 - sum(out[f"utilisation/{r}"] for r in rollouts) / len(rollouts)
        return out
