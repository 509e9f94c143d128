"""Trainer tokens/s of one ``Learner.step`` on the real-model batch: all passes vs only the passes the loss needs.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python bench/trainer_passes.py [--completions 16] [--threads 1]
        [--variants before,no_prox,loss_positions,after] [--out bench/results/trainer-passes.json]

Prints one JSON object. The batch is the ``make demo-real`` trainer's (``configs/smollm2_calculator.yaml``:
SmolLM2-135M-Instruct, float32, LoRA rank 16 on every projection, the memory-lean settings —
gradient checkpointing, 2,048-token micro-batches, 256-token logit chunks — and ppo_clip):
``completions / 4`` calculator tasks rendered with the model's chat template and tools (~213 tokens
each), each followed by 4 completions of 48 tokens (random ids from the prompts' tokens, behaviour
log-probs −1, rewards 1, 0, 1, 0 in each group so every token has an advantage). The variants, each a
fresh ``Learner`` on the same adapter weights (restored between variants), all in this process:

* ``before``: what the learner did before issue #26 — a proximal pass every step, the LM head and
  log-softmax at every position, the padded ``[B, T]`` layout (``AllPasses`` below);
* ``no_prox``: ``before`` without the proximal pass (ppo_clip does not read it);
* ``loss_positions``: also the LM head at the loss positions only;
* ``after``: ``Learner`` as it is (also the prefix-shared forward, ``trainer.share_prefixes``).

Per variant: wall and CPU seconds of the step (on a shared machine the CPU seconds of the one
thread are the steadier figure; both ratios are reported), real tokens/s (prompt + completion tokens of the batch / step
seconds, the figure the issue quotes) and that work as a share of the machine's measured matmul
ceiling: ``tokens/s × 4·P / ceiling`` with ``P`` the policy's parameters (a LoRA step's useful work
per token: a forward, ``2P``, and a backward through the activations, ``2P``; no weight gradients
for the frozen base) and the ceiling the GFLOP/s of a 2048² float32 ``torch.mm`` on the same threads
(measured before and after every variant; the best single call). ``ceiling_share_cpu`` is the same
with the step's CPU seconds and the matmul's CPU-time ceiling (the figures to read on a shared
machine, where wall time counts the other jobs too). ``after`` can pass 100%: it computes less
than the padded batch's work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import RunConfig, load_config
from asyncrl.policy import Policy
from asyncrl.policy.chat import make_renderer
from asyncrl.records import SamplingParams, Task, Trajectory, Turn, groups_of
from asyncrl.trainer.learner import Batch, Learner, _Part

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "smollm2_calculator.yaml"
GROUP, NEW_TOKENS = 4, 48


class AllPasses(Learner):
    """The learner before issue #26: every pass, every position, padded rows (``share_prefixes`` off)."""

    def _proximal(self, b: Batch, first: torch.Tensor) -> torch.Tensor | None:
        return self._logprobs(self.parallel.scorer, b)

    def _positions(self, b: Batch, part: _Part) -> torch.Tensor | None:
        return None


class NoProx(AllPasses):
    def _proximal(self, b: Batch, first: torch.Tensor) -> torch.Tensor | None:
        return Learner._proximal(self, b, first)


class LossPositions(NoProx):
    def _positions(self, b: Batch, part: _Part) -> torch.Tensor | None:
        return Learner._positions(self, b, part)


VARIANTS: dict[str, tuple[type[Learner], list[str]]] = {
    "before": (AllPasses, ["trainer.share_prefixes=false"]),
    "no_prox": (NoProx, ["trainer.share_prefixes=false"]),
    "loss_positions": (LossPositions, ["trainer.share_prefixes=false"]),
    "after": (Learner, []),
}


