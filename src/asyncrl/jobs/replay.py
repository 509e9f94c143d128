"""``asyncrl replay RUN``: train the learner on a run's archived batches, without rollouts.

For debugging the trainer on recorded data. The learner starts from the run's ``initial_policy`` with
the run's seed and config, and takes the archived batches in step order, each at the weight version it
was originally trained at (so staleness ages and corrections are the same). No queue, no rollout
worker, no weight publication. Each step's metrics go to ``RUN/replay/metrics.jsonl``; where the
original trainer recorded the same step, the replayed ``loss/policy`` is compared with it — on the same
machine and torch build a faithful replay reproduces it to rounding. The learner computes with the
trainer's torch threads (``launcher.torch_threads``, or ``solo_threads`` for a sync run), so its
matmuls reduce in the trainer's order.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from asyncrl.bootstrap import pinned_threads, torch_threads
from asyncrl.config import load_config
from asyncrl.errors import UserError
from asyncrl.telemetry.archive import read_batches
from asyncrl.telemetry.jsonl import MetricWriter, read_jsonl

COMPARED = ("loss/policy", "train/grad_norm", "staleness/mean", "reward/mean")


def recorded_steps(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The trainer's own metric rows by step (the last row written for each step)."""
    rows = read_jsonl(run_dir / "metrics" / "trainer.jsonl")
    return {r["step"]: r for r in rows if "event" not in r and isinstance(r.get("step"), int)}


def replay(run_dir: Path, *, steps: int | None = None, save: bool = False) -> dict[str, Any]:
    import torch

    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner

    if not (run_dir / "config.yaml").is_file() or not (run_dir / "initial_policy").is_dir():
        raise UserError(f"{run_dir}: not a run directory (needs config.yaml and initial_policy/)")
    batches = read_batches(run_dir)
    if not batches:
        raise UserError(
            f"{run_dir}: no archived batches in archive/ (was telemetry.archive off, or did no step finish?)"
        )
    cfg = load_config(run_dir / "config.yaml")
    torch.manual_seed(cfg.seed)  # as the trainer did, so minibatch shuffles repeat

    def initial() -> Policy:
        return Policy.load(run_dir / "initial_policy", cfg=cfg.model).to(cfg.model.device)

    policy = initial()
    learner = Learner(cfg, policy, initial() if cfg.algo.kl_coef > 0 else None)
    recorded = recorded_steps(run_dir)
    out_dir = run_dir / "replay"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "metrics.jsonl").unlink(missing_ok=True)
    writer = MetricWriter(out_dir / "metrics.jsonl", role="replay")
    diffs: dict[str, float] = dict.fromkeys(COMPARED, 0.0)
    compared = 0
    t0 = time.time()
    todo = batches[:steps] if steps is not None else batches
    with pinned_threads(torch_threads(cfg, "trainer")):
        for b in todo:
            metrics = learner.step(b.groups, b.version)
            writer.write(metrics, step=b.step + 1)
            rec = recorded.get(b.step + 1)
            if rec is not None:
                compared += 1
                for k in COMPARED:
                    if rec.get(k) is not None and k in metrics:
                        diffs[k] = max(diffs[k], abs(float(rec[k]) - float(metrics[k])))
    writer.close()
    if save:
        policy.save(out_dir / "policy")
    return {
        "run_dir": str(run_dir),
        "archived_steps": len(batches),
        "replayed_steps": len(todo),
        "seconds": time.time() - t0,
        "steps_compared": compared,
        "max_abs_diff": diffs,
        "metrics": str(out_dir / "metrics.jsonl"),
    }
