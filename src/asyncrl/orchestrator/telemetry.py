"""The orchestrator's telemetry: :class:`Live` (the latest figures of every role, for the display and
the summary) and, on each tick, feeding the sinks and every ``telemetry.log_every_s`` writing its own row
(``metrics/orchestrator.jsonl``) with flow-control state, rates and cost so far."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.telemetry.flow import FlowMeter, count_lines
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.sinks import Sinks

if TYPE_CHECKING:
    from asyncrl.control import RunState

ROLE = "orchestrator"
TRAINER, EVALUATOR = "trainer", "evaluator"


@dataclass
class Live:
    """The latest figures of every role, for the display and the summary."""

    trainer: dict[str, Any] = field(default_factory=dict)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    ages: deque[float] = field(default_factory=deque)
    """Mean ages of trained batches not yet seen by the staleness governor (``run.py`` bounds it by
    ``orchestrator.governor.window``: the governor looks at no more)."""
    per_process: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The evaluator's latest row (periodic held-out evaluation)."""

    def absorb(self, rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if "pid" in r and "event" not in r:
                self.per_process[(str(r["role"]), int(r["pid"]))] = r
            if "event" in r:
                if r["event"] != "rollout/group":  # those feed the rules, not the event list
                    self.events.append(r)
            elif r.get("role") == TRAINER:
                self.trainer = r
                if r.get("staleness/mean") is not None:
                    self.ages.append(float(r["staleness/mean"]))
            elif str(r.get("role", "")).startswith("rollout"):
                self.workers[str(r.get("role"))] = r
            elif r.get("role") == EVALUATOR:
                self.evaluation = r

    def cost(self, cfg: RunConfig, wall_seconds: float) -> Any:
        from asyncrl.cost.ledger import collect_usage, price

        return price(collect_usage(list(self.per_process.values()), wall_seconds=wall_seconds), cfg.cost)

    def total(self, key: str) -> float:
        return sum(float(w.get(key) or 0.0) for w in self.workers.values())


class OrchestratorTelemetry:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.sinks = Sinks(cfg, run_dir)
        self.writer = MetricWriter(run_dir / "metrics" / f"{ROLE}.jsonl", role=ROLE)
        for note in self.sinks.notes:
            self.writer.event("telemetry/sink_unavailable", {"message": note})
        self.flow = FlowMeter()
        self._last = time.time()

    def tick(
        self,
        rows: list[dict[str, Any]],
        state: RunState,
        live: Live,
        restarts: dict[str, int],
        started: float,
    ) -> None:
        self.sinks.write(rows)
        if time.time() - self._last < self.cfg.telemetry.log_every_s:
            return
        self._last = time.time()
        row = self.row(state, live, restarts, started)
        self.writer.write(row, step=int(live.trainer.get("trainer/step") or 0))

    def row(self, st: RunState, live: Live, restarts: dict[str, int], started: float) -> dict[str, float]:
        cap = self.cfg.transport.capacity
        ready = float(live.trainer.get("queue/ready") or 0.0)
        out = {
            "orchestrator/paused": float(st.paused()),
            "orchestrator/queue_fill": ready / cap,
            "orchestrator/max_staleness": float(st.effective_max_staleness()),
            "orchestrator/sync_every": float(st.effective_sync_every()),
            "orchestrator/restarts": float(sum(restarts.values())),
            "alerts/total": float(count_lines(self.run_dir / "alerts.jsonl")),
            **self.flow.rates(live.per_process),
        }
        if self.cfg.cost.enabled:
            c = live.cost(self.cfg, time.time() - started)
            out["cost/usd_so_far"] = c.total
            out["cost/waste_share"] = c.waste_total / c.total if c.total else 0.0
        return out

    def close(self, rows: list[dict[str, Any]]) -> None:
        self.sinks.write(rows)
        self.sinks.close()
        self.writer.close()
