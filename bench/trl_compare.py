"""asyncrl vs TRL's GRPOTrainer on the same single-turn task, side by side; prints one JSON object.

(``--task demo-real``: the real-model comparison on ``make demo-real``'s multi-turn task, SmolLM2 +
LoRA, steps and time to a held-out target — ``bench/trl_demo_real.py``.)

    .venv/bin/python bench/trl_compare.py --trl-python .venv-bench/bin/python [--seeds 1 2 3] [--steps 100]
        [--lr 3e-4] [--target 0.8] [--sft-steps 500] [--corruption 0.8] [--latency none|pareto]

Both sides start from the SAME warm-started policy (one ``asyncrl sft`` run of the
``first_step_task`` plugin, cached), score with the SAME reward function
(``bench/first_step_task.py``) and use the same group size (8), batch (64 completions per
optimiser step), learning rate, clip range (0.2 / 0.28), token-mean loss (TRL ``loss_type="dapo"``),
no KL term, temperature 1, completion limit and sample budget (steps × 64). asyncrl runs its
default async mode (one rollout process + one trainer process, one torch thread each); TRL runs in
one process with two torch threads, so both use the machine's two cores. TRL is a benchmark-only
dependency: ``make bench-venv`` installs it into ``.venv-bench`` (it does not conflict with our pins,
but it pulls datasets/pandas/pyarrow we do not want in the runtime).

Measured per side: wall time from the start of training (asyncrl: trainer process launch; TRL:
``trainer.train()``) until the moving average of the training reward over 5 steps first reaches
``--target``, final moving-average reward, and total training wall time.

``--latency pareto`` gives every verification a heavy-tailed delay (the demo's tool latency: x_m
50 ms, α 1.5, capped at 5 s). asyncrl applies it per episode (its environment wrapper), overlapping
it with other episodes' generation; TRL scores a whole batch in one reward call, so its fairest
synchronous version runs the 64 verifications in parallel and waits for the slowest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import time_to_target, trainer_curve  # noqa: E402

GROUP, BATCH, WINDOW = 8, 64, 5
SFT = {"steps": 800, "corruption_rate": 0.5}  # set from --sft-steps / --corruption
LATENCY = {"kind": "none"}  # set from --latency: the verifier's (environment step's) simulated delay
PARETO = {"seconds": 0.05, "alpha": 1.5, "max_seconds": 5.0}  # the demo's heavy-tailed tool latency


def overrides(steps: int, seed: int, lr: float) -> list[str]:
    return [
        "name=trl-compare",
        f"seed={seed}",
        "env.kind=plugin",
        "env.path=first_step_task:FirstStepEnv",
        "env.max_turns=1",
        "env.heldout_size=64",
        f"rollout.group_size={GROUP}",
        "rollout.sampling.max_new_tokens=24",
        "rollout.sampling.temperature=1.0",
        f"trainer.batch_size={BATCH}",
        f"trainer.total_steps={steps}",
        f"trainer.lr={lr}",
        f"trainer.sft.steps={SFT['steps']}",
        f"trainer.sft.corruption_rate={SFT['corruption_rate']}",
        "algo.kl_coef=0.0",
        "algo.policy_loss.eps_low=0.2",
        "algo.policy_loss.eps_high=0.28",
        "algo.policy_loss.agg=token_mean",
        "credit.baseline=grpo",
        "cost.enabled=false",
        "telemetry.eval_every=0",
        *(
            ["env.latency.kind=pareto", *(f"env.latency.{k}={v}" for k, v in PARETO.items())]
            if LATENCY["kind"] == "pareto"
            else []
        ),
    ]


def summarise(curve: list[tuple[float, float]], target: float, total: float) -> dict[str, Any]:
    tail = [r for _, r in curve[-WINDOW:]]
    return {
        "steps": len(curve),
        "initial_reward": round(sum(r for _, r in curve[:WINDOW]) / max(1, len(curve[:WINDOW])), 3),
        "final_reward": round(sum(tail) / max(1, len(tail)), 3),
        "seconds_to_target": None if (t := time_to_target(curve, target, WINDOW)) is None else round(t, 1),
        "train_seconds": round(total, 1),
        "curve": [(round(t, 2), round(r, 4)) for t, r in curve],
    }


# ---------------------------------------------------------------------------------------------- asyncrl
def run_asyncrl(steps: int, seed: int, lr: float, target: float) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    cfg = load_config(None, overrides(steps, seed, lr))
    run_dir, summary = train(cfg, display=False, eval_limit=64)
    curve = trainer_curve(run_dir)
    out = summarise(curve, target, summary["rl_seconds"])
    out["heldout_success"] = [summary["initial_success"], summary["final_success"]]
    out["run_dir"] = str(run_dir)
    return out


# ---------------------------------------------------------------------------------------------- TRL
def run_trl(policy_dir: str, steps: int, seed: int, lr: float, target: float) -> dict[str, Any]:
    import random

    import torch
    from datasets import Dataset
    from first_step_task import first_step_reward, first_value
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from asyncrl.config import load_config
    from asyncrl.envs.registry import make_task_source

    torch.set_num_threads(2)
    cfg = load_config(None, overrides(steps, seed, lr))
    source = make_task_source(cfg.env)
    rng = random.Random(seed)
    tasks = [source.sample(rng) for _ in range(steps * BATCH // GROUP)]
    data = Dataset.from_dict(
        {
            "prompt": ["<bos>" + str(t.payload["prompt"]) for t in tasks],
            "target": [first_value(t) for t in tasks],
        }
    )
    tok = PreTrainedTokenizerFast.from_pretrained(policy_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True, dtype=torch.float32)
    stops = [tok.convert_tokens_to_ids(t) for t in ("</tool>", "</answer>", "<eos>")]
    model.generation_config.eos_token_id = stops
    model.generation_config.pad_token_id = tok.pad_token_id
    tok.eos_token = "<eos>"

    def reward(
        prompts: list[str],
        completions: list[str],
        completion_ids: list[list[int]],
        target: list[int],
        **_: Any,
    ) -> list[float]:
        # decode ourselves: TRL's completion text drops special tokens such as <tool>
        texts = [tok.decode(ids, skip_special_tokens=False).replace("<pad>", "") for ids in completion_ids]
        if LATENCY["kind"] == "pareto":  # one verifier call per completion, all of them in parallel:
            delays = [
                min(PARETO["seconds"] * rng.paretovariate(PARETO["alpha"]), PARETO["max_seconds"])
                for _ in texts
            ]
            time.sleep(
                max(delays)
            )  # the batch waits for its slowest call (the best a synchronous loop can do)
        return [first_step_reward(text, int(t)) for text, t in zip(texts, target, strict=True)]

    curve: list[tuple[float, float]] = []
    start = [0.0]

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            start[0] = time.time()

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **k: Any
        ) -> None:
            if logs and "reward" in logs:
                curve.append((time.time() - start[0], float(logs["reward"])))

    args = GRPOConfig(
        output_dir=os.environ.get("TMPDIR", "/tmp") + f"/trl-compare-{seed}",
        per_device_train_batch_size=BATCH,
        generation_batch_size=BATCH,
        num_generations=GROUP,
        max_completion_length=24,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        temperature=1.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=seed,
        shuffle_dataset=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        args=args,
        train_dataset=data,
        reward_funcs=reward,
        processing_class=tok,
        callbacks=[Clock()],
    )
    t0 = time.time()
    trainer.train()
    return summarise(curve, target, time.time() - t0)


# ---------------------------------------------------------------------------------------------- driver
def main() -> int:
    if "--task" in sys.argv:  # the real-model comparison on the demo-real task: bench/trl_demo_real.py
        import trl_demo_real

        return trl_demo_real.main(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl-python", default=".venv-bench/bin/python", help="interpreter with trl installed")
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--target", type=float, default=0.8, help="training-reward moving average to reach")
    ap.add_argument("--sft-steps", type=int, default=800, help="warm-start SFT steps (shared by both sides)")
    ap.add_argument("--corruption", type=float, default=0.5, help="share of corrupted SFT demonstrations")
    ap.add_argument(
        "--latency",
        choices=["none", "pareto"],
        default="none",
        help="simulated verifier latency per completion",
    )
    ap.add_argument("--side", choices=["both", "asyncrl", "trl"], default="both")
    ap.add_argument("--policy-dir", help=argparse.SUPPRESS)  # internal: the TRL subprocess
    args = ap.parse_args()
    SFT.update(steps=args.sft_steps, corruption_rate=args.corruption)
    LATENCY.update(kind=args.latency)
    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])

    if args.side == "trl":  # the TRL subprocess: one seed, JSON on stdout
        json.dump(run_trl(args.policy_dir, args.steps, args.seeds[0], args.lr, args.target), sys.stdout)
        return 0

    from asyncrl.config import load_config
    from asyncrl.jobs.warm_start import warm_start

    ws = warm_start(load_config(None, overrides(args.steps, args.seeds[0], args.lr)))
    results: dict[str, list[dict[str, Any]]] = {"asyncrl": [], "trl": []}
    for seed in args.seeds:
        if args.side in ("both", "asyncrl"):
            results["asyncrl"].append(run_asyncrl(args.steps, seed, args.lr, args.target))
        if args.side in ("both", "trl"):
            cmd = [
                args.trl_python,
                __file__,
                "--side",
                "trl",
                "--policy-dir",
                str(ws.path),
                "--seeds",
                str(seed),
            ]
            cmd += ["--steps", str(args.steps), "--lr", str(args.lr), "--target", str(args.target)]
            cmd += [
                "--sft-steps",
                str(args.sft_steps),
                "--corruption",
                str(args.corruption),
                "--latency",
                args.latency,
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True)
            results["trl"].append(json.loads(out.stdout.strip().splitlines()[-1]))

    def mean(side: str, key: str) -> float | None:
        vals = [r[key] for r in results[side] if r.get(key) is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    headline = {
        side: {
            "seconds_to_target_mean": mean(side, "seconds_to_target"),
            "reached_target": sum(r["seconds_to_target"] is not None for r in results[side]),
            "final_reward_mean": mean(side, "final_reward"),
            "train_seconds_mean": mean(side, "train_seconds"),
        }
        for side in results
        if results[side]
    }
    a, t = (headline.get(s, {}).get("seconds_to_target_mean") for s in ("asyncrl", "trl"))
    if a and t:
        headline["speedup_to_target"] = round(t / a, 2)
    json.dump(
        {"target": args.target, "steps": args.steps, "headline": headline, "runs": results},
        sys.stdout,
        indent=2,
    )
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
