"""The orchestrator's telemetry duty on each tick: feed the sinks, and every ``telemetry.log_every_s``
write its own row (``metrics/orchestrator.jsonl``) with flow-control state, rates and cost so far."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.telemetry.flow import FlowMeter, count_lines
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.sinks import Sinks

if TYPE_CHECKING:
    from asyncrl.orchestrator.run import Orchestrator

ROLE = "orchestrator"


class OrchestratorTelemetry:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.sinks = Sinks(cfg, run_dir)
        self.writer = MetricWriter(run_dir / "metrics" / f"{ROLE}.jsonl", role=ROLE)
        for note in self.sinks.notes:
            self.writer.event("telemetry/sink_unavailable", {"message": note})
        self.flow = FlowMeter()
        self._last = time.time()

    def tick(self, orch: Orchestrator, rows: list[dict[str, Any]]) -> None:
        self.sinks.write(rows)
        if time.time() - self._last < self.cfg.telemetry.log_every_s:
            return
        self._last = time.time()
        self.writer.write(self.row(orch), step=int(orch.live.trainer.get("trainer/step") or 0))

    def row(self, orch: Orchestrator) -> dict[str, float]:
        st, cap = orch.state, self.cfg.transport.capacity
        ready = float(orch.live.trainer.get("queue/ready") or 0.0)
        out = {
            "orchestrator/paused": float(st.paused()),
            "orchestrator/queue_fill": ready / cap,
            "orchestrator/max_staleness": float(st.effective_lag()),
            "orchestrator/sync_every": float(st.effective_sync_every()),
            "orchestrator/restarts": float(sum(orch.restarts.values())),
            "alerts/total": float(count_lines(self.run_dir / "alerts.jsonl")),
            **self.flow.rates(orch.live.per_process),
        }
        if self.cfg.cost.enabled:
            c = orch.live.cost(self.cfg, time.time() - orch.started)
            out["cost/usd_so_far"] = c.total
            out["cost/waste_share"] = c.waste_total / c.total if c.total else 0.0
        return out

    def close(self, rows: list[dict[str, Any]]) -> None:
        self.sinks.write(rows)
        self.sinks.close()
        self.writer.close()
