"""Budget a run before starting it: the seed documents' cost formula, with every assumption shown.

    total ≈ N·L / P_rollout · c_device          (rollout: generating N trajectories of L model tokens)
          + N·L / P_train   · c_device          (training on them)
          + N·E · (c_call + s_call · c_cpu)      (environment calls)
          + value model (a fraction of training)
          + N · reward seconds · c_cpu           (answer verification)
          + storage + transfer                   (bytes moved and kept)

``P_rollout`` and ``P_train`` are *effective* throughputs: model tokens per device-second including
idle time, which is what a device bill counts. ``--from-run RUN`` measures all of them on an earlier
run (optionally only on its first fraction: that is how the estimator's accuracy is checked). The
assumptions and their defaults are the ``cost.assumptions`` config section.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from asyncrl.config import CostAssumptionsConfig, CostConfig
from asyncrl.cost.ledger import GB, MONTH_S, Usage, collect_usage
from asyncrl.telemetry.jsonl import read_jsonl_dir
from asyncrl.telemetry.reports import decode_rows

Assumptions = CostAssumptionsConfig
"""Inputs of :func:`estimate`: the ``cost.assumptions`` config section (:class:`asyncrl.config.CostAssumptionsConfig`,
where each is documented with its default)."""


def estimate(a: Assumptions, cfg: CostConfig) -> dict[str, float]:
    """Dollars per component for the assumptions ``a`` (the module docstring's formula)."""
    p = cfg.prices
    dev = p.device_hour[cfg.device] / 3600.0
    cpu = p.cpu_core_hour / 3600.0
    tokens = a.trajectories * a.tokens_per_trajectory
    train = tokens / a.train_tokens_per_s * dev if a.train_tokens_per_s else 0.0
    calls = a.trajectories * a.env_calls_per_trajectory
    return {
        "startup_device": a.startup_device_seconds * dev,
        "rollout_device": tokens / a.rollout_tokens_per_s * dev if a.rollout_tokens_per_s else 0.0,
        "trainer_device": train,
        "value_model": train * a.value_model_fraction,
        "reward": a.trajectories * a.reward_seconds_per_trajectory * cpu,
        "environment": calls * (p.env_call + a.env_seconds_per_call * cpu),
        "storage": a.stored_bytes / GB * p.gb_stored_month * a.wall_seconds / MONTH_S,
        "transfer": a.trajectories * a.transfer_bytes_per_trajectory / GB * p.gb_transferred,
    }


def assumptions_from_usage(u: Usage) -> Assumptions:
    n = max(u.samples_generated, 1.0)
    return Assumptions(
        trajectories=u.samples_generated,
        tokens_per_trajectory=u.tokens_generated / n,
        rollout_tokens_per_s=u.tokens_generated / u.rollout_alive_s if u.rollout_alive_s else 0.0,
        train_tokens_per_s=u.tokens_trained / u.trainer_alive_s if u.trainer_alive_s else 0.0,
        env_calls_per_trajectory=u.env_calls / n,
        env_seconds_per_call=u.env_seconds / u.env_calls if u.env_calls else 0.0,
        reward_seconds_per_trajectory=u.reward_s / n,
        value_model_fraction=u.value_model_s / u.trainer_alive_s if u.trainer_alive_s else 0.0,
        transfer_bytes_per_trajectory=(u.queue_bytes + u.weight_bytes) / n,
        stored_bytes=u.stored_bytes,
        wall_seconds=u.wall_seconds,
    )


def measured_assumptions(run_dir: Path, fraction: float = 1.0) -> Assumptions:
    """Assumptions measured on a run's metric rows, using only its first ``fraction`` (by time).

    Throughputs are steady-state rates (between each process's first report and the cut); the
    device time before the first reports is kept separately as a fixed start-up cost.
    """
    rows = [
        r
        for r in read_jsonl_dir(run_dir / "metrics")
        if "pid" in r
        and "event" not in r
        and (r["role"] == "trainer" or str(r["role"]).startswith("rollout"))
    ]  # training devices only (not the orchestrator or the evaluator)
    if not rows:
        raise ValueError(f"{run_dir} has no role metrics")
    t_start = min(float(r["time"]) - float(r.get("alive_s") or 0.0) for r in rows)
    t_end = max(float(r["time"]) for r in rows)
    cut = t_start + fraction * (t_end - t_start)
    part = [r for r in rows if float(r["time"]) <= cut]
    # each process's first row (the earliest; of equal times, the first written)
    by_time = sorted(part[::-1], key=lambda r: float(r["time"]), reverse=True)
    first = list({(str(r["role"]), int(r["pid"])): r for r in by_time}.values())
    at_cut = collect_usage(decode_rows(part), wall_seconds=cut - t_start)
    at_first = collect_usage(decode_rows(first), wall_seconds=0.0)
    cut_d, first_d = asdict(at_cut), asdict(at_first)
    steady = Usage(**{k: v - first_d[k] for k, v in cut_d.items()})
    a = assumptions_from_usage(at_cut)  # per-trajectory figures over the whole window
    if steady.rollout_alive_s > 0:
        a.rollout_tokens_per_s = steady.tokens_generated / steady.rollout_alive_s
    if steady.trainer_alive_s > 0:
        a.train_tokens_per_s = steady.tokens_trained / steady.trainer_alive_s
    a.startup_device_seconds = at_first.rollout_alive_s + at_first.trainer_alive_s
    a.wall_seconds = cut - t_start
    return a


def to_dict(a: Assumptions) -> dict[str, float]:
    return {k: float(v) for k, v in a.model_dump().items()}
