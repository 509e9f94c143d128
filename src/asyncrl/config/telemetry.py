"""``telemetry``: metrics, evaluation cadence and reports (:mod:`asyncrl.telemetry`)."""

from __future__ import annotations

from pydantic import Field

from asyncrl.config.base import Section


class TelemetryConfig(Section):
    """Metrics, evaluation and reports."""

    tensorboard: bool = True
    """Write TensorBoard event files next to metrics.jsonl."""
    eval_every: int = Field(10, ge=0)
    """Evaluate on the held-out split every N published versions (0: only at start and end)."""
    log_every_s: float = Field(2.0, gt=0)
    """Seconds between metric records of the rollout workers and the orchestrator (the trainer writes one
    record per trained batch)."""
    progress_every_s: float = Field(5.0, gt=0, le=3600)
    """Without the live display (``--no-display``): seconds between plain progress lines, during the
    warm start and the RL run."""
    eval_tasks: int = Field(0, ge=0)
    """Held-out tasks per periodic evaluation (0: the whole held-out split)."""
    eval_nice: int = Field(5, ge=0, le=19)
    """OS priority decrement (``nice``) of the evaluator process; what yields the CPU to training where
    ``eval_idle`` is off or the OS has no ``SCHED_IDLE`` (at 5 it still takes about a quarter of a shared
    core, ``tests/test_lending.py``)."""
    eval_idle: bool = True
    """Run the evaluator under Linux's ``SCHED_IDLE`` policy: it computes only on a core that the trainer
    and the rollout workers leave (0.4-0.5 % of a core they keep busy), so a periodic evaluation barely
    slows training; on a machine whose cores training fills, the curve gets fewer points, and a
    tool's wall-clock limit (``env.guard.step_timeout_s``, a sandbox's) also counts the time the
    evaluator waits for a core. ``false``: ``eval_nice`` alone, and the evaluator joins core lending."""
    archive: bool = True
    """Archive every trained batch (compressed msgpack) in ``archive/`` for ``asyncrl replay``."""
    traces: bool = True
    """Write one lifecycle trace line per trained trajectory to ``traces/trained.jsonl``."""
    wandb: bool = False
    """Also log metrics to Weights & Biases (only if ``wandb`` is installed; nothing is sent otherwise)."""
    mlflow: bool = False
    """Also log metrics to MLflow (only if ``mlflow`` is installed; nothing is sent otherwise)."""
    project: str = "asyncrl"
    """Project / experiment name used by the W&B and MLflow sinks."""
    recent_alerts: int = Field(8, ge=1, le=1000)
    """Alerts the live display and the orchestrator's snapshot keep (all of them are in ``alerts.jsonl``)."""
