"""Async vs one-step-off vs sync, under several tool-latency profiles, side by side; prints one JSON object.

    .venv/bin/python bench/modes.py configs/demo.yaml \
        [--latency none lognormal pareto] [--modes async one_step_off sync] \
        [--target 0.7] [--eval-every 10] [--eval-limit 128] [--set k=v ...]

Every run uses the same config, the same cached warm start (so every mode starts from the same
policy), the same seeds and the same sample budget (``total_steps × batch_size``). Only the
orchestrator mode and the latency profile change.

Time to target is measured WITHOUT perturbing the runs: every weight snapshot is kept
(``weights.keep``) with its publish time; after a run, the snapshots at every ``--eval-every``
versions are evaluated on the held-out split (sampled at the rollout temperature, latency off) and
the first version whose success reaches ``--target`` gives the time (publish time − trainer
launch). Also reported: RL wall time, samples/s, trainer idle ratio (1 − busy fraction),
staleness, drops and held-out success before/after.

Latency profiles (per environment step): ``none``; ``lognormal`` median 50 ms, σ 1.0;
``pareto`` x_m 50 ms, α 1.5 (heavy-tailed, infinite variance), capped at 5 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROFILES: dict[str, list[str]] = {
    "none": ["env.latency.kind=none"],
    "lognormal": ["env.latency.kind=lognormal", "env.latency.seconds=0.05", "env.latency.sigma=1.0"],
    "pareto": [
        "env.latency.kind=pareto",
        "env.latency.seconds=0.05",
        "env.latency.alpha=1.5",
        "env.latency.max_seconds=5.0",
    ],
}


def success_curve(cfg: Any, run_dir: Path, every: int, limit: int) -> list[tuple[int, float, float]]:
    """(version, seconds since trainer launch, held-out success) for every ``every``-th snapshot."""
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import evaluate_policy
    from asyncrl.weights import make_weight_store

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r.get("role") == "trainer" and "alive_s" in r)
    launched = first["time"] - first["alive_s"]
    store = make_weight_store(cfg.weights, run_dir)
    policy = Policy.load(run_dir / "initial_policy")
    curve = []
    for v in store.versions():
        if v == 0 or v % every:
            continue
        snap = store.load(v)
        policy.load_tensors(snap.tensors)
        created = float(snap.manifest["created_at"])
        success = evaluate_policy(cfg, policy, limit=limit, seed=cfg.seed)["success_rate"]
        curve.append((v, round(created - launched, 1), round(success, 4)))
    return curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["async", "one_step_off", "sync"],
        choices=["async", "one_step_off", "sync"],
    )
    ap.add_argument("--latency", nargs="+", default=["pareto"], choices=sorted(PROFILES))
    ap.add_argument("--target", type=float, default=0.7, help="held-out success to reach")
    ap.add_argument("--eval-every", type=int, default=10, help="evaluate every N-th weight version")
    ap.add_argument("--eval-limit", type=int, default=128, help="held-out tasks per evaluation")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    from _common import run_stats

    from asyncrl.config import load_config
    from asyncrl.jobs.train import train
    from asyncrl.jobs.warm_start import warm_start

    warm_start(load_config(args.config, args.overrides))  # cached before timing anything
    results: dict[str, dict[str, Any]] = {}
    for profile in args.latency:
        results[profile] = {}
        for mode in args.modes:
            sets = [*args.overrides, *PROFILES[profile], f"control.mode={mode}"]
            # every snapshot kept for the post-hoc evaluation; no evaluator process competing for the cores
            sets += [f"name=bench-{profile}-{mode}", "weights.keep=10000", "telemetry.eval_every=0"]
            cfg = load_config(args.config, sets)
            run_dir, s = train(cfg, display=False, eval_limit=args.eval_limit)
            curve = success_curve(cfg, run_dir, args.eval_every, args.eval_limit)
            reached = next((t for _, t, succ in curve if succ >= args.target), None)
            results[profile][mode] = {
                "seconds_to_target": reached,
                **run_stats(s),
                "success_curve": curve,
                "run_dir": str(run_dir),
            }
        by_mode = results[profile]
        if "async" in by_mode and "sync" in by_mode:
            a, y = by_mode["async"], by_mode["sync"]
            by_mode["speedup_rl_wall"] = round(y["rl_seconds"] / a["rl_seconds"], 2)
            if a["seconds_to_target"] and y["seconds_to_target"]:
                by_mode["speedup_to_target"] = round(y["seconds_to_target"] / a["seconds_to_target"], 2)
            by_mode["final_success_gap_points"] = round((a["final_success"] - y["final_success"]) * 100, 1)
    out = {"config": args.config, "overrides": args.overrides, "target": args.target, "results": results}
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
