"""The built-in engine's decode step with a LoRA policy: through the adapter layers vs a merged copy.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_merged.py          # 3-6 min loaded

SmolLM2-135M-Instruct (float32, CPU, one torch thread) with the LoRA layout of
``configs/smollm2_calculator.yaml`` (rank 16, alpha 32, every linear layer) and a random non-zero
adapter (peft's ``A``, ``B ~ N(0, --b-std²)``). One ``Policy``, two engines: ``unmerged``
(``rollout.engine.merge_lora: false``, PEFT's adapter matmuls at every step) and ``merged`` (the
default: a :class:`~asyncrl.policy.lora.MergedCopy`). Each call generates ``--new-tokens`` tokens for
``--batch`` rows (``--groups`` distinct prompts of ``--prompt-tokens`` tokens, prefix sharing on, prefix
cache off, no stop tokens); the figure is the engine's decode time / decode steps of that call. The
engines alternate call by call (the order flips every repeat), after one warm-up call each. Also: the
time of one fold (``MergedCopy.refresh``) and of a whole ``load_weights`` of an adapter version on each
engine, interleaved; and the behaviour log-probs of both engines against the trainer's recomputation
(``token_logprobs`` on the PEFT model). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from asyncrl.config import ModelConfig
from asyncrl.engine import HFEngine, Sample
from asyncrl.policy import Policy, token_logprobs
from asyncrl.records import SamplingParams

MODEL = Path(".cache/models/smollm2-135m-instruct")


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 2), "median": round(statistics.median(xs), 2), "max": round(max(xs), 2)}


def matmul_gflops() -> float:
    """The machine's float32 matmul rate now (2048² ``torch.mm``), a gauge of the load."""
    a = torch.randn(2048, 2048)
    torch.mm(a, a)
    t0 = time.perf_counter()
    for _ in range(3):
        torch.mm(a, a)
    return round(3 * 2 * 2048**3 / (time.perf_counter() - t0) / 1e9, 1)


def adapter(policy: Policy, b_std: float, seed: int) -> dict[str, torch.Tensor]:
    """peft's ``A`` (as initialised), ``B ~ N(0, b_std²)``: a non-zero adapter version."""
    g = torch.Generator().manual_seed(seed)
    return {
        n: (torch.randn(t.shape, generator=g) * b_std if ".lora_B." in n else t)
        for n, t in policy.state_dict_tensors().items()
    }


def agreement(policy: Policy, prompts: list[list[int]], samples: list[Sample]) -> dict[str, float]:
    """``|engine − trainer|`` behaviour log-probs (temperature 1, top-p 1) over every sampled token."""
    deltas = []
    for p, s in zip(prompts, samples, strict=True):
        ids = torch.tensor([p + s.token_ids])
        with torch.no_grad():
            lp = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, len(p) :]
        deltas.append((lp - torch.tensor(s.logprobs)).abs())
    d = torch.cat(deltas)
    return {"tokens": d.numel(), "max_abs": float(d.max()), "mean_abs": float(d.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--groups", type=int, default=2, help="distinct prompts (rows share them)")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--loads", type=int, default=3)
    ap.add_argument("--b-std", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(path=str(MODEL), lora={"rank": 16, "alpha": 32})
    policy = Policy.load(MODEL, cfg=cfg)
    versions = [adapter(policy, args.b_std, seed) for seed in range(args.loads + 1)]
    policy.load_tensors(versions[0])
    t0 = time.perf_counter()
    engines = {
        "unmerged": HFEngine(policy, [], seed=0, max_batch=64, cuda_graphs=False, merge_lora=False),
        "merged": HFEngine(policy, [], seed=0, max_batch=64, cuda_graphs=False, merge_lora=True),
    }
    build_s = time.perf_counter() - t0
    for e in engines.values():
        e.prefix_sharing = True
    g = torch.Generator().manual_seed(1)
    groups = [
        torch.randint(100, 40000, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.groups)
    ]
    prompts = [groups[i % args.groups] for i in range(args.batch)]
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    gauge = [matmul_gflops()]

    def call(name: str) -> tuple[float, list[Sample]]:
        e = engines[name]
        s0, n0 = e.decode_seconds, e.decode_steps
        out = e.generate(prompts, sp)
        return 1000 * (e.decode_seconds - s0) / (e.decode_steps - n0), out

    for name in engines:  # warm-up
        call(name)
    ms: dict[str, list[float]] = {n: [] for n in engines}
    for r in range(args.repeats):
        for name in list(engines)[:: 1 if r % 2 == 0 else -1]:
            ms[name].append(call(name)[0])
    gauge.append(matmul_gflops())
    ratios = [u / m for u, m in zip(ms["unmerged"], ms["merged"], strict=True)]

    load_s: dict[str, list[float]] = {n: [] for n in engines}
    fold_s: list[float] = []
    merged = engines["merged"].merged
    assert merged is not None
    for i, v in enumerate(versions[1:], start=1):
        for name in list(engines)[:: 1 if i % 2 else -1]:
            t = time.perf_counter()
            engines[name].load_weights(i, v)
            load_s[name].append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        merged.refresh()
        fold_s.append(1000 * (time.perf_counter() - t))
    samples = {n: e.generate(prompts, sp) for n, e in engines.items()}
    final = {n: agreement(policy, prompts, s) for n, s in samples.items()}
    with policy.model.disable_adapter():  # how far the adapter moves the sampled tokens' log-probs
        shift = agreement(policy, prompts, samples["unmerged"])
    adapted = sum(w.numel() for _, w in merged._layers)
    print(
        json.dumps(
            {
                "model": str(MODEL),
                "threads": args.threads,
                "load_average": os.getloadavg(),
                "matmul_gflops_before_after": gauge,
                "batch": args.batch,
                "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "ms_per_decode_step": {n: spread(v) for n, v in ms.items()},
                "ms_per_decode_step_raw": {n: [round(x, 1) for x in v] for n, v in ms.items()},
                "unmerged_over_merged": spread(ratios),
                "ms_fold": spread(fold_s),
                "ms_load_weights": {n: spread(v) for n, v in load_s.items()},
                "seconds_build_both_engines": round(build_s, 2),
                "merged_copy_own_parameters": adapted,
                "model_parameters_with_adapter": policy.num_parameters(),
                "logprob_vs_trainer": final,
                "adapter_shift_vs_base_model": shift,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
