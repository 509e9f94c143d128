"""The real model's figures, side by side in one run: engine tokens/s, trainer tokens/s, and the
agreement between the engine's behaviour log-probs and the trainer's log-probs, in float32 and
bfloat16, on SmolLM2-135M-Instruct with the LoRA adapter of ``configs/smollm2_calculator.yaml``.

For each dtype: the model is loaded as the run loads it (``Policy.from_config``), ``--prompts``
calculator prompts are rendered by the model's chat template with the calculator's tools, the
built-in HF engine samples ``--new-tokens`` tokens for each in one batch (engine tokens/s =
sampled tokens / wall time), then the trainer's scoring path (``token_logprobs`` with
``trainer.logits_chunk_tokens``, the padded batch the learner builds) re-scores every sampled
token: ``|logp_trainer − logp_engine|`` mean / max / 99th percentile, and the share of sequences
whose summed log-prob differs by more than 0.1 nats. Then one ``Learner.step`` (LoRA, the config's
micro-batching) on those samples gives trainer tokens/s (forward + backward + AdamW over all tokens
of the batch). Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/realmodel_figures.py
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

import torch


def figures(dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl.config import HFEngineConfig, load_config
    from asyncrl.engine import HFEngine
    from asyncrl.envs.registry import make_raw_env, make_task_source
    from asyncrl.policy import Policy, token_logprobs
    from asyncrl.policy.chat import make_renderer
    from asyncrl.records import SamplingParams, Task, Trajectory, Turn, groups_of
    from asyncrl.trainer.learner import Learner

    cfg = load_config(args.config, [f"model.dtype={dtype}", f"trainer.batch_size={args.prompts}", *args.set])
    policy = Policy.from_config(cfg.model)
    renderer = make_renderer(cfg.model, policy)
    source = make_task_source(cfg.env)
    rng = random.Random(0)
    tasks = [source.sample(rng) for _ in range(args.prompts)]
    tools = make_raw_env(cfg.env).tools
    prompts = [renderer.start(str(t.payload["prompt"]), tools).ids for t in tasks]
    engine = HFEngine(
        policy,
        HFEngineConfig(cuda_graphs=False, prefix_cache=False, prefix_sharing=False),
        renderer.stop_token_ids,
        seed=0,
    )
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens)
    engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4))  # warm-up
    t0 = time.perf_counter()
    samples = engine.generate(prompts, sp)
    gen_s = time.perf_counter() - t0
    sampled = sum(len(s.token_ids) for s in samples)

    # the trainer's scoring path on the engine's samples
    pad = policy.tokenizer.pad_token_id
    width = max(len(p) + len(s.token_ids) for p, s in zip(prompts, samples, strict=True))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, s) in enumerate(zip(prompts, samples, strict=True)):
        row = p + s.token_ids
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with torch.no_grad():
        lp = token_logprobs(policy.model, ids, mask, chunk_tokens=cfg.trainer.logits_chunk_tokens)
    diffs: list[float] = []
    seq_diffs: list[float] = []
    for i, (p, s) in enumerate(zip(prompts, samples, strict=True)):
        mine = lp[i, len(p) : len(p) + len(s.token_ids)].float()
        d = (mine - torch.tensor(s.logprobs)).abs()
        diffs += d.tolist()
        seq_diffs.append(float((mine.sum() - sum(s.logprobs)).abs()))
    diffs.sort()

    # one learner step on the same samples (trainer tokens/s)
    trajs = [
        Trajectory(
            id=f"s{i}",
            task=Task(id=t.id, task_type=t.task_type),
            turns=[
                Turn(role="env", token_ids=list(p)),
                Turn(role="model", token_ids=list(s.token_ids), logprobs=list(s.logprobs), version=0),
            ],
            final_reward=float(i % 2),
            group_id=f"g{i // cfg.rollout.group_size}",
        )
        for i, (t, p, s) in enumerate(zip(tasks, prompts, samples, strict=True))
    ]
    learner = Learner(cfg, policy)
    t0 = time.perf_counter()
    metrics = learner.step(groups_of(trajs), version=0)
    step_s = time.perf_counter() - t0
    tokens = sum(len(p) + len(s.token_ids) for p, s in zip(prompts, samples, strict=True))
    return {
        "dtype": dtype,
        "lora": cfg.model.lora is not None,
        "prompts": len(prompts),
        "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
        "engine_sampled_tokens": sampled,
        "engine_seconds": round(gen_s, 2),
        "engine_tokens_per_s": round(sampled / gen_s, 1),
        "logprob_abs_diff_mean": round(sum(diffs) / len(diffs), 5),
        "logprob_abs_diff_p99": round(diffs[int(0.99 * (len(diffs) - 1))], 5),
        "logprob_abs_diff_max": round(diffs[-1], 5),
        "sequences_over_0.1_nats": round(sum(d > 0.1 for d in seq_diffs) / len(seq_diffs), 3),
        "trainer_step_seconds": round(step_s, 2),
        "trainer_tokens": tokens,
        "trainer_tokens_per_s": round(tokens / step_s, 1),
        "train_skipped": metrics.get("train/skipped"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2_calculator.yaml")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="config override (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps({"threads": args.threads, "runs": [figures(d, args) for d in args.dtypes]}))


if __name__ == "__main__":
    main()
