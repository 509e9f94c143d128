"""Async with core lending vs async without vs the synchronous loop, on the demo-real task; prints JSON.

    PYTHONPATH=src .venv/bin/python bench/async_vs_sync_real.py [--steps 6] [--rounds 2]
        [--variants async_lend async_pinned sync_lend sync_pinned] [--config configs/smollm2_arithmetic.yaml]

Every run is ``asyncrl train`` of the demo-real config (SmolLM2-135M + LoRA, calculator difficulty 1,
16 trajectories a step in groups of 4, the same cached warm start, the same seed) for ``--steps``
RL steps; only the mode (``control.mode``) and ``launcher.lend_threads`` change:

* ``async_lend`` — ``control.mode: async``, ``max_staleness: 2``, core lending on;
* ``async_pinned`` — the same, each role pinned to one torch thread (lending off: main before it);
* ``sync_lend`` / ``sync_pinned`` — ``control.mode: sync`` (generate a batch, then train on it),
  with / without lending (pinned: the trainer trains on every core, ``launcher.solo_threads``, while
  the rollout worker generates on one).

No evaluator process and a 4-task evaluation before and after (nothing else computing: the figure
is the RL loop's). On a shared machine the absolute times are contaminated by whatever else runs,
so the variants run **interleaved** (``--rounds`` rounds, the order rotated each round) and the
report is per-variant medians and ratios to ``sync_pinned``.

Per run: seconds per step (the median interval between consecutive trainer steps after the first,
which includes start-up), the RL phase per step, and where each role's time went (trainer learning /
idle; rollout generating: prefill, decode) plus the thread-seconds each role borrowed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, list[str]] = {
    "async_lend": ["control.mode=async", "launcher.lend_threads=true"],
    "async_pinned": ["control.mode=async", "launcher.lend_threads=false"],
    "sync_lend": ["control.mode=sync", "launcher.lend_threads=true"],
    "sync_pinned": ["control.mode=sync", "launcher.lend_threads=false"],
}


def last_rows(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each role's last metric row (not events)."""
    out: dict[str, dict[str, Any]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "event" not in r and r.get("role"):
            out[str(r["role"])] = r
    return out


def step_gaps(run_dir: Path) -> list[float]:
    """Seconds between consecutive trainer steps' report rows (one row per optimiser step; the first
    step, which includes start-up, has no gap)."""
    seen: dict[float, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("role") == "trainer" and "event" not in r and r.get("trainer/step"):
            seen.setdefault(float(r["trainer/step"]), float(r["time"]))
    return [b - a for a, b in itertools.pairwise(seen[k] for k in sorted(seen))]


def measure(run_dir: Path, summary: dict[str, Any], steps: int, batch: int = 16) -> dict[str, Any]:
    rows = last_rows(run_dir)
    tr, ro = rows.get("trainer", {}), rows.get("rollout-0", {})
    gaps = step_gaps(run_dir)

    def f(r: dict[str, Any], k: str) -> float:
        return round(float(r.get(k) or 0.0), 1)

    return {
        "seconds_per_step": round(statistics.median(gaps), 2) if gaps else None,
        "step_gaps": [round(g, 1) for g in gaps],
        "rl_seconds_per_step": round(summary["rl_seconds"] / steps, 2),
        "trainer_learn_s": f(tr, "trainer/learn_seconds"),
        "trainer_idle_s": f(tr, "trainer/idle_seconds"),
        "rollout_generate_s": f(ro, "rollout/gen_busy_seconds"),
        "rollout_prefill_s": f(ro, "rollout/prefill_seconds"),
        "rollout_decode_s": f(ro, "rollout/decode_seconds"),
        "threads_borrowed_by": summary.get("threads_borrowed_by", {}),
        "trainer_steps": summary["trainer_steps"],
        "samples_accepted": summary.get("samples_accepted"),
        **per_step_roles(tr, ro, summary, steps, batch),
        "lost_trajectories": summary["lost_trajectories"],
        "token_exact_rate": summary.get("token_exact_rate"),
        "run_dir": str(run_dir),
    }


def per_step_roles(
    tr: dict[str, Any], ro: dict[str, Any], summary: dict[str, Any], steps: int, batch: int
) -> dict[str, Any]:
    """Each role's busy seconds per optimiser step (issue #37 item 3): ``t_train`` = the trainer's learning
    seconds / steps; ``t_rollout`` = the worker's generation seconds per sample it delivered x the samples a
    step trains (the worker runs ahead of the trainer, so its total covers more than ``steps`` batches);
    ``ideal_async_step`` = the larger of the two, what a perfect overlap of the two stages would take."""
    delivered = summary.get("samples_accepted") or 0
    t_train = float(tr.get("trainer/learn_seconds") or 0.0) / steps
    t_roll = float(ro.get("rollout/gen_busy_seconds") or 0.0) / delivered * batch if delivered else None
    return {
        "t_train": round(t_train, 2),
        "t_rollout": round(t_roll, 2) if t_roll is not None else None,
        "ideal_async_step": round(max(t_train, t_roll), 2) if t_roll is not None else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2_arithmetic.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=sorted(VARIANTS))
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, help="also write the JSON here (after every run)")
    args = ap.parse_args()

    from asyncrl.config import load_config
    from asyncrl.jobs.train import train
    from asyncrl.jobs.warm_start import warm_start

    base = [*args.overrides, f"trainer.total_steps={args.steps}", "telemetry.eval_every=0"]
    warm_start(load_config(args.config, base))  # cached before timing anything
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    out: dict[str, Any] = {"config": args.config, "steps": args.steps, "overrides": args.overrides}
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants) :] + args.variants[: r % len(args.variants)]
        for v in order:
            cfg = load_config(args.config, [*base, *VARIANTS[v], f"name=bench-{v}"])
            started = time.time()
            run_dir, s = train(cfg, display=False, eval_limit=4)
            runs[v].append(
                {
                    "round": r,
                    "started": round(started),
                    **measure(run_dir, s, args.steps, cfg.trainer.batch_size),
                }
            )
            out["runs"], out["summary"] = runs, summarise(runs)
            if args.out:
                args.out.write_text(json.dumps(out, indent=2))
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant: the median seconds per step over its runs, and its ratio to ``sync_pinned``'s
    (below 1: faster than the synchronous loop as it was)."""
    med = {
        v: statistics.median(x["seconds_per_step"] for x in rs if x["seconds_per_step"])
        for v, rs in runs.items()
        if any(x["seconds_per_step"] for x in rs)
    }
    ref = med.get("sync_pinned")
    return {
        v: {
            "median_seconds_per_step": round(m, 2),
            "ratio_to_sync_pinned": round(m / ref, 3) if ref else None,
        }
        for v, m in med.items()
    }


if __name__ == "__main__":
    raise SystemExit(main())
