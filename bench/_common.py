"""Shared by the bench scripts: the figures every run reports."""

from __future__ import annotations

from typing import Any


def run_stats(s: dict[str, Any]) -> dict[str, Any]:
    """Throughput, trainer idle ratio, staleness and quality from a run's ``summary.json``."""
    return {
        "rl_seconds": round(s["rl_seconds"], 1),
        "samples_trained": s["samples_trained"],
        "samples_per_second": round(s["samples_trained"] / max(s["rl_seconds"], 1e-9), 1),
        "trainer_idle_ratio": round(1.0 - s["trainer_busy_fraction"], 3),
        "staleness_mean": round(s["staleness_mean"], 3),
        "samples_dropped_stale": s["samples_dropped_stale"],
        "initial_success": s["initial_success"],
        "final_success": s["final_success"],
        "lost_trajectories": s["lost_trajectories"],
    }
