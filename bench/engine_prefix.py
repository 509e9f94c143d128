"""Shared-prefix prefill on the GRPO batch: prefill tokens computed and engine tokens/s, before and after.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/engine_prefix.py [--tasks 4] [--group 4]
        [--new-tokens 48] [--repeats 1] [--baseline-ref main]

The batch is what a GRPO step generates: ``--tasks`` calculator tasks x ``--group`` samples each,
rendered by SmolLM2-135M-Instruct's chat template with the calculator's tools (configs/
smollm2_calculator.yaml, LoRA adapter included), ``--new-tokens`` sampled tokens per row (no stop
tokens, so every row samples them all), temperature 1, one torch thread, one ``generate`` call.

Sides, all in this process, interleaved per repeat (a busy shared machine slows them alike):

* ``baseline``: the built-in engine of git ref ``--baseline-ref`` (default ``main``), exported to
  a temporary directory and imported as the package ``asyncrl_base`` (``--baseline-ref ''`` skips it);
* ``unshared``: this tree's engine with ``rollout.engine.prefix_sharing: false``;
* ``shared``: this tree's engine with ``prefix_sharing: true`` (the default).

Each engine gets one warm-up call on other prompts first. Reported per side: prefill tokens
computed, prefill / decode seconds, ms per decode step, tokens/s (sampled tokens / wall time of the
call), and two shares of the matmul ceiling (a 2048 x 2048 ``torch.mm`` on the same thread):
``tokens_per_s / compute_bound_tokens_per_s``, the bound being the ceiling divided by the FLOPs per
sampled token of the *unshared* work (every prompt token through the body, every sampled token
through body and LM head; it can pass 100 % once prefixes are shared), and ``achieved_flops_share``,
the FLOPs the side actually ran per second over the ceiling. Also the agreement of ``shared`` with
``unshared`` (same seed): identical samples and the largest log-prob gap. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(f: Any) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def baseline_engine_class(ref: str, tmp: Path) -> Any:
    """``HFEngine`` of git ref ``ref``: its ``src/asyncrl`` exported and imported as ``asyncrl_base``."""
    out = subprocess.run(["git", "archive", ref, "src/asyncrl"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=out, check=True)
    pkg = tmp / "asyncrl_base"
    (tmp / "src" / "asyncrl").rename(pkg)
    for f in pkg.rglob("*.py"):
        f.write_text(re.sub(r"\b(from|import) asyncrl\b", r"\1 asyncrl_base", f.read_text()))
    sys.path.insert(0, str(tmp))
    return importlib.import_module("asyncrl_base.engine.hf").HFEngine


def grpo_batch(args: argparse.Namespace) -> tuple[Any, Any, list[list[int]], list[list[int]]]:
    from asyncrl.config import load_config
    from asyncrl.envs.registry import make_raw_env, make_task_source
    from asyncrl.policy import Policy
    from asyncrl.policy.chat import make_renderer

    cfg = load_config(args.config, [f"model.path={Path(args.model).resolve()}"])
    policy = Policy.from_config(cfg.model)
    renderer = make_renderer(cfg.model, policy)
    source = make_task_source(cfg.env)
    rng = random.Random(args.seed)
    tasks = [source.sample(rng) for _ in range(args.tasks + 2)]
    tools = make_raw_env(cfg.env).tools
    rendered = [renderer.start(str(t.payload["prompt"]), tools).ids for t in tasks]
    prompts = [p for p in rendered[: args.tasks] for _ in range(args.group)]
    return cfg, policy, prompts, rendered[args.tasks :]


def flops_per_token(model: Any) -> tuple[float, float]:
    """(FLOPs of one token through the body, FLOPs of one LM-head row): 2 x parameters each."""
    head = model.get_output_embeddings().weight.numel()
    body = sum(
        p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n
    )
    return 2.0 * body, 2.0 * head


def run_side(engine: Any, prompts: list[list[int]], warm: list[list[int]], new_tokens: int) -> dict[str, Any]:
    from asyncrl.records import SamplingParams

    engine.generate(warm, SamplingParams(temperature=1.0, max_new_tokens=4))
    for name in ("prefill_seconds", "decode_seconds", "decode_steps", "prefill_tokens_computed"):
        setattr(engine, name, type(getattr(engine, name))(0))
    t0 = time.perf_counter()
    samples = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=new_tokens))
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "prefill_s": engine.prefill_seconds,
        "decode_s": engine.decode_seconds,
        "decode_steps": engine.decode_steps,
        "prefill_tokens_computed": engine.prefill_tokens_computed,
        "sampled_tokens": sum(len(s.token_ids) for s in samples),
        "samples": samples,
    }


def summary(
    runs: list[dict[str, Any]], bound: float, gflops: float, flops: tuple[float, float]
) -> dict[str, Any]:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "samples"}
    tps = med["sampled_tokens"] / med["wall_s"]
    ran = (
        flops[0] * (med["prefill_tokens_computed"] + med["sampled_tokens"]) + flops[1] * med["sampled_tokens"]
    )
    return {
        "prefill_tokens_computed": int(med["prefill_tokens_computed"]),
        "prefill_s": round(med["prefill_s"], 2),
        "decode_s": round(med["decode_s"], 2),
        "ms_per_decode_step": round(1000 * med["decode_s"] / max(med["decode_steps"], 1), 1),
        "wall_s": round(med["wall_s"], 2),
        "tokens_per_s": round(tps, 2),
        "share_of_compute_bound": round(tps / bound, 3),
        "achieved_flops_share": round(ran / med["wall_s"] / 1e9 / gflops, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/smollm2_calculator.yaml")
    ap.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-ref", default="main")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from asyncrl.config import HFEngineConfig
    from asyncrl.engine import HFEngine

    _, policy, prompts, warm = grpo_batch(args)
    off: dict[str, Any] = {"cuda_graphs": False, "prefix_cache": False}
    sides: dict[str, Any] = {
        "unshared": lambda: HFEngine(policy, HFEngineConfig(**off, prefix_sharing=False), [], seed=args.seed),
        "shared": lambda: HFEngine(policy, HFEngineConfig(**off, prefix_sharing=True), [], seed=args.seed),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_ref:
            # a ref whose HFEngine takes (policy, cfg, stop_token_ids, seed=...)
            base = baseline_engine_class(args.baseline_ref, Path(tmp))
            base_cfg = importlib.import_module("asyncrl_base.config").HFEngineConfig
            sides = {
                "baseline": lambda: base(policy, base_cfg(**off, prefix_sharing=False), [], seed=args.seed),
                **sides,
            }
        gflops = matmul_gflops()
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        for _ in range(args.repeats):
            for name, make in sides.items():
                runs[name].append(run_side(make(), prompts, warm, args.new_tokens))
    flops = flops_per_token(policy.model)
    n_prompt, n_new = sum(map(len, prompts)), len(prompts) * args.new_tokens
    bound = gflops * 1e9 * n_new / (flops[0] * (n_prompt + n_new) + flops[1] * n_new)
    distinct = len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})
    out = {k: summary(v, bound, gflops, flops) for k, v in runs.items()}
    a, b = runs["unshared"][0]["samples"], runs["shared"][0]["samples"]
    gaps = [
        abs(x - y) for s, t in zip(a, b, strict=True) for x, y in zip(s.logprobs, t.logprobs, strict=False)
    ]
    ratio = {
        f"shared_over_{k}": {
            "tokens_per_s": round(out["shared"]["tokens_per_s"] / out[k]["tokens_per_s"], 2),
            "prefill_tokens_computed": round(
                out[k]["prefill_tokens_computed"] / out["shared"]["prefill_tokens_computed"], 2
            ),
            "prefill_s": round(out[k]["prefill_s"] / out["shared"]["prefill_s"], 2),
            "ms_per_decode_step": round(
                out[k]["ms_per_decode_step"] / out["shared"]["ms_per_decode_step"], 2
            ),
        }
        for k in out
        if k != "shared"
    }

    def tps(r: dict[str, Any]) -> float:
        return float(r["sampled_tokens"] / r["wall_s"])

    def spread(xs: list[float]) -> dict[str, float]:
        return {"min": round(min(xs), 2), "median": round(statistics.median(xs), 2), "max": round(max(xs), 2)}

    # every repeat's own figure and its pair's ratio (the sides alternate within a repeat)
    per_repeat = {
        "tokens_per_s": {k: spread([tps(r) for r in v]) for k, v in runs.items()},
        **{
            f"shared_over_{k}_tokens_per_s": spread(
                [tps(s) / tps(r) for s, r in zip(runs["shared"], v, strict=True)]
            )
            for k, v in runs.items()
            if k != "shared"
        },
    }
    print(
        json.dumps(
            {
                "bench": "engine_prefix",
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                "torch_threads": 1,
                "batch": f"{args.tasks} tasks x {args.group} samples x {args.new_tokens} new tokens",
                "prompt_tokens": n_prompt,
                "distinct_prefix_tokens": distinct,
                "matmul_gflops_2048": round(gflops, 1),
                "compute_bound_tokens_per_s": round(bound, 1),
                "baseline_ref": args.baseline_ref or None,
                "repeats": args.repeats,
                "sides": out,
                "ratios": ratio,
                "per_repeat": per_repeat,
                "shared_vs_unshared_identical_samples": sum(
                    s.token_ids == t.token_ids for s, t in zip(a, b, strict=True)
                ),
                "shared_vs_unshared_max_logprob_gap": max(gaps, default=0.0),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
