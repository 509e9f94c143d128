"""asyncrl vs TRL's GRPOTrainer on the demo-real task: steps to a held-out target, and time per step.

    PYTHONPATH=src .venv/bin/python bench/trl_compare.py --task demo-real \
        [--trl-python .venv-bench/bin/python] [--seeds 0 1 2] [--steps 12] [--eval-every 2] \
        [--targets 0.6 0.7 0.75 0.8]

The task is ``make demo-real``'s (``configs/smollm2_arithmetic.yaml``): SmolLM2-135M-Instruct + LoRA
r16, multi-turn calculator episodes (a ``calc`` tool call, its result, the answer), the same cached
12-step warm start (the same adapter) on both sides, groups of 4, 16 completions a step, lr 2e-4,
PPO clip 0.2 / 0.28 (TRL ``epsilon`` / ``epsilon_high``), token-mean loss (TRL ``loss_type="dapo"``),
no KL term, temperature 1, group-normalised advantages, gradient checkpointing, constant lr.

**TRL cannot play these episodes by itself**: its multi-turn tool path (``tools=`` /
``environment_factory=``) needs a chat template that renders assistant tool calls and a response
parser for it (``trl.chat_template_utils.add_response_schema`` knows Qwen, Llama 3, GLM, ...), and
SmolLM2's template drops ``tool_calls`` (``supports_tool_calling`` is False). The closest honest
variant is TRL's documented ``rollout_func`` hook: it returns each episode's prompt ids, its
completion ids (model turns and the tool result between them), the behaviour log-probs and an
``env_mask`` (0 on the tool result: TRL trains only the model's tokens). The rollout function plays
the episodes with asyncrl's episode runner and engine (:func:`asyncrl.rollout.heldout.run_episodes`,
a fresh engine each step on the weights TRL is training, so the prefix cache never outlives a
version): the same renderer, tool parser, environment and reward as asyncrl's. TRL's own
``model.generate`` would be slower, so this is a lower bound on TRL's step time. Everything else —
advantages, loss, backward, optimiser, the loop — is TRL's.

Held-out success is measured the same way on both sides, off the clock:
:func:`~asyncrl.rollout.heldout.evaluate_policy` on the first ``--eval-limit`` held-out tasks at step
0 and every ``--eval-every`` steps (asyncrl: its initial evaluation and its kept weight snapshots of
versions k, 2k, ..., evaluated after the run; TRL: its own evaluation of the policy before
``trainer.train()``'s first step and between steps, excluded from its clock). asyncrl runs its
default async mode (core lending off, the default); TRL runs in one process on every core
(``--trl-threads``, default 2).

Time to a target is given two ways, per seed, and the ratios (TRL's over asyncrl's) as min / median /
max over ``--seeds``:

* ``seconds``: steps to the target x the median gap between consecutive steps of that side's run
  (start-up excluded);
* ``wall``: the wall time from the start of that side's training until the end of the step that
  reached the target, start-up included, evaluations excluded (asyncrl: from the orchestrator's
  start, before any role process is launched, to the trainer's report row of that step; TRL: from
  the launch of its Python process, before it imports anything, to that step's
  ``on_step_end``, less the held-out evaluations it ran on the way).

The warm start is built (or read from the cache) before either clock starts; both sides load it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONFIG = "configs/smollm2_arithmetic.yaml"


def steps_to(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose held-out success reaches ``target``."""
    return next((s for s, succ in curve if succ >= target), None)


# ---------------------------------------------------------------------------------------------- asyncrl
def step_ends(run_dir: Path) -> dict[int, float]:
    """Each trainer step's first report row time (the step's end), from the run's merged metrics."""
    seen: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("role") == "trainer" and "event" not in r and r.get("trainer/step"):
            seen.setdefault(int(r["trainer/step"]), float(r["time"]))
    return seen


def run_asyncrl(args: argparse.Namespace) -> dict[str, Any]:
    from async_vs_sync_real import step_gaps

    from asyncrl.config import load_config
    from asyncrl.jobs.train import train
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import evaluate_policy
    from asyncrl.weights import make_weight_store

    sets = [f"seed={args.seed}", f"trainer.total_steps={args.steps}", "weights.keep=10000"]
    cfg = load_config(args.config, [*sets, "telemetry.eval_every=0", "name=trl-compare-asyncrl"])
    run_dir, s = train(cfg, display=False, eval_limit=args.eval_limit)
    store = make_weight_store(cfg.weights, run_dir)
    policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model)
    curve = [(0, round(float(s["initial_success"]), 4))]
    for v in range(args.eval_every, args.steps + 1, args.eval_every):
        policy.load_tensors(store.load(v).tensors)
        report = evaluate_policy(cfg, policy, limit=args.eval_limit, seed=cfg.seed)
        curve.append((v, round(float(report["success_rate"]), 4)))
    gaps = step_gaps(run_dir)
    ends = step_ends(run_dir)
    return {
        "seconds_per_step": round(statistics.median(gaps), 2) if gaps else None,
        "wall_at_step": {k: round(t - s["rl_started_at"], 1) for k, t in ends.items()},
        "rl_seconds": round(s["rl_seconds"], 1),
        "heldout_curve": curve,
        "lost_trajectories": s["lost_trajectories"],
        "threads_lent_seconds": s.get("threads_lent_seconds"),
        "run_dir": str(run_dir),
    }


