"""Credit-assignment study: trained samples to reach a target held-out success, per strategy; prints JSON.

    PYTHONPATH=src .venv/bin/python bench/credit_study.py [--envs calculator kb_lookup]
        [--strategies outcome value_delta turn_group tree tree_outcome] [--seeds 0 1 2]
        [--steps 12] [--batch 32] [--eval-limit 64] [--eval-at 4 8] [--target-gain 0.10]
        [--ablate-trajectories 6 --ablate-k 4] [--out results.json]

Every (environment, strategy, seed) runs the whole job through ``asyncrl.orchestrator.run.train``
with the same sample budget (``steps × batch`` trained samples) and the same cached warm start.
All weight versions are kept; after the run the versions in ``--eval-at`` are evaluated on the
first ``--eval-limit`` held-out tasks, next to the run's own initial (version 0) and final
evaluations. A run *reaches the target* at the first evaluated version whose held-out success is
at least its initial success + ``--target-gain``; its cost is ``version × batch`` trained samples,
the sampled (generated, not replayed) tokens of those steps and their share of the RL wall time.
``tree`` runs tree groups (``rollout.tree``) with tree credit; ``tree_outcome`` the same groups with
outcome credit (separating what the tree's sampling does from what its credit does).
At the end the ablation (``asyncrl credit ablate``) runs on the first seed's ``value_delta`` and
``outcome`` runs of the first environment and reports the Spearman correlation of the Monte Carlo
segment contributions with the assigned credit. Results are also written to ``--out`` after every
run, so a partial study is not lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

STRATEGIES = {  # credit.strategy plus what else the strategy needs
    "outcome": [],
    "process": [],
    "gae": [],
    "value_delta": [],
    "turn_group": [],
    "tree": ["rollout.tree.enabled=true"],  # tree groups credited from the tree
    "tree_outcome": ["rollout.tree.enabled=true"],  # the same tree groups, outcome credit
}

ENVS = {
    "calculator": ("configs/demo.yaml", ["env.latency.kind=none"]),
    "strings": ("configs/demo.yaml", ["env.latency.kind=none", "env.kind=strings", "env.min_difficulty=3"]),
    "kb_lookup": ("configs/kb_lookup.yaml", []),
}


def run_one(env: str, strategy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.orchestrator.run import train
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import evaluate_policy
    from asyncrl.weights import make_weight_store

    path, extra = ENVS[env]
    cfg = load_config(
        path,
        [
            *extra,
            f"name=credit-{env}-{strategy}-s{seed}",
            f"run_root={args.run_root}",
            f"seed={seed}",
            f"credit.strategy={strategy.removeprefix('tree_')}",
            *STRATEGIES[strategy],
            f"trainer.total_steps={args.steps}",
            f"trainer.batch_size={args.batch}",
            f"trainer.lr={args.lr}",
            "rollout.group_size=8",
            "trainer.checkpoint_every=4",
            f"weights.keep={args.steps + 2}",
            "credit.sample_every=4",
            "credit.sample_size=8",
            *args.overrides,
        ],
    )
    t0 = time.time()
    run_dir, s = train(cfg, display=False, eval_limit=args.eval_limit)
    curve = {0: s["initial_success"]}
    store = make_weight_store(cfg.weights, run_dir)
    policy = Policy.load(run_dir / "initial_policy")
    for v in args.eval_at:
        if 0 < v < args.steps and v in store.versions():
            policy.load_tensors(store.load(v).tensors)
            curve[v] = evaluate_policy(cfg, policy, limit=args.eval_limit, seed=cfg.seed)["success_rate"]
    curve[int(s["trainer_steps"])] = s["final_success"]
    target = s["initial_success"] + args.target_gain
    reached = next((v for v in sorted(curve) if v > 0 and curve[v] >= target), None)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    trainer_rows = [r for r in metrics if r.get("role") == "trainer" and "event" not in r]
    last = trainer_rows[-1] if trainer_rows else {}
    tokens = last.get("trainer/tokens_trained", 0.0)  # sampled tokens: replayed turns are not counted
    per_step = tokens / max(1, int(s["trainer_steps"]))
    return {
        "env": env,
        "strategy": strategy,
        "tokens_to_target": None if reached is None else round(reached * per_step),
        "seconds_to_target": None if reached is None else round(s["rl_seconds"] * reached / args.steps, 1),
        "generated_tokens": tokens,
        "seed": seed,
        "run_dir": str(run_dir),
        "initial_success": s["initial_success"],
        "final_success": s["final_success"],
        "curve": {str(k * args.batch): v for k, v in sorted(curve.items())},
        "samples_to_target": None if reached is None else reached * args.batch,
        "samples_trained": s["samples_trained"],
        "value_brier": last.get("value/brier"),
        "value_auc": last.get("value/auc"),
        "guard_frac": last.get("credit/guard_frac"),
        "seconds": round(time.time() - t0, 1),
    }


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in rows:
        out.setdefault(r["env"], {}).setdefault(r["strategy"], []).append(r)
    table: dict[str, Any] = {}
    for env, by in out.items():
        for strat, rs in by.items():
            gains = [r["final_success"] - r["initial_success"] for r in rs]
            hits = [r["samples_to_target"] for r in rs if r["samples_to_target"] is not None]
            tok = [r["tokens_to_target"] for r in rs if r.get("tokens_to_target") is not None]
            table.setdefault(env, {})[strat] = {
                "seeds": len(rs),
                "final_success_mean": round(statistics.mean(r["final_success"] for r in rs), 3),
                "gain_mean": round(statistics.mean(gains), 3),
                "gain_std": round(statistics.stdev(gains), 3) if len(gains) > 1 else 0.0,
                "reached_target": f"{len(hits)}/{len(rs)}",
                "samples_to_target_mean_of_reached": round(statistics.mean(hits), 1) if hits else None,
                "tokens_to_target_mean_of_reached": round(statistics.mean(tok)) if tok else None,
                "tokens_to_target_std": round(statistics.stdev(tok)) if len(tok) > 1 else None,
            }
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument(
        "--strategies",
        nargs="+",
        default=["outcome", "value_delta", "turn_group", "tree"],
        choices=list(STRATEGIES),
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval-limit", type=int, default=64)
    ap.add_argument("--eval-at", nargs="*", type=int, default=[4, 8])
    ap.add_argument("--target-gain", type=float, default=0.10)
    ap.add_argument("--ablate-trajectories", type=int, default=6)
    ap.add_argument("--ablate-k", type=int, default=4)
    ap.add_argument("--run-root", default="runs/credit-study")
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "out"}}

    def dump() -> None:
        result["runs"] = rows
        result["table"] = aggregate(rows)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))

    for seed in args.seeds:  # seeds outermost: a cut-short study still covers every strategy
        for env in args.envs:
            for strategy in args.strategies:
                rows.append(run_one(env, strategy, seed, args))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                dump()
    if args.ablate_trajectories > 0:
        from asyncrl.credit.ablate import ablate

        env = args.envs[0]
        ablation = {}
        for strategy in ("value_delta", "outcome"):
            run = next((r for r in rows if r["env"] == env and r["strategy"] == strategy), None)
            if run is None:
                continue
            rep = ablate(run["run_dir"], trajectories=args.ablate_trajectories, k=args.ablate_k)
            ablation[strategy] = {
                k: rep.get(k) for k in ("spearman", "segments", "episodes", "value_vs_mc_spearman", "policy")
            }
        result["ablation"] = {"env": env, **ablation}
    dump()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
