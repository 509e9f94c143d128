"""Async vs one-step-off vs sync on the same config, side by side in one run; prints one JSON object.

    .venv/bin/python bench/modes.py configs/demo.yaml [--modes async sync] [--set k=v ...]

Each mode runs the whole job (the warm start is cached and shared, so every mode starts from the
same policy) and reports wall time of the RL phase, samples/s, trainer busy fraction, staleness and
held-out success before/after.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument(
        "--modes", nargs="+", default=["async", "sync"], choices=["async", "one_step_off", "sync"]
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    from asyncrl.config import load_config
    from asyncrl.orchestrator.run import train
    from asyncrl.trainer.sft import warm_start

    base = load_config(args.config, args.overrides)
    warm_start(base)  # cached before timing anything
    results = {}
    for mode in args.modes:
        cfg = load_config(args.config, [*args.overrides, f"orchestrator.mode={mode}", f"name=bench-{mode}"])
        _, s = train(cfg, display=False)
        rl_seconds = s["rl_seconds"]
        results[mode] = {
            "wall_seconds": round(s["wall_seconds"], 1),
            "rl_seconds": round(rl_seconds, 1),
            "samples_trained": s["samples_trained"],
            "samples_per_second": round(s["samples_trained"] / max(rl_seconds, 1e-9), 1),
            "trainer_busy_fraction": round(s["trainer_busy_fraction"], 3),
            "staleness_mean": round(s["staleness_mean"], 3),
            "samples_dropped_stale": s["samples_dropped_stale"],
            "initial_success": s["initial_success"],
            "final_success": s["final_success"],
            "lost_trajectories": s["lost_trajectories"],
        }
    if "async" in results and "sync" in results:
        results["speedup_async_over_sync"] = round(
            results["sync"]["rl_seconds"] / results["async"]["rl_seconds"], 2
        )
    json.dump({"config": args.config, "overrides": args.overrides, "results": results}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