# ---------------------------------------------------------------------------------------------- TRL
def _episodes_for_trl(trajs: list[Any]) -> dict[str, list[Any]]:
    """asyncrl trajectories as ``rollout_func`` output: the prompt up to the first sampled token, the
    rest as the completion, ``env_mask`` 0 on the tool results, the episode reward for the reward
    function."""
    out: dict[str, list[Any]] = {
        k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "episode_reward")
    }
    for t in trajs:
        ids, mask, lps = t.token_ids(), t.loss_mask(), t.behaviour_logprobs()
        p = mask.index(1) if 1 in mask else len(ids) - 1
        out["prompt_ids"].append(ids[:p])
        out["completion_ids"].append(ids[p:])
        out["logprobs"].append(lps[p:])
        out["env_mask"].append(mask[p:])
        out["episode_reward"].append(float(t.final_reward))
    return out


@contextlib.contextmanager
def inference(model: Any) -> Iterator[None]:
    """The model in eval mode while asyncrl's engine samples from it: in train mode with gradient
    checkpointing on (TRL turns it on), transformers drops the KV cache the engine decodes with."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    launched = float(os.environ["ASYNCRL_TRL_LAUNCHED"])  # the parent's clock just before it started us
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from asyncrl.config import load_config
    from asyncrl.envs import make_task_source
    from asyncrl.jobs.warm_start import warm_start
    from asyncrl.policy import Policy
    from asyncrl.rollout.heldout import evaluate_policy, run_episodes

    torch.set_num_threads(args.trl_threads)
    cfg = load_config(args.config, [f"seed={args.seed}"])
    policy = Policy.load(warm_start(cfg).path, cfg=cfg.model)  # the cached warm start: the same adapter
    source = make_task_source(cfg.env)
    rng = random.Random(args.seed)
    group, batch = cfg.rollout.group_size, cfg.trainer.batch_size
    tasks = [source.sample(rng) for _ in range(args.steps * batch // group)]
    calls = [0]

    def rollout(prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        calls[0] += 1  # one call per step: each group's prompt repeated group_size times (or once: then
        k = max(1, batch // len(prompts))  # play it group_size times), one episode each
        picked = [tasks[int(p)] for p in prompts for _ in range(k)]
        with inference(policy.model):
            trajs = asyncio.run(
                run_episodes(
                    cfg, policy, picked, seed=args.seed * 1000 + calls[0]
                )  # no latency or faults here
            )
        return _episodes_for_trl(trajs)

    def reward(
        prompts: list[str], completions: list[Any], episode_reward: list[float], **_: Any
    ) -> list[float]:
        return episode_reward

    marks: list[float] = []
    evals: list[tuple[int, float]] = []
    wall: dict[int, float] = {}
    off_clock = [0.0]  # seconds of held-out evaluation since launch, excluded from the wall time

    def evaluate(step: int) -> None:
        t = time.time()
        with inference(policy.model):
            r = evaluate_policy(cfg, policy, limit=args.eval_limit, seed=cfg.seed)
        evals.append((step, round(float(r["success_rate"]), 4)))
        off_clock[0] += time.time() - t
        print(f"trl held-out at {step}: {evals[-1][1]:.3f}", file=sys.stderr, flush=True)

    class Clock(TrainerCallback):  # type: ignore[misc]
        """Step boundaries; held-out evaluation off the clock."""

        def on_step_begin(self, a: Any, state: Any, control: Any, **k: Any) -> None:
            marks.append(time.time())

        def on_step_end(self, a: Any, state: Any, control: Any, **k: Any) -> None:
            marks.append(time.time())
            wall[state.global_step] = round(marks[-1] - launched - off_clock[0], 1)
            print(f"trl step {state.global_step}: {marks[-1] - marks[-2]:.1f} s", file=sys.stderr, flush=True)
            if state.global_step % args.eval_every == 0:
                evaluate(state.global_step)

    pl = cfg.algo.policy_loss
    conf = GRPOConfig(
        output_dir=os.environ.get("TMPDIR", "/tmp") + "/trl-demo-real",
        per_device_train_batch_size=batch,
        generation_batch_size=batch,
        num_generations=group,
        learning_rate=cfg.trainer.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.trainer.weight_decay,
        max_grad_norm=cfg.trainer.grad_clip,
        beta=0.0,
        epsilon=pl.eps_low,
        epsilon_high=pl.eps_high,
        loss_type="dapo",
        temperature=cfg.rollout.sampling.temperature,
        max_completion_length=cfg.env.max_turns * cfg.rollout.sampling.max_new_tokens,
        gradient_checkpointing=cfg.trainer.gradient_checkpointing,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        shuffle_dataset=False,
        disable_tqdm=True,
    )
    evaluate(0)  # TRL's own step-0 point, on the policy it is about to train (before GRPOTrainer wraps it)
    data = Dataset.from_dict({"prompt": [str(i) for i in range(len(tasks))]})
    trainer = GRPOTrainer(
        model=policy.model,
        args=conf,
        train_dataset=data,
        reward_funcs=reward,
        processing_class=policy.tokenizer,
        rollout_func=rollout,
        callbacks=[Clock()],
    )
    trainer.train()
    steps = [b - a for a, b in zip(marks[::2], marks[1::2], strict=False)]
    return {
        "seconds_per_step": round(statistics.median(steps), 2) if steps else None,
        "step_seconds": [round(x, 1) for x in steps],
        "wall_at_step": wall,
        "heldout_curve": evals,
        "threads": args.trl_threads,
    }


# ---------------------------------------------------------------------------------------------- driver
def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["demo-real"], default="demo-real")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--trl-python", default=".venv-bench/bin/python")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # internal: the TRL subprocess
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--eval-limit", type=int, default=64)
    ap.add_argument("--trl-threads", type=int, default=2)
    ap.add_argument("--targets", nargs="+", type=float, default=[0.6, 0.7, 0.75, 0.8])
    ap.add_argument("--side", choices=["both", "asyncrl", "trl"], default="both")
    ap.add_argument("--out", type=Path, help="also write the JSON here (rewritten after every seed)")
    args = ap.parse_args(argv)
    if args.side == "trl" and os.environ.get("ASYNCRL_TRL_CHILD"):  # the TRL subprocess: JSON on stdout
        print(json.dumps(run_trl(args)))
        return 0
    out: dict[str, Any] = {"config": args.config, "steps": args.steps, "eval_every": args.eval_every}
    out["runs"] = runs = []
    for seed in args.seeds:
        args.seed = seed
        res: dict[str, Any] = {"seed": seed}
        if args.side in ("both", "asyncrl"):
            res["asyncrl"] = run_asyncrl(args)
        if args.side in ("both", "trl"):
            res["trl"] = trl_child(args, argv, seed)
        res["to_target"] = to_target(res, args.targets)
        runs.append(res)
        out["ratios"] = ratios(runs, args.targets)
        if args.out:
            args.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    return 0


def trl_child(args: argparse.Namespace, argv: list[str], seed: int) -> dict[str, Any]:
    """One seed of TRL in its own interpreter (``--trl-python``); progress on stderr, JSON on stdout."""
    env = {**os.environ, "ASYNCRL_TRL_CHILD": "1", "ASYNCRL_TRL_LAUNCHED": repr(time.time())}
    cmd = [args.trl_python, __file__, *argv, "--side", "trl", "--seed", str(seed)]
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env)
    res: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    res["wall_at_step"] = {int(k): v for k, v in res["wall_at_step"].items()}
    return res


def to_target(res: dict[str, Any], targets: list[float]) -> dict[str, Any]:
    """Per target: each side's steps to it (``> N`` if its last evaluation, at N, had not), x its median
    step gap (``seconds``), its wall time to the end of that step from its start (``wall``), and TRL's
    over asyncrl's for both."""
    out: dict[str, Any] = {}
    for target in targets:
        row: dict[str, Any] = {}
        for side in ("asyncrl", "trl"):
            if side not in res:
                continue
            curve = [(int(s), float(v)) for s, v in res[side]["heldout_curve"] if v is not None]
            n, sps = steps_to(curve, target), res[side]["seconds_per_step"]
            row[side] = {
                "steps": n if n is not None else f"> {max((s for s, _ in curve), default=0)}",
                "seconds": round(n * sps, 1) if n is not None and sps else None,
                "wall": res[side]["wall_at_step"].get(n) if n else None,
            }
        for kind in ("seconds", "wall"):
            a, t = (row.get(s, {}).get(kind) for s in ("asyncrl", "trl"))
            if a and t:
                row[f"trl_over_asyncrl_{kind}"] = round(t / a, 2)
        out[str(target)] = row
    return out


def ratios(runs: list[dict[str, Any]], targets: list[float]) -> dict[str, Any]:
    """Over the seeds: per target and kind, TRL's time over asyncrl's as min / median / max (seeds where
    a side never reached the target are counted, not averaged in), and the per-step ratio."""
    spread = lambda xs: {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}  # noqa: E731
    out: dict[str, Any] = {}
    per_step = [
        r["trl"]["seconds_per_step"] / r["asyncrl"]["seconds_per_step"]
        for r in runs
        if r.get("trl", {}).get("seconds_per_step") and r.get("asyncrl", {}).get("seconds_per_step")
    ]
    if per_step:
        out["per_step"] = spread([round(x, 2) for x in per_step])
    for target in targets:
        row: dict[str, Any] = {}
        for kind in ("seconds", "wall"):
            xs = [r["to_target"][str(target)].get(f"trl_over_asyncrl_{kind}") for r in runs]
            got = [x for x in xs if x is not None]
            row[kind] = {**(spread(got) if got else {}), "seeds_without": len(xs) - len(got)}
        out[str(target)] = row
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main(sys.argv[1:]))
