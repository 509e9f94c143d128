"""The orchestrator's telemetry: :class:`Live` (the latest report of every role, decoded, and the queue
as the orchestrator read it, for the rules, the display and the summary) and, on each tick, feeding
the sinks and every ``telemetry.log_every_s`` writing its own row (``metrics/orchestrator.jsonl``)
with flow-control state, rates and cost so far."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.cost.ledger import CostBreakdown, collect_usage, price
from asyncrl.telemetry.flow import FlowMeter, count_lines
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.reports import (
    CanaryFigures,
    Decoded,
    EvaluatorReport,
    Event,
    QueueStats,
    RolloutFigures,
    TrainerReport,
    WorkerReport,
)
from asyncrl.telemetry.sinks import Sinks

if TYPE_CHECKING:
    from asyncrl.control import RunState

ROLE = "orchestrator"
TRAINER, EVALUATOR = "trainer", "evaluator"


@dataclass
class Live:
    """The latest report of every role, for the rules, the display and the summary."""

    trainer: TrainerReport | None = None
    workers: dict[str, WorkerReport] = field(default_factory=dict)
    """The latest report of each rollout worker (by name: a restarted worker replaces its predecessor)."""
    per_process: dict[tuple[str, int], WorkerReport | TrainerReport] = field(default_factory=dict)
    """The latest report of every training-device process, restarted ones included (cost, flow rates)."""
    evaluation: EvaluatorReport | None = None
    """The evaluator's latest report (periodic held-out evaluation)."""
    queue: QueueStats = field(default_factory=QueueStats)
    """The queue as the orchestrator read it this tick (its own handle): the one source of queue depth."""
    events: list[dict[str, Any]] = field(default_factory=list)

    def absorb(self, reports: list[Decoded]) -> None:
        for r in reports:
            if isinstance(r, Event):
                self.events.append(r.data)
            elif isinstance(r, (TrainerReport, WorkerReport)):
                if r.pid is not None:
                    self.per_process[(r.role, r.pid)] = r
                if isinstance(r, TrainerReport):
                    self.trainer = r
                else:
                    self.workers[r.role] = r
            elif isinstance(r, EvaluatorReport):
                self.evaluation = r

    def cost(self, cfg: RunConfig, wall_seconds: float) -> CostBreakdown:
        return price(collect_usage(list(self.per_process.values()), wall_seconds=wall_seconds), cfg.cost)

    def rollout(self) -> RolloutFigures:
        """The rollout workers' counters, summed over the latest report of each."""
        return RolloutFigures.total(w.rollout for w in self.workers.values())

    def canary(self) -> CanaryFigures:
        """The weight-sync canary's counts, summed over the workers."""
        return CanaryFigures.total(w.weights for w in self.workers.values() if w.weights is not None)

    def latest_trainer(self) -> TrainerReport:
        """The trainer's latest report (an empty one before its first)."""
        return self.trainer if self.trainer is not None else TrainerReport()

    def fill(self, capacity: int) -> float:
        """Ready entries over the queue's capacity (leased ones are already the trainer's)."""
        return self.queue.ready / capacity


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
        self.writer.write(row, step=int(live.latest_trainer().trainer.step))

    def row(self, st: RunState, live: Live, restarts: dict[str, int], started: float) -> dict[str, float]:
        out = {
            "orchestrator/paused": float(st.paused()),
            "orchestrator/queue_fill": live.fill(self.cfg.transport.capacity),
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
