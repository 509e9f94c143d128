"""Scaling curve: samples/s and trainer idle ratio as rollout workers go from 1 to 4 and as the
simulated tool latency grows, so users can see where the bottleneck moves; prints one JSON object.

    .venv/bin/python bench/scaling.py configs/demo.yaml [--workers 1 2 3 4] \
        [--latency 0 0.05 0.2 0.5] [--steps 20] [--set k=v ...]

Each cell is a short async run (``--steps`` training steps) of the same config from the same cached
warm start; the latency is lognormal with the given median (σ 1.0, capped at 5 s) on every
environment step. ``rollout.concurrent_episodes`` is per worker, so more workers also means more
episodes in flight. On this 2-core machine the rollout workers and the trainer share the cores:
beyond two processes, workers add concurrency (useful while episodes wait on tools) but not compute.
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2, 3, 4])
    ap.add_argument("--latency", nargs="+", type=float, default=[0.0, 0.05, 0.2, 0.5])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    from _common import run_stats

    from asyncrl.config import load_config
    from asyncrl.jobs.train import train
    from asyncrl.jobs.warm_start import warm_start

    warm_start(load_config(args.config, args.overrides))
    cells = []
    for latency in args.latency:
        for workers in args.workers:
            lat = (
                ["env.latency.kind=none"]
                if latency == 0
                else [
                    "env.latency.kind=lognormal",
                    f"env.latency.seconds={latency}",
                    "env.latency.max_seconds=5.0",
                ]
            )
            sets = [
                *args.overrides,
                *lat,
                f"rollout.num_workers={workers}",
                f"trainer.total_steps={args.steps}",
            ]
            cfg = load_config(
                args.config,
                [
                    *sets,
                    f"name=scaling-w{workers}-l{latency}",
                    "cost.enabled=false",
                    "telemetry.eval_every=0",
                ],
            )
            _, s = train(cfg, display=False, eval_limit=8)
            stats = run_stats(s)
            cells.append(
                {
                    "latency_median_s": latency,
                    "workers": workers,
                    **{
                        k: stats[k]
                        for k in ("samples_per_second", "trainer_idle_ratio", "staleness_mean", "rl_seconds")
                    },
                }
            )
    json.dump({"config": args.config, "steps": args.steps, "cells": cells}, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
