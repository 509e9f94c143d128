"""Where merged metric rows go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

The orchestrator hands every merged row to :class:`Sinks`. ``metrics.jsonl`` is always written (by the
orchestrator itself); TensorBoard event files are written to ``run_dir/tensorboard/`` when
``telemetry.tensorboard`` is on (the default); W&B and MLflow are used only when they are enabled in
the config *and* importable — otherwise nothing is sent anywhere, and an enabled-but-missing sink is
reported once as a note.

Every scalar is logged against the trainer step: trainer rows carry their own ``step``, rows of other
roles take the newest trainer step seen so far. Rollout workers' keys get their role appended
(``rollout/episodes/rollout-0``) so that workers do not overwrite each other.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.telemetry.tensorboard import EventFileWriter

HEADER = frozenset({"time", "role", "pid", "alive_s", "step"})


def scalars_of(row: dict[str, Any]) -> dict[str, float]:
    """The numeric metrics of one row, tagged for sinks (header fields and events left out)."""
    if "event" in row:
        return {}
    role = str(row.get("role", ""))
    suffix = f"/{role}" if role.startswith("rollout") else ""
    return {
        f"{k}{suffix}": float(v)
        for k, v in row.items()
        if k not in HEADER and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class Sinks:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        tc = cfg.telemetry
        self.step = 0
        self.notes: list[str] = []
        self.tb = EventFileWriter(run_dir / "tensorboard") if tc.tensorboard else None
        self.wandb: Any = self._optional("wandb", tc.wandb)
        if self.wandb is not None:
            self.wandb.init(
                project=tc.project, name=run_dir.name, dir=str(run_dir), config=cfg.model_dump(mode="json")
            )
        self.mlflow: Any = self._optional("mlflow", tc.mlflow)
        if self.mlflow is not None:
            self.mlflow.set_experiment(tc.project)
            self.mlflow.start_run(run_name=run_dir.name)
            self.mlflow.log_params({"name": cfg.name, "mode": cfg.control.mode, "seed": cfg.seed})

    def _optional(self, module: str, enabled: bool) -> Any:
        """``module`` when ``telemetry.<module>`` is on and it is importable; a note when it is not."""
        if enabled and not installed(module):
            self.notes.append(f"telemetry.{module} is on but {module} is not installed: nothing sent")
        return importlib.import_module(module) if enabled and installed(module) else None

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            if row.get("role") == "trainer" and isinstance(row.get("step"), (int, float)):
                self.step = int(row["step"])
            scalars = scalars_of(row)
            if not scalars:
                continue
            if self.tb is not None:
                self.tb.add_scalars(self.step, scalars, wall_time=float(row.get("time") or 0.0) or None)
            if self.wandb is not None:
                self.wandb.log(scalars, step=self.step)
            if self.mlflow is not None:
                self.mlflow.log_metrics(scalars, step=self.step)
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.mlflow is not None:
            self.mlflow.end_run()
