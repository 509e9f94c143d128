"""Peak memory and time of ONE learner step on the real SmolLM2-135M model, plain vs memory-lean.

    PYTHONPATH=src .venv/bin/python bench/train_memory.py                      # small: 8 × 256 tokens
    PYTHONPATH=src .venv/bin/python bench/train_memory.py --samples 64 --tokens 256   # the issue's size

Each configuration runs in a child process of its own (the model loaded, a learner built, one
``Learner.step`` on synthetic trajectories of exactly ``--tokens`` tokens: a 64-token prompt and a
model turn with behaviour log-probs), so every peak is that configuration's alone. Reported per
configuration: peak RSS of the child (``ru_maxrss``), RSS after loading (the model and tokenizer;
the step's own cost is the difference) and the step's wall time. A child whose RSS passes
``--cap-gb`` is killed (the machine is shared) and reported as such.

Configurations (``--configs``): ``plain`` (full-vocabulary logits for the whole batch, one pass:
the path before this change), ``chunked`` (logits in chunks of ``trainer.logits_chunk_tokens``),
``lean`` (chunked + micro-batches of 1024 tokens), ``lean_gc`` (chunked + micro-batches of the
default ``trainer.max_tokens_per_microbatch`` + gradient checkpointing), ``lean_gc_mmap`` (that, with
``launcher.malloc_mmap_threshold_kb=1024``: large tensors in pages of their own, returned on free);
each also ``*_lora`` (``model.lora`` with its defaults). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

CONFIGS: dict[str, list[str]] = {
    "plain": ["trainer.logits_chunk_tokens=0", "trainer.max_tokens_per_microbatch=0"],
    "chunked": ["trainer.max_tokens_per_microbatch=0"],
    "lean": ["trainer.max_tokens_per_microbatch=1024"],
    "lean_gc": ["trainer.gradient_checkpointing=true"],
    "lean_gc_mmap": ["trainer.gradient_checkpointing=true", "launcher.malloc_mmap_threshold_kb=1024"],
}
CONFIGS.update({f"{k}_lora": [*v, "model.lora={}"] for k, v in list(CONFIGS.items())})
PROMPT_TOKENS = 64


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration: load, build the learner, one step; figures as a dict."""
    import torch

    torch.set_num_threads(args.threads)
    from asyncrl.config import load_config
    from asyncrl.policy import Policy
    from asyncrl.records import SamplingParams, Task, Trajectory, Turn, groups_of
    from asyncrl.trainer.learner import Learner

    overrides = [f"model.path={args.model}", "trainer.lr=1e-5", "rollout.group_size=4", *CONFIGS[args.child]]
    overrides += [f"trainer.batch_size={args.samples}", *args.set]
    cfg = load_config(None, overrides)
    from asyncrl.policy.memory import set_mmap_threshold

    set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)  # as the trainer role process does
    policy = Policy.from_config(cfg.model)
    rss_loaded = _rss_mb()
    g = torch.Generator().manual_seed(0)
    vocab = len(policy.tokenizer)
    trajs = []
    for i in range(args.samples):
        n_model = args.tokens - PROMPT_TOKENS
        ids = torch.randint(0, vocab, (args.tokens,), generator=g).tolist()
        turns = [
            Turn(role="env", token_ids=ids[:PROMPT_TOKENS]),
            Turn(role="model", token_ids=ids[PROMPT_TOKENS:], logprobs=[-10.0] * n_model, version=0),
        ]
        trajs.append(
            Trajectory(
                id=f"t{i}",
                task=Task(id=f"g{i // 4}", task_type="bench"),
                turns=turns,
                final_reward=float(i % 2),
                outcome="success" if i % 2 else "failure",
                group_id=f"g{i // 4}",
                sampling=SamplingParams(temperature=1.0),
            )
        )
    learner = Learner(cfg, policy)
    t0 = time.perf_counter()
    metrics = learner.step(groups_of(trajs), version=0)
    step_s = time.perf_counter() - t0
    tc = cfg.trainer
    return {
        "peak_rss_mb": round(_rss_mb()),
        "rss_after_load_mb": round(rss_loaded),
        "step_s": round(step_s, 1),
        "microbatches": int(metrics["train/microbatches"]),
        "skipped": bool(metrics["train/skipped"]),
        "trainable_params_m": round(
            sum(p.numel() for p in policy.model.parameters() if p.requires_grad) / 1e6, 2
        ),
        "logits_chunk_tokens": tc.logits_chunk_tokens,
        "max_tokens_per_microbatch": tc.max_tokens_per_microbatch,
        "gradient_checkpointing": tc.gradient_checkpointing,
    }


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run configuration ``name`` in a child process, polling its RSS against the cap."""
    import psutil

    cmd = [sys.executable, __file__, "--child", name, "--model", args.model, "--samples", str(args.samples)]
    cmd += ["--tokens", str(args.tokens), "--threads", str(args.threads)]
    for s in args.set:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps, peak, killed = psutil.Process(proc.pid), 0, False
    while proc.poll() is None:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        if peak > args.cap_gb * 2**30:
            proc.kill()
            killed = True
        time.sleep(0.05)
    out, err = proc.communicate()
    if killed:
        return {"killed_at_cap_gb": args.cap_gb}
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"}
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per sample (> 64)")
    ap.add_argument(
        "--configs", nargs="+", default=["plain", "lean", "lean_gc", "lean_gc_lora"], choices=list(CONFIGS)
    )
    ap.add_argument(
        "--model", default=None, help="model directory (default: the imported SmolLM2-135M-Instruct)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-gb", type=float, default=16.0, help="kill a configuration whose RSS passes this")
    ap.add_argument("--set", action="append", default=[], help="extra config override for every child")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tokens <= PROMPT_TOKENS:
        ap.error(f"--tokens must exceed the {PROMPT_TOKENS}-token prompt")
    if args.child is not None:
        print(json.dumps(child(args)))
        return 0
    if args.model is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from models_util import smollm2_dir

        args.model = str(smollm2_dir())
    results = {name: run_one(name, args) for name in args.configs}
    print(
        json.dumps(
            {
                "samples": args.samples,
                "tokens_per_sample": args.tokens,
                "threads": args.threads,
                "date": time.strftime("%Y-%m-%d"),
                "configs": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
