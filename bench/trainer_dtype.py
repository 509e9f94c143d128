"""Trainer step time and the train–inference log-prob gap, float32 against bfloat16, on the demo-real batch.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/trainer_dtype.py [--repeats 3] [--threads 1]
        [--modes lora,full] [--out bench/results/trainer-dtype.json]

The batch: ``configs/smollm2_arithmetic.yaml``'s own (``make demo-real``: 16 real rollouts of its warm
start, multi-turn, saved by ``bench/trainer_passes.py --config`` in
``bench/results/trainer-passes-batch-smollm2_arithmetic.msgpack``). Per repeat, each (mode, dtype) in
turn — the order reversed every other repeat: SmolLM2 loaded at that ``model.dtype`` (``lora``: the
config's adapter, fresh, float32 over the base at that dtype; ``full``: no adapter, every weight
trained, through float32 masters at bfloat16, :mod:`asyncrl.trainer.master`; ``lora16``: as ``lora``, but at
bfloat16 the adapter too is bfloat16, stepped through float32 masters) — the base model, not the
warm start: a step's cost does not depend on the weights' values — a fresh ``Learner``, one
untimed warm-up step, then one timed ``Learner.step`` on the batch: wall and CPU seconds of the one
thread. Ratios are taken within a repeat (the machine is shared; ``load_1m`` is recorded per step).

The gap (once per mode and dtype): the config's engine (``rollout.engine``, as a rollout worker builds
it) at that dtype samples 48 tokens for each of the batch's 16 first prompts (seed 0), then one
``Learner.step`` on those samples (the sampler's log-probs on the wire record, version 0) reports the
trainer's gap as a run does (``Learner.gap``: :mod:`asyncrl.trainer.gap`). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.policy import Policy
from asyncrl.records import Group, SamplingParams, Task, Trajectory, Turn, groups_of, members
from asyncrl.trainer.learner import Learner

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2_arithmetic.yaml"
BATCH = REPO / "bench" / "results" / "trainer-passes-batch-smollm2_arithmetic.msgpack"


def config(dtype: str, mode: str) -> RunConfig:
    sets = [f"model.dtype={dtype}", "model.device=cpu"] + (["model.lora=null"] if mode == "full" else [])
    return load_config(CONFIG, sets)


def policy_at(cfg: RunConfig, mode: str) -> Policy:
    """SmolLM2 as a run's trainer loads it at ``cfg.model`` (LoRA: a fresh adapter, ``B = 0``); mode
    ``lora16`` at bfloat16: the adapter cast to bfloat16 too (the learner then steps it through float32
    masters), the alternative to peft's float32 adapter."""
    assert cfg.model.path is not None
    policy = Policy.load(REPO / cfg.model.path, cfg=cfg.model)
    if mode == "lora16" and cfg.model.dtype == "bfloat16":
        for p in policy.model.parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
    return policy


def timed_step(groups: list[Group], dtype: str, mode: str) -> dict[str, Any]:
    cfg = config(dtype, mode)
    learner = Learner(cfg, policy_at(cfg, mode))
    learner.step(groups, version=0)  # warm-up: first-call costs
    t0, c0 = time.perf_counter(), time.process_time()
    m = learner.step(groups, version=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(t.token_ids()) for t in members(groups))
    masters = sum(p.numel() for p in learner.master.masters)
    return {
        "mode": mode,
        "dtype": dtype,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "tokens_per_s_wall": round(tokens / wall, 1),
        "skipped": m["train/skipped"],
        "master_params": masters,
        "load_1m": os.getloadavg()[0],
    }


def gap(groups: list[Group], dtype: str, mode: str) -> dict[str, Any]:
    """The engine at ``dtype`` samples the batch's first prompts; the learner's gap on those samples."""
    from asyncrl.engine import make_engine
    from asyncrl.policy.chat import make_renderer

    cfg = config(dtype, mode)
    policy = policy_at(cfg, mode)
    renderer = make_renderer(cfg.model, policy)
    trajs = members(groups)
    prompts = [list(t.turns[0].token_ids) for t in trajs]
    engine = make_engine(cfg.rollout.engine, policy, renderer.stop_token_ids, seed=0)
    samples = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=48))
    rows = [
        Trajectory(
            id=f"s{i}",
            task=Task(id=t.task.id, task_type=t.task.task_type),
            turns=[
                Turn(role="env", token_ids=p),
                Turn(role="model", token_ids=list(s.token_ids), logprobs=list(s.logprobs), version=0),
            ],
            final_reward=float(i % 2),
            group_id=t.group_id,
        )
        for i, (t, p, s) in enumerate(zip(trajs, prompts, samples, strict=True))
    ]
    learner = Learner(cfg, policy)
    learner.step(groups_of(rows), version=0)
    f = learner.gap.figures()
    out = {k: v for k, v in msgspec.structs.asdict(f).items() if not k.startswith("step_")}
    out["sequences_over_share"] = f.sequences_over / f.sequences if f.sequences else None
    return {"mode": mode, "dtype": dtype, **out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--modes", default="lora")
    ap.add_argument("--no-gap", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from trainer_passes import load_saved

    groups = load_saved(BATCH).groups
    cases = [(m, d) for m in args.modes.split(",") for d in ("float32", "bfloat16")]
    steps = []
    for r in range(args.repeats):
        for mode, dtype in cases if r % 2 == 0 else cases[::-1]:
            steps.append({"repeat": r, **timed_step(groups, dtype, mode)})
            print(json.dumps(steps[-1]), flush=True)
    gaps = [] if args.no_gap else [gap(groups, d, m) for m, d in cases]
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": args.threads,
        "batch": str(BATCH.relative_to(REPO)),
        "tokens": sum(len(t.token_ids()) for t in members(groups)),
        "steps": steps,
        "ratios_bf16_over_f32": ratios(steps),
        "gap": gaps,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def ratios(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: bfloat16's step time over float32's within each repeat (wall and CPU), and the median."""
    out: dict[str, Any] = {}
    for mode in sorted({s["mode"] for s in steps}):
        per: dict[str, list[float]] = {"wall": [], "cpu": []}
        for r in sorted({s["repeat"] for s in steps}):
            pair = {s["dtype"]: s for s in steps if s["mode"] == mode and s["repeat"] == r}
            for k in per:
                per[k].append(round(pair["bfloat16"][f"{k}_s"] / pair["float32"][f"{k}_s"], 3))
        out[mode] = {**per, **{f"{k}_median": statistics.median(v) for k, v in per.items()}}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
