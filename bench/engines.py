"""Generation backends side by side: tokens/s, behaviour log-prob agreement, weight-reload latency.

Run in the environment that has vLLM (``make test-vllm`` creates it)::

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv-vllm/bin/python bench/engines.py --models tiny,small

Prints one JSON object. For each model (``tiny``: the demo's size with head size 32, ``demo``:
the demo model, head size 16, served to vLLM with heads padded to 32, ``small``: about 23M
parameters) and engine (``hf``, ``vllm``): generation throughput on ``--batch``
prompts × ``--new-tokens`` tokens (no stop tokens, so every row generates them all; one warm-up
call, then ``--repeats`` timed calls: best and median reported), and the agreement of the engine's behaviour log-probs with the trainer's
recomputation under identical weights: mean and max ``|Δ log p|`` and the KL estimates
``k1 = E_μ[log μ − log π]`` and ``k3 = E_μ[ρ − 1 − log ρ]`` (``ρ = π/μ``) over sampled tokens.
For vLLM also the weight-reload latency (``collective_rpc("reload_weights")`` from a weight-store
snapshot, plus the prefix-cache reset) and the engine start-up time. Both engines get one CPU
core (HF: one torch thread; vLLM: its own CPU binding, which reserves one of two cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.config import HFEngineConfig, ModelConfig, VLLMEngineConfig
from asyncrl.engine import GenerationEngine, HFEngine, Sample, make_engine
from asyncrl.policy import Policy, token_logprobs
from asyncrl.records import SamplingParams

MODELS: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 192},
    # the demo model itself: head size 16, which vLLM serves padded to 32 (docs/engines.md)
    "demo": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192},
    "small": {
        "hidden_size": 512,
        "num_layers": 8,
        "num_heads": 8,
        "num_kv_heads": 2,
        "intermediate_size": 1408,
    },
}


def prompts_for(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 33, (n,), generator=g).tolist()
    return [torch.randint(4, vocab, (k,), generator=g).tolist() for k in lengths]


def agreement(
    policy: Policy, prompts: list[list[int]], samples: list[Sample], temp: float
) -> dict[str, float]:
    """Engine log-probs vs the trainer's recomputation (right-padded, as the trainer does)."""
    seqs = [p + s.token_ids for p, s in zip(prompts, samples, strict=True)]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        lp = token_logprobs(policy.model, ids, mask, temp)
    trainer, engine = [], []
    for i, (p, s) in enumerate(zip(prompts, samples, strict=True)):
        trainer.append(lp[i, len(p) : len(p) + len(s.token_ids)])
        engine.append(torch.tensor(s.logprobs))
    pi, mu = torch.cat(trainer).double(), torch.cat(engine).double()
    d = pi - mu
    return {
        "tokens": float(d.numel()),
        "mean_abs_dlogp": float(d.abs().mean()),
        "max_abs_dlogp": float(d.abs().max()),
        "kl_k1": float((-d).mean()),
        "kl_k3": float((d.exp() - 1 - d).mean()),
    }


def timed_generate(
    engine: GenerationEngine, prompts: list[list[int]], sp: SamplingParams, repeats: int
) -> tuple[list[float], list[Sample]]:
    """Wall time of ``repeats`` identical calls (after one warm-up call) and the last call's samples."""
    engine.generate(prompts[:4], sp)  # warm-up (first-call allocations, kernel selection)
    times = []
    samples: list[Sample] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        samples = engine.generate(prompts, sp)
        times.append(time.perf_counter() - t0)
    return times, samples


def bench_model(
    name: str,
    engines: list[str],
    batch: int,
    new_tokens: int,
    reloads: int,
    repeats: int,
    vllm_dtype: str = "float32",
) -> dict[str, Any]:
    from asyncrl.weights import LocalWeightStore

    mcfg = ModelConfig(seed=1, max_context=320, **MODELS[name])  # type: ignore[arg-type]
    policy = Policy.build(mcfg)
    vocab = len(policy.tokenizer)
    prompts = prompts_for(batch, vocab, seed=2)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens)
    out: dict[str, Any] = {"params": policy.num_parameters(), "config": MODELS[name]}
    for kind in engines:
        t0 = time.perf_counter()
        if kind == "hf":
            engine: GenerationEngine = HFEngine(
                policy,
                HFEngineConfig(max_batch=batch, cuda_graphs=False, prefix_cache=False, prefix_sharing=False),
                [],
                seed=0,
            )
        else:
            engine = make_engine(VLLMEngineConfig(max_batch=batch, vllm_dtype=vllm_dtype), policy, [], seed=0)  # type: ignore[arg-type]
        startup = time.perf_counter() - t0
        try:
            times, samples = timed_generate(engine, prompts, sp, repeats)
            tokens = sum(len(s.token_ids) for s in samples)
            row: dict[str, Any] = {
                "startup_s": round(startup, 2),
                "generate_s": [round(t, 3) for t in times],
                "tokens": tokens,
                "tokens_per_s": round(tokens / min(times), 1),  # best of the repeats: least disturbed
                "tokens_per_s_median": round(tokens / statistics.median(times), 1),
                "agreement": agreement(policy, prompts, samples, sp.temperature),
            }
            if kind == "vllm":
                row["served_head_dim"] = getattr(engine, "head_padding", None)  # None: not padded
                with tempfile.TemporaryDirectory() as tmp:
                    store = LocalWeightStore(Path(tmp), keep=2)
                    times = []
                    for v in range(1, reloads + 1):
                        path = store.publish(v, policy.state_dict_tensors(), step=v)
                        snap = store.load(v)
                        t1 = time.perf_counter()
                        engine.load_weights(v, snap.tensors, path=path)
                        times.append(time.perf_counter() - t1)
                    row["reload_s_median"] = round(statistics.median(times), 4)
                    row["reload_s_max"] = round(max(times), 4)
                    row["reload_bytes"] = sum(t.numel() * t.element_size() for t in snap.tensors.values())
            out[kind] = row
        finally:
            engine.close()
    if "hf" in out and "vllm" in out:
        out["vllm_over_hf_tokens_per_s"] = round(out["vllm"]["tokens_per_s"] / out["hf"]["tokens_per_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reloads", type=int, default=5)
    ap.add_argument("--vllm-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed generate calls per engine (best is reported)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "vllm_dtype": args.vllm_dtype,
        "models": {
            m: bench_model(
                m,
                args.engines.split(","),
                args.batch,
                args.new_tokens,
                args.reloads,
                args.repeats,
                args.vllm_dtype,
            )
            for m in args.models.split(",")
        },
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
