"""Time to target: the calculator through the gateway (an ``openai`` agent program) vs the built-in
environment, same model, same warm start, same budget, one after the other in one invocation.

Both runs use ``configs/agent.yaml`` as ``tests/test_gateway_e2e.py`` does (difficulty 2–3, groups of
8, batches of 64, ``max_staleness: 2``); only ``env.kind`` differs. The agent path
reaches the same policy through HTTP + the ``openai`` SDK + session bookkeeping and rebuilds each
sample from the recorded calls; the built-in path calls the environment in-process. Reported per
run: the trainer's reward curve against wall time since the trainer started, the time for its
moving average (``--window`` steps) to reach ``--target``, held-out success before and after, and
the run's throughput figures. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/gateway_time_to_target.py --steps 15
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_stats, time_to_target, trainer_curve

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "agent.yaml"  # the agent demo; tests/test_gateway_e2e.py runs the same
SHARED = [
    "rollout.concurrent_episodes=64",
    "telemetry.log_every_s=0.5",
    "telemetry.eval_every=0",
    "telemetry.tensorboard=false",
]
PATHS = {
    "gateway": [],
    "builtin": ["env.kind=calculator", "env.path=null"],  # the same tasks, the environment in-process
}


def run(
    path: str, steps: int, seed: int, root: Path, cache: Path, target: float, window: int
) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    cfg = load_config(
        CONFIG,
        [
            *PATHS[path],
            *SHARED,
            f"trainer.total_steps={steps}",
            f"seed={seed}",
            f"run_root={root / path}",
            f"cache_dir={cache}",  # one warm-start cache: the SFT checkpoint is shared when keys match
        ],
    )
    started = time.time()
    run_dir, s = train(cfg, display=False, eval_limit=96)
    curve = trainer_curve(run_dir)
    ttt = time_to_target(curve, target, window)
    return {
        "path": path,
        "wall_seconds": round(time.time() - started, 1),
        "seconds_to_target": None if ttt is None else round(ttt, 1),
        "steps_to_target": next(
            (i + 1 for i, (t, _) in enumerate(curve) if ttt is not None and t >= ttt), None
        ),
        "reward_first": round(curve[0][1], 3) if curve else None,
        "reward_last": round(curve[-1][1], 3) if curve else None,
        **run_stats(s),
        "token_exact_rate": s.get("token_exact_rate"),
        "curve": [(round(t, 1), round(r, 3)) for t, r in curve],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.6, help="batch reward moving average to reach")
    ap.add_argument("--window", type=int, default=3)
    ap.add_argument("--paths", default="gateway,builtin")
    args = ap.parse_args()
    os.chdir(ROOT)  # the agent module (examples/) is imported from the working directory
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="asyncrl-ttt-") as tmp:
        root = Path(tmp)
        results = [
            run(p, args.steps, args.seed, root, root / "cache", args.target, args.window)
            for p in args.paths.split(",")
        ]
    print(json.dumps({"target": args.target, "window": args.window, "steps": args.steps, "runs": results}))


if __name__ == "__main__":
    main()