def matmul_gflops(seconds: float = 3.0, n: int = 2048) -> tuple[float, float]:
    """GFLOP/s of repeated ``n × n`` float32 ``torch.mm`` on this process's threads: the best call by
    wall time and by CPU time (on a shared machine a call is often descheduled mid-way, so the CPU
    figure is the core's own ceiling)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    wall = cpu = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        wall = max(wall, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
        cpu = max(cpu, 2 * n**3 / max(time.process_time() - c0, 1e-6) / 1e9)
    return wall, cpu


def batch(cfg: RunConfig, policy: Policy, completions: int) -> list[Trajectory]:
    """``completions / 4`` calculator prompts × 4 completions of 48 tokens (see the module docstring)."""
    from asyncrl.envs.registry import make_raw_env, make_task_source

    renderer = make_renderer(cfg.model, policy)
    env, source = make_raw_env(cfg.env), make_task_source(cfg.env)
    rng, out = random.Random(0), []
    for g in range(completions // GROUP):
        task: Task = source.sample(rng)
        prompt = renderer.start(asyncio.run(env.reset(task)), list(env.tools or [])).ids
        for k in range(GROUP):
            done = [rng.choice(prompt) for _ in range(NEW_TOKENS)]
            turns = [
                Turn(role="env", token_ids=list(prompt)),
                Turn(role="model", token_ids=done, logprobs=[-1.0] * NEW_TOKENS, version=0),
            ]
            out.append(
                Trajectory(
                    id=f"t{g}-{k}",
                    task=task,
                    turns=turns,
                    final_reward=float(k % 2 == 0),
                    outcome="success" if k % 2 == 0 else "failure",
                    group_id=f"g{g}",
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS),
                )
            )
    return out


def trie_figures(policy: Policy, trajs: list[Trajectory]) -> dict[str, float]:
    """Nodes of the batch's token trie and its estimated decoder FLOPs against the padded rows'."""
    from asyncrl.policy.model import decoder_layer_shape
    from asyncrl.policy.packing import trie_size
    from asyncrl.trainer.learner import collate

    b = collate(trajs, policy.tokenizer.pad_token_id)
    lengths = b.attn.sum(1)
    nodes = trie_size(b.ids, lengths)
    layer = decoder_layer_shape(policy.model)
    padded = sum(layer.cost(int(n), int(n) ** 2) for n in lengths)
    return {"trie_nodes": nodes, "trie_flops_share": round(layer.cost(nodes, nodes * nodes) / padded, 3)}


def run_variant(name: str, policy: Policy, trajs: list[Trajectory], completions: int) -> dict[str, Any]:
    """One ``Learner.step`` of variant ``name`` from the start adapter; its times and a few metrics."""
    cls, overrides = VARIANTS[name]
    cfg = load_config(CONFIG, [f"trainer.batch_size={completions}", *overrides])
    learner = cls(cfg, policy)
    torch.manual_seed(0)
    t0, c0 = time.perf_counter(), time.process_time()
    m = learner.step(groups_of(trajs), version=0)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(t.token_ids()) for t in trajs)
    return {
        "seconds": round(secs, 2),
        "cpu_seconds": round(cpu, 2),
        "tokens_per_s": round(tokens / secs, 2),
        "tokens_per_cpu_s": round(tokens / cpu, 2),
        "loss_policy": m["loss/policy"],
        "grad_norm": m["train/grad_norm"],
        "microbatches": m["train/microbatches"],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--completions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", default="before,after")
    ap.add_argument("--repeats", type=int, default=1, help="rounds, the order reversed every other one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(CONFIG, [f"trainer.batch_size={args.completions}"])
    policy = Policy.from_config(cfg.model)
    trajs = batch(cfg, policy, args.completions)
    start = {k: v.detach().clone() for k, v in policy.model.state_dict().items() if "lora_" in k}
    n_params = policy.num_parameters()
    tokens = sum(len(t.token_ids()) for t in trajs)
    ceiling = [matmul_gflops()]
    runs: dict[str, list[dict[str, Any]]] = {}
    names = args.variants.split(",")
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            policy.model.load_state_dict(start, strict=False)
            runs.setdefault(name, []).append(run_variant(name, policy, trajs, args.completions))
            print(json.dumps({name: runs[name][-1]}), flush=True)
            ceiling.append(matmul_gflops())
    # per variant: the run with the median CPU seconds (the figure least moved by other jobs)
    results = {k: dict(sorted(v, key=lambda x: x["cpu_seconds"])[(len(v) - 1) // 2]) for k, v in runs.items()}
    peak, peak_cpu = max(c[0] for c in ceiling), max(c[1] for c in ceiling)
    for r in results.values():
        r["ceiling_share"] = round(r["tokens_per_s"] * 4 * n_params / (peak * 1e9), 4)
        r["ceiling_share_cpu"] = round(r["tokens_per_cpu_s"] * 4 * n_params / (peak_cpu * 1e9), 4)
    base = results.get("before")
    for r in results.values():
        if base:
            r["speedup_vs_before"] = round(base["seconds"] / r["seconds"], 2)
            r["cpu_speedup_vs_before"] = round(base["cpu_seconds"] / r["cpu_seconds"], 2)
    report = {
        "bench": "trainer_passes",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "threads": args.threads,
        "completions": args.completions,
        "batch_tokens": tokens,
        "prompt_tokens_per_row": len(trajs[0].turns[0].token_ids),
        "loss_tokens": sum(len(t.turns[1].token_ids) for t in trajs),
        **trie_figures(policy, trajs),
        "params": n_params,
        "repeats": args.repeats,
        "matmul_gflops_wall": [round(c[0], 1) for c in ceiling],
        "matmul_gflops_cpu": [round(c[1], 1) for c in ceiling],
        "variants": results,
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
