"""Shared by the bench scripts: the figures every run reports."""

from __future__ import annotations

import json
from pathlib import Path
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


def trainer_curve(run_dir: Path) -> list[tuple[float, float]]:
    """(seconds since the trainer process started, batch reward mean), one point per optimiser step
    (the final report row repeats the last step and is skipped)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    trainer, seen = [], set()
    for r in rows:
        if (
            r.get("role") == "trainer"
            and r.get("reward/mean") is not None
            and r.get("trainer/step") not in seen
        ):
            seen.add(r.get("trainer/step"))
            trainer.append(r)
    if not trainer:
        return []
    t0 = trainer[0]["time"] - trainer[0]["alive_s"]  # the trainer process's launch
    return [(r["time"] - t0, float(r["reward/mean"])) for r in trainer]


def time_to_target(curve: list[tuple[float, float]], target: float, window: int) -> float | None:
    """First time the moving average (``window`` steps) of the reward reaches ``target``."""
    for i in range(window - 1, len(curve)):
        if sum(r for _, r in curve[i - window + 1 : i + 1]) / window >= target:
            return curve[i][0]
    return None


def smollm2_lora_engine(stops: list[int]) -> tuple[Any, Any]:
    """``(policy, engine)``: SmolLM2-135M-Instruct with a rank-16 LoRA adapter (the demo-real recipe) and the
    rollout worker's engine for it (``make_engine(HFEngineConfig())``, seed 0, ``stops``), on one torch
    thread: what the engine benches measure (the model from ``ASYNCRL_MODELS``, as the tests find it)."""
    import sys

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from asyncrl.config import HFEngineConfig, ModelConfig
    from asyncrl.engine import HFEngine, make_engine
    from asyncrl.policy import Policy
    from models_util import smollm2_dir

    model_dir = smollm2_dir()
    policy = Policy.load(model_dir, cfg=ModelConfig(path=str(model_dir), lora={"rank": 16, "alpha": 32}))
    engine = make_engine(HFEngineConfig(), policy, stops, seed=0)
    assert isinstance(engine, HFEngine)
    return policy, engine
