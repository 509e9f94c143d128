"""Credit-assignment study: generated tokens (and samples, seconds) to a target held-out success; JSON.

    PYTHONPATH=src .venv/bin/python bench/credit_study.py [--envs calculator kb_lookup]
        [--strategies outcome value_delta turn_group tree tree_outcome tree_tokens] [--seeds 0 1 2]
        [--steps 12] [--batch 32] [--eval-limit 64] [--eval-at 4 8] [--target-gain 0.10 0.20]
        [--ablate-trajectories 6 --ablate-k 4] [--out results.json]

Every (environment, strategy, seed) runs the whole job through ``asyncrl.jobs.train.train``
with the same number of steps of ``--batch`` trajectories and the same cached warm start. All
weight versions are kept; after the run the versions in ``--eval-at`` are evaluated on the first
``--eval-limit`` held-out tasks, next to the run's own initial (version 0) and final evaluations.
A run *reaches a target* (initial success + each ``--target-gain``) at the first evaluated version
at or above it; its cost is the generated (sampled, not replayed) model tokens trained up to that
version (``trainer/tokens_trained``: contention does not change it), and the seconds since the
trainer started (it does). ``tokens_interp`` interpolates the crossing linearly between
evaluations. ``tree`` runs tree groups (``rollout.tree``, leaf budget: as many episodes as a flat
group) with tree credit; ``tree_outcome`` the same groups with outcome credit (separating what the
tree's sampling does from what its credit does); ``tree_tokens`` tree credit on tree groups with the
token budget (as many generated tokens as a flat group: more, cheaper episodes).
At the end the ablation (``asyncrl credit ablate``) runs on the first seed's ``value_delta`` and
``outcome`` runs of the first environment and reports the Spearman correlation of the Monte Carlo
segment contributions with the assigned credit. Results are also written to ``--out`` after every
run, so a partial study is not lost.
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

STRATEGIES = {  # credit.strategy plus what else the strategy needs
    "outcome": [],
    "process": [],
    "gae": [],
    "value_delta": [],
    "turn_group": [],
    "tree": ["rollout.tree.enabled=true"],  # tree groups credited from the tree
    "tree_outcome": ["rollout.tree.enabled=true"],  # the same tree groups, outcome credit
    # tree credit on tree groups as large as a flat group's generated tokens allow (equal tokens)
    "tree_tokens": ["rollout.tree.enabled=true", "rollout.tree.budget=tokens"],
}
CREDIT = {"tree_outcome": "outcome", "tree_tokens": "tree"}  # credit.strategy where it is not the name

ENVS = {
    "calculator": ("configs/demo.yaml", ["env.latency.kind=none"]),
    "strings": (  # 48 new tokens a turn: a 3-operation call on a doubled word is longer than 24
        "configs/demo.yaml",
        [
            "env.latency.kind=none",
            "env.kind=strings",
            "env.min_difficulty=3",
            "rollout.sampling.max_new_tokens=48",
            "model.max_context=512",
        ],
    ),
    # the same 3-operation pipelines by reference: "_" names the previous result, so the model
    # chooses the operations in order and copies no string (the tiny models garble copies)
    "strings_ref": (
        "configs/demo.yaml",
        [
            "env.latency.kind=none",
            "env.kind=strings",
            "env.min_difficulty=3",
            "env.options.reference=true",
            "rollout.sampling.max_new_tokens=48",
            "model.max_context=512",
        ],
    ),
    "kb_lookup": ("configs/kb_lookup.yaml", []),
    # the demo-real task (SmolLM2-135M + LoRA, one calc call then the answer): pass its own
    # budget, e.g. --batch 16 --lr 2e-4 --set rollout.group_size=4 (--set wins over the study's 8)
    "smollm2_arithmetic": ("configs/smollm2_arithmetic.yaml", []),
    # SmolLM2 + LoRA on 2-operation pipelines by reference: a branch point between tool calls
    "smollm2_strings": ("configs/smollm2_strings.yaml", []),
}


def run_one(env: str, strategy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train
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
            f"credit.strategy={CREDIT.get(strategy, strategy)}",
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
    policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model)  # cfg: LoRA models load their adapter
    for v in args.eval_at:
        if 0 < v < args.steps and v in store.versions():
            policy.load_tensors(store.load(v).tensors)
            curve[v] = evaluate_policy(cfg, policy, limit=args.eval_limit, seed=cfg.seed)["success_rate"]
    curve[int(s["trainer_steps"])] = s["final_success"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    trainer_rows = [r for r in metrics if r.get("role") == "trainer" and "event" not in r]
    by_step = {int(r["step"]): r for r in trainer_rows if "step" in r}
    start = min((r["time"] - r["alive_s"] for r in trainer_rows), default=0.0)  # the trainer's start
    tokens = {v: by_step[v]["trainer/tokens_trained"] if v else 0.0 for v in curve if v == 0 or v in by_step}
    seconds = {v: round(by_step[v]["time"] - start, 1) if v else 0.0 for v in tokens}
    last = trainer_rows[-1] if trainer_rows else {}
    row: dict[str, Any] = {
        "env": env,
        "strategy": strategy,
        "seed": seed,
        "run_dir": str(run_dir),
        "initial_success": s["initial_success"],
        "final_success": s["final_success"],
        "curve": {str(v): curve[v] for v in sorted(curve)},  # weight version -> held-out success
        "tokens_at": {str(v): tokens[v] for v in sorted(tokens)},  # generated tokens trained by then
        "seconds_at": {str(v): seconds[v] for v in sorted(seconds)},  # since the trainer started
        "samples_trained": s["samples_trained"],
        "generated_tokens": last.get("trainer/tokens_trained", 0.0),  # replayed turns are not counted
        "value_brier": last.get("value/brier"),
        "value_auc": last.get("value/auc"),
        "seconds": round(time.time() - t0, 1),
    }
    for gain in args.target_gain:
        hit = to_target(curve, tokens, seconds, s["initial_success"] + gain)
        row[f"target+{round(gain * 100)}"] = hit
    add_smoothed_targets(row, args.target_gain)
    return row


def to_target(
    curve: dict[int, float], tokens: dict[int, float], seconds: dict[int, float], target: float
) -> dict[str, Any] | None:
    """The first evaluated version at or above ``target`` and its generated tokens and seconds; also
    the tokens where the curve, linearly interpolated between evaluations, first crosses it."""
    versions = [v for v in sorted(curve) if v in tokens]
    for prev, v in itertools.pairwise(versions):
        if curve[v] >= target:
            lo, hi = curve[prev], curve[v]
            frac = 1.0 if hi <= lo else min(1.0, max(0.0, (target - lo) / (hi - lo)))
            interp = tokens[prev] + frac * (tokens[v] - tokens[prev])
            return {"version": v, "tokens": tokens[v], "tokens_interp": round(interp), "seconds": seconds[v]}
    return None


def smoothed(curve: dict[int, float]) -> dict[int, float]:
    """The curve averaged over each evaluation and its two neighbours (one at the ends), version 0
    kept as measured: a crossing of the smoothed curve is the trend's, not one lucky evaluation's
    (a 128-task evaluation has a standard error of ~4.4 points)."""
    vs = sorted(curve)
    out = {vs[0]: curve[vs[0]]}
    for i, v in enumerate(vs[1:], start=1):
        window = [curve[u] for u in vs[max(1, i - 1) : i + 2]]
        out[v] = sum(window) / len(window)
    return out


def add_smoothed_targets(row: dict[str, Any], gains: list[float]) -> None:
    """``smoothed+N``: :func:`to_target` on the :func:`smoothed` curve (interpolated tokens)."""
    curve = {int(v): x for v, x in row["curve"].items()}
    tokens = {int(v): x for v, x in row["tokens_at"].items()}
    seconds = {int(v): x for v, x in row["seconds_at"].items()}
    for gain in gains:
        row[f"smoothed+{round(gain * 100)}"] = to_target(
            smoothed(curve), tokens, seconds, row["initial_success"] + gain
        )


def aggregate(rows: list[dict[str, Any]], gains: list[float]) -> dict[str, Any]:
    """Per environment and strategy: held-out gain and, per target, tokens / seconds to reach it."""
    out: dict[str, Any] = {}
    for r in rows:
        out.setdefault(r["env"], {}).setdefault(r["strategy"], []).append(r)
    table: dict[str, Any] = {}
    for env, by in out.items():
        for strat, rs in by.items():
            gain = [r["final_success"] - r["initial_success"] for r in rs]
            entry: dict[str, Any] = {
                "seeds": len(rs),
                "final_success_mean": round(statistics.mean(r["final_success"] for r in rs), 3),
                "gain_mean": round(statistics.mean(gain), 3),
                "gain_std": round(statistics.stdev(gain), 3) if len(gain) > 1 else 0.0,
                "tokens_per_sample": round(
                    sum(r["generated_tokens"] for r in rs) / max(1, sum(r["samples_trained"] for r in rs)), 2
                ),
            }
            for g in gains:
                key = f"smoothed+{round(g * 100)}"
                hits = [r[key] for r in rs if r.get(key)]
                entry[key] = {
                    "reached": f"{len(hits)}/{len(rs)}",
                    "tokens_interp_per_seed": [r[key]["tokens_interp"] if r.get(key) else None for r in rs],
                    **_stats("tokens_interp", [h["tokens_interp"] for h in hits]),
                }
                key = f"target+{round(g * 100)}"
                hits = [r[key] for r in rs if r.get(key)]
                entry[key] = {
                    "reached": f"{len(hits)}/{len(rs)}",
                    "tokens_per_seed": [r[key]["tokens"] if r.get(key) else None for r in rs],
                    "tokens_interp_per_seed": [r[key]["tokens_interp"] if r.get(key) else None for r in rs],
                    "seconds_per_seed": [r[key]["seconds"] if r.get(key) else None for r in rs],
                    **_stats("tokens", [h["tokens"] for h in hits]),
                    **_stats("tokens_interp", [h["tokens_interp"] for h in hits]),
                    **_stats("seconds", [h["seconds"] for h in hits]),
                }
            table.setdefault(env, {})[strat] = entry
    return table


def _stats(name: str, xs: list[float]) -> dict[str, float | None]:
    return {
        f"{name}_mean": round(statistics.mean(xs), 1) if xs else None,
        f"{name}_std": round(statistics.stdev(xs), 1) if len(xs) > 1 else None,
    }


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
    ap.add_argument("--target-gain", nargs="+", type=float, default=[0.10])
    ap.add_argument("--ablate-trajectories", type=int, default=6)
    ap.add_argument("--ablate-k", type=int, default=4)
    ap.add_argument("--run-root", default="runs/credit-study")
    ap.add_argument("--out", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument(
        "--summarize",
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: merge the runs of these result files and print (and --out) the table "
        "for --target-gain",
    )
    args = ap.parse_args()
    if args.summarize:
        return summarize(args)

    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "out"}}

    def dump() -> None:
        result["runs"] = rows
        result["table"] = aggregate(rows, args.target_gain)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))

    for seed in args.seeds:  # seeds outermost: a cut-short study still covers every strategy
        for env in args.envs:
            for strategy in args.strategies:
                rows.append(run_one(env, strategy, seed, args))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                dump()
    if args.ablate_trajectories > 0:
        from asyncrl.jobs.credit_ablate import ablate

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


def summarize(args: argparse.Namespace) -> int:
    """Re-aggregate saved studies (e.g. invocations run separately) for ``--target-gain``."""
    rows = [r for path in args.summarize for r in json.loads(Path(path).read_text())["runs"]]
    for r in rows:
        for gain in args.target_gain:
            curve = {int(v): x for v, x in r["curve"].items()}
            tokens = {int(v): x for v, x in r["tokens_at"].items()}
            seconds = {int(v): x for v, x in r["seconds_at"].items()}
            r[f"target+{round(gain * 100)}"] = to_target(curve, tokens, seconds, r["initial_success"] + gain)
        add_smoothed_targets(r, args.target_gain)
    result = {"merged_from": args.summarize, "runs": rows, "table": aggregate(rows, args.target_gain)}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    json.dump(result["table"], sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
