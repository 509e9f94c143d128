"""The built-in engine's decode step against its physical limit, and where each millisecond of it goes.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_profile.py            # ~3 min quiet
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_profile.py --repeats 5 \
        --variants packed_linear,fused_decode                                                   # ~4 min
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_profile.py --repeats 6 \
        --variants unmerged,default --loads 3                          # what bench/decode_merged.py measured
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_profile.py --repeats 5 \
        --variants fused_decode,fused_decode@bfloat16,unpacked@bfloat16           # bfloat16 vs float32
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/decode_profile.py --tiny     # seconds (tests)

SmolLM2-135M-Instruct (float32, or bfloat16 as ``model.dtype`` for a variant named ``...@bfloat16``;
CPU, ``--threads`` torch threads: 1, as ``launcher.torch_threads`` gives a rollout worker) with the LoRA layout of ``configs/smollm2_calculator.yaml`` (rank 16, alpha
32, every linear layer, a random non-zero adapter) sampled from the merged copy, as the default
engine does. Each call generates ``--new-tokens`` tokens for ``--batch`` rows (``--groups`` distinct
prompts of ``--prompt-tokens`` tokens, prefix sharing on, prefix cache off, no stop tokens); a step's
time is the engine's decode time / decode steps of that call (the loop's first sampling, from the
prefill's logits, included).

(a) ``step_ms``: per variant (``--variants``: engine switches, each alone so that each gain is
measured separately, or joined by ``+``), median / min / max over ``--repeats`` calls, the variants
interleaved (the order flips every repeat) after one warm-up call each (``warmup_call_s``);
``speedup_vs_first``: the first variant's step / each variant's, repeat
by repeat; ``prefill_ms``: the same calls' prefills (``packed_linear`` runs there too).
``load_weights_ms``: then ``--loads`` new adapter versions loaded into every engine, interleaved, each
``load_weights`` timed (the merged copy's fold, the packed and stacked copies' repacks). Variants:
:data:`VARIANTS` (``default``: the engine as configured by default, now ``fused_decode``;
``packed_linear``: packed weights through the model's own forward; ``unmerged``: through PEFT's
adapter layers).

(b) ``limit``: per dtype of the variants (``float32``, ``bfloat16``), the step's FLOPs (every linear
layer and the LM head at ``batch`` rows, plus attention
over the KV columns a step reads, averaged over the call's steps) and bytes (the weights a step reads
and that KV), against this machine's matmul rate (each of the step's matmul shapes and its
attention, timed alone, hot in cache; a weight over 8 MiB is timed on a slice of its output rows)
and its memory bandwidth (a read of a buffer the size of those weights). ``limit_ms = max(compute
ms, bytes / bandwidth)``, all in that dtype (its matmul rate, its attention, its bytes per weight and
KV entry); ``ratio = step / limit`` of the variant's own dtype (issues #37, #59: within 2x). ``compute_ms_stacked``,
``limit_ms_stacked``, ``ratio_stacked``: the same with q/k/v and gate/up timed as the stacked shapes
``fused_decode`` runs (a larger matmul may run at a higher rate: a stricter limit for that variant).

(c) ``profile``: one more call of each variant with timers on the model's modules (forward hooks)
and on the engine's sampling: embedding, q/k/v and o projections, attention core (rope, the cache
write, the attention kernel), MLP matmuls and activation, RMS norms, LM head, the model's own glue
(residual adds, rotary tables, masks), sampling, and the rest of the loop (stop checks, host syncs,
the step's mask and bookkeeping) as the remainder: they sum to the profiled step, which the hooks
make slightly slower than ``step_ms``. ``--ops``: also torch.profiler's top operators.

``logprob_vs_trainer``: per variant, max / mean ``|engine − trainer|`` behaviour log-prob of one more
call, the trainer being ``token_logprobs`` on the PEFT model (the merged copy measured 3.0e-5 / 5.3e-6
on SmolLM2, the unmerged adapter 3.0e-5 / 4.2e-6: a switch should not move these).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import asyncrl.engine.hf as hf_module
from asyncrl.config import HFEngineConfig, LoraConfig, ModelConfig
from asyncrl.engine import HFEngine
from asyncrl.engine.cpu.fused import FusedForward
from asyncrl.engine.cpu.packed import PackedLinear
from asyncrl.policy import Policy, token_logprobs
from asyncrl.policy.lora import apply_lora
from asyncrl.records import SamplingParams

MODEL = Path(".cache/models/smollm2-135m-instruct")
TINY = {"family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},  # the engine as configured by default (merged LoRA copy, packed linears, fused step)
    # each switch alone
    "unpacked": {"packed_linear": False},  # MKL sgemm on the weights as stored
    "packed_linear": {"packed_linear": True, "fused_decode": False},
    "fused_decode": {"packed_linear": True, "fused_decode": True},
    "unmerged": {"merge_lora": False},  # through PEFT's adapter layers (no copy, nothing packed)
}
"""Engine switches measured one at a time: name -> :class:`HFEngineConfig` fields."""


def spread(xs: list[float], nd: int = 2) -> dict[str, float]:
    return {"min": round(min(xs), nd), "median": round(statistics.median(xs), nd), "max": round(max(xs), nd)}


def switches(name: str) -> dict[str, Any]:
    """The engine settings of a variant, or of several joined by ``+`` (an ``@dtype`` suffix aside)."""
    return {k: v for part in name.split("@")[0].split("+") for k, v in VARIANTS[part].items()}


def dtype_of(name: str) -> str:
    """The ``model.dtype`` a variant runs in: its ``@dtype`` suffix, else float32."""
    return name.split("@")[1] if "@" in name else "float32"


def build_policy(args: argparse.Namespace, dtype: str) -> Policy:
    """SmolLM2 (or the tiny model) in ``dtype`` (as ``model.dtype``: the base weights; peft keeps the
    adapter float32) with a LoRA adapter whose ``B ~ N(0, b_std²)``: a non-zero version."""
    lora = LoraConfig(rank=16, alpha=32)
    if args.tiny:
        policy = Policy.build(ModelConfig(seed=0, intermediate_size=128, **TINY))  # type: ignore[arg-type]
        policy.model = apply_lora(policy.model.to(getattr(torch, dtype)), lora)
    else:
        cfg = ModelConfig(path=str(MODEL), lora=lora.model_dump(), dtype=dtype)  # type: ignore[arg-type]
        policy = Policy.load(MODEL, cfg=cfg)
    policy.load_tensors(adapter_version(policy, args.b_std, seed=0))
    return policy


def adapter_version(policy: Policy, b_std: float, seed: int) -> dict[str, torch.Tensor]:
    """peft's ``A`` (as initialised), ``B ~ N(0, b_std²)``: a non-zero adapter version."""
    g = torch.Generator().manual_seed(seed)
    return {
        n: (torch.randn(t.shape, generator=g) * b_std if ".lora_B." in n else t)
        for n, t in policy.state_dict_tensors().items()
    }


def workload(args: argparse.Namespace, vocab: int) -> tuple[list[list[int]], SamplingParams]:
    g = torch.Generator().manual_seed(1)
    hi = min(40000, vocab)
    groups = [torch.randint(100, hi, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.groups)]
    prompts = [groups[i % args.groups] for i in range(args.batch)]
    return prompts, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)


def call_ms(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams) -> tuple[float, float]:
    """Milliseconds per decode step of one generation call, and of its prefill."""
    s0, n0, p0 = engine.decode_seconds, engine.decode_steps, engine.prefill_seconds
    engine.generate(prompts, sp)
    return 1000 * (engine.decode_seconds - s0) / (engine.decode_steps - n0), 1000 * (
        engine.prefill_seconds - p0
    )


def step_times(
    engines: dict[str, HFEngine], prompts: list[list[int]], sp: SamplingParams, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """Per variant: decode ms per step and prefill ms of each repeat, and the warm-up call's seconds."""
    warmup = {}
    for name, e in engines.items():
        t0 = time.perf_counter()
        call_ms(e, prompts, sp)
        warmup[name] = round(time.perf_counter() - t0, 2)
    ms: dict[str, list[float]] = {n: [] for n in engines}
    prefill: dict[str, list[float]] = {n: [] for n in engines}
    for r in range(repeats):
        for name in list(engines)[:: 1 if r % 2 == 0 else -1]:
            step, pre = call_ms(engines[name], prompts, sp)
            ms[name].append(step)
            prefill[name].append(pre)
    return ms, prefill, warmup


def load_times(engines: dict[str, HFEngine], loads: int, b_std: float) -> dict[str, list[float]]:
    """Per variant: milliseconds of ``load_weights`` of each of ``loads`` new adapter versions (the fold
    and every repack included), the variants interleaved (the order flips every version). Every engine
    loads every version, so all end on the last one."""
    out: dict[str, list[float]] = {n: [] for n in engines}
    for i in range(1, loads + 1):
        for name in list(engines)[:: 1 if i % 2 else -1]:
            version = adapter_version(engines[name].policy, b_std, seed=i)
            t0 = time.perf_counter()
            engines[name].load_weights(i, version)
            out[name].append(1000 * (time.perf_counter() - t0))
    return out


# ---- (b) the physical limit ----------------------------------------------------------------------
def best_seconds(fn: Callable[[], Any], budget_s: float, min_runs: int = 3) -> float:
    """The fastest of repeated runs of ``fn`` (after one warm-up), over about ``budget_s`` seconds."""
    fn()
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < min_runs or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], int]:
    """``(in, out)`` of every linear layer one decode step runs (the LM head included) -> how many
    (packed ones too: the first variant's model may be packed)."""
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for m in model.modules():
        if isinstance(m, (torch.nn.Linear, PackedLinear)):
            counts[(m.in_features, m.out_features)] += 1
    return dict(counts)


def matmul_ms(
    batch: int, fan_in: int, fan_out: int, budget_s: float, dtype: torch.dtype = torch.float32
) -> tuple[float, float]:
    """Milliseconds of ``linear([batch, in], [out, in])`` in ``dtype`` timed alone, hot in cache, with the
    faster of torch's ``linear`` and a oneDNN-packed weight (``packed_linear``) where torch has it; GFLOP/s."""
    rows = min(fan_out, max(1, (8 << 20) // (dtype.itemsize * fan_in)))  # a weight over 8 MiB: a slice
    x, w = torch.randn(batch, fan_in, dtype=dtype), torch.randn(rows, fan_in, dtype=dtype)
    s = best_seconds(lambda: torch.nn.functional.linear(x, w), budget_s)
    if torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        p = PackedLinear(torch.nn.Linear(fan_in, rows, bias=False, dtype=dtype))
        s = min(s, best_seconds(lambda: p(x), budget_s))
    rate = 2 * batch * fan_in * rows / s
    return 1000 * 2 * batch * fan_in * fan_out / rate, rate / 1e9


def attention_ms(
    batch: int, heads: int, kv_heads: int, dim: int, cols: int, budget_s: float, dtype: torch.dtype
) -> float:
    """Milliseconds of one layer's decode attention in ``dtype``: the faster of sdpa (packed GQA, boolean
    mask, as transformers runs it) and ``bmm`` + softmax + ``bmm`` on contiguous keys (in bfloat16 sdpa's
    CPU kernel was 2x slower than that at SmolLM2's decode shapes)."""
    q = torch.randn(batch, kv_heads, heads // kv_heads, dim, dtype=dtype)
    k = torch.randn(batch, kv_heads, cols, dim, dtype=dtype)
    v = torch.randn(batch, kv_heads, cols, dim, dtype=dtype)
    mask = torch.ones(batch, 1, 1, cols, dtype=torch.bool)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q3, k3, v3 = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # the fused step's layout, contiguous

    def bmm() -> torch.Tensor:
        return torch.bmm(torch.softmax(torch.bmm(q3, k3.transpose(1, 2)), dim=-1), v3)

    return 1000 * min(
        best_seconds(lambda: sdpa(q, k, v, attn_mask=mask), budget_s), best_seconds(bmm, budget_s)
    )


def bandwidth_gbs(nbytes: int, budget_s: float) -> float:
    """Read bandwidth: ``sum`` over a float32 buffer of ``nbytes``, in GB/s."""
    buf = torch.ones(nbytes // 4)
    return nbytes / best_seconds(lambda: buf.sum(), budget_s) / 1e9


def physical_limit(model: Any, batch: int, kv_cols: float, budget_s: float) -> dict[str, Any]:
    """The step's FLOPs, bytes and the time each takes at this machine's measured rates, in the dtype of
    ``model``'s weights (its matmuls, attention, weight and KV bytes: bfloat16 halves the bytes and, on a
    CPU with AVX-512 BF16, about doubles the matmul rate)."""
    c, dtype = model.config, model.get_input_embeddings().weight.dtype
    size = dtype.itemsize
    layers, heads = c.num_hidden_layers, c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    shapes = linear_shapes(model)
    per_shape, mm_ms, mm_flops = [], 0.0, 0
    raw: dict[tuple[int, int], float] = {}
    for (fi, fo), n in sorted(shapes.items()):
        ms, gflops = matmul_ms(batch, fi, fo, budget_s, dtype)
        raw[(fi, fo)] = ms
        per_shape.append(
            {"in": fi, "out": fo, "count": n, "ms_each": round(ms, 3), "gflops": round(gflops, 1)}
        )
        mm_ms, mm_flops = mm_ms + n * ms, mm_flops + n * 2 * batch * fi * fo
    cols = round(kv_cols)
    attn_ms = layers * attention_ms(batch, heads, kv_heads, dim, cols, budget_s, dtype)
    attn_flops = layers * 4 * batch * heads * dim * kv_cols
    weight_bytes = sum(size * fi * fo * n for (fi, fo), n in shapes.items())
    weight_bytes += size * sum(p.numel() for n, p in model.named_parameters() if p.dim() == 1)  # norms
    kv_bytes = size * layers * 2 * batch * kv_heads * dim * kv_cols
    stacked_ms = mm_ms + attn_ms
    fi, qo, kvo, inter = c.hidden_size, heads * dim, kv_heads * dim, getattr(c, "intermediate_size", 0)
    if shapes.get((fi, qo), 0) >= layers and shapes.get((fi, kvo), 0) >= 2 * layers and (fi, inter) in raw:
        apart = raw[(fi, qo)] + 2 * raw[(fi, kvo)] + 2 * raw.get((fi, inter), 0.0)
        joined = (
            matmul_ms(batch, fi, qo + 2 * kvo, budget_s, dtype)[0]
            + matmul_ms(batch, fi, 2 * inter, budget_s, dtype)[0]
        )
        stacked_ms += layers * (joined - apart)
    gbs = bandwidth_gbs(weight_bytes, budget_s)
    compute_ms = mm_ms + attn_ms
    memory_ms = 1000 * (weight_bytes + kv_bytes) / (gbs * 1e9)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "gflop": round((mm_flops + attn_flops) / 1e9, 3),
        "matmul_gflops": round(mm_flops / mm_ms / 1e6, 1),
        "matmul_shapes": per_shape,
        "attention_ms": round(attn_ms, 3),
        "compute_ms": round(compute_ms, 2),
        "weight_mb": round(weight_bytes / 1e6, 1),
        "kv_mb": round(kv_bytes / 1e6, 1),
        "kv_columns_mean": round(kv_cols, 1),
        "bandwidth_gbs": round(gbs, 2),
        "memory_ms": round(memory_ms, 2),
        "limit_ms": round(max(compute_ms, memory_ms), 2),
        "compute_ms_stacked": round(stacked_ms, 2),
        "limit_ms_stacked": round(max(stacked_ms, memory_ms), 2),
        "bound": "compute" if compute_ms >= memory_ms else "memory",
    }


# ---- (c) the profile -----------------------------------------------------------------------------
def _category(name: str, module: torch.nn.Module) -> str | None:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("q_proj", "k_proj", "v_proj", "qkv_proj"):
        return "qkv_proj"
    if leaf in ("o_proj",):
        return "o_proj"
    if leaf in ("gate_proj", "up_proj", "gate_up_proj", "down_proj"):
        return "mlp_matmuls"
    if leaf == "self_attn":
        return "attention_total"
    if leaf == "mlp":
        return "mlp_total"
    if leaf == "lm_head":
        return "lm_head"
    if leaf == "embed_tokens":
        return "embedding"
    if "norm" in leaf and not list(module.children()):
        return "norms"
    return None


@contextlib.contextmanager
def module_timers(model: torch.nn.Module, acc: dict[str, float]) -> Iterator[None]:
    """Inclusive seconds per category of module (see :func:`_category`) and of the whole forward."""
    handles, starts = [], {}

    def hook(cat: str) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(m: Any, *_: Any) -> None:
            starts[id(m)] = time.perf_counter()

        def post(m: Any, *_: Any) -> None:
            acc[cat] += time.perf_counter() - starts.pop(id(m))

        return pre, post

    mods = [(c, m) for n, m in model.named_modules() if (c := _category(n, m))] + [("forward", model)]
    for cat, m in mods:
        pre, post = hook(cat)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def function_timer(name: str, key: str, acc: dict[str, float]) -> Iterator[None]:
    """Seconds in :mod:`asyncrl.engine.hf`'s ``name`` (patched for the block), added to ``acc[key]``."""
    original = getattr(hf_module, name)

    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            acc[key] += time.perf_counter() - t0

    setattr(hf_module, name, timed)
    try:
        yield
    finally:
        setattr(hf_module, name, original)


def module_parts(ms: dict[str, float]) -> dict[str, float]:
    """Exclusive milliseconds per part of an eager forward pass from the hooks' inclusive ones."""
    attn_mm, mlp_mm = ms.get("qkv_proj", 0.0) + ms.get("o_proj", 0.0), ms.get("mlp_matmuls", 0.0)
    parts = {
        "embedding": ms.get("embedding", 0.0),
        "qkv_proj": ms.get("qkv_proj", 0.0),
        "attention_core": ms.get("attention_total", 0.0) - attn_mm,
        "o_proj": ms.get("o_proj", 0.0),
        "mlp_matmuls": mlp_mm,
        "mlp_activation": ms.get("mlp_total", 0.0) - mlp_mm,
        "norms": ms.get("norms", 0.0),
        "lm_head": ms.get("lm_head", 0.0),
    }
    parts["model_glue"] = ms.get("forward", 0.0) - sum(parts.values())
    return parts


def profile_call(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams) -> dict[str, float]:
    """Milliseconds per decode step by category, from one timed call; they sum to ``step``."""
    acc: dict[str, float] = defaultdict(float)
    in_decode = engine._decode
    s0, n0 = engine.decode_seconds, engine.decode_steps

    def decode(*a: Any, **kw: Any) -> int:
        fwd = engine.forward
        timers = module_timers(fwd.fused if isinstance(fwd, FusedForward) else engine.model, acc)
        with timers, function_timer("sample_tokens", "sampling", acc):
            return in_decode(*a, **kw)

    engine._decode = decode  # type: ignore[method-assign]
    try:
        engine.generate(prompts, sp)
    finally:
        del engine._decode
    steps = engine.decode_steps - n0
    step = (engine.decode_seconds - s0) / steps
    ms = {k: 1000 * v / steps for k, v in acc.items()}
    parts = module_parts(ms)
    parts["sampling"] = ms.get("sampling", 0.0)
    parts["loop_rest"] = 1000 * step - sum(parts.values())
    return {"step": round(1000 * step, 3), **{k: round(v, 3) for k, v in parts.items()}}


def agreement(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams) -> dict[str, float]:
    """``|engine − trainer|`` behaviour log-probs of one call (the trainer: ``token_logprobs`` on the
    policy's own PEFT model, unmerged, unpacked)."""
    samples = engine.generate(prompts, sp)
    deltas = []
    for p, s in zip(prompts, samples, strict=True):
        ids = torch.tensor([p + s.token_ids])
        with torch.no_grad():
            lp = token_logprobs(engine.policy.model, ids, torch.ones_like(ids))[0, len(p) :]
        deltas.append((lp - torch.tensor(s.logprobs)).abs())
    d = torch.cat(deltas)
    return {"tokens": d.numel(), "max_abs": float(d.max()), "mean_abs": float(d.mean())}


def top_ops(engine: HFEngine, prompts: list[list[int]], sp: SamplingParams, n: int = 15) -> list[Any]:
    """torch.profiler's operators of one call (prefill included) by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, sp)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
    return [[e.key, e.count, round(e.self_cpu_time_total / 1000, 2)] for e in rows]


def build_engines(args: argparse.Namespace, names: list[str]) -> dict[str, HFEngine]:
    """One engine per variant, over one policy per dtype (the variants of a dtype share it, as before)."""
    policies = {dt: build_policy(args, dt) for dt in dict.fromkeys(map(dtype_of, names))}
    return {
        n: HFEngine(
            policies[dtype_of(n)],
            HFEngineConfig(cuda_graphs=False, prefix_cache=False, **switches(n)),
            [],
            seed=0,
        )
        for n in names
    }


def limits(
    engines: dict[str, HFEngine], ms: dict[str, list[float]], args: argparse.Namespace
) -> dict[str, Any]:
    """``limit`` per dtype (of the first variant in it), and each variant's step against its dtype's."""
    kv_cols = args.prompt_tokens + args.new_tokens / 2  # the mean of width + step over the call's steps
    first = {dtype_of(n): e for n, e in reversed(engines.items())}
    with torch.inference_mode():
        limit = {dt: physical_limit(e.model, args.batch, kv_cols, args.budget_s) for dt, e in first.items()}
    own = {n: limit[dtype_of(n)] for n in ms}
    return {
        "limit": limit,
        "ratio": {n: spread([x / own[n]["limit_ms"] for x in v]) for n, v in ms.items()},
        "ratio_stacked": {n: spread([x / own[n]["limit_ms_stacked"] for x in v]) for n, v in ms.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--groups", type=int, default=2, help="distinct prompts (rows share them)")
    ap.add_argument("--prompt-tokens", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--b-std", type=float, default=0.01)
    ap.add_argument(
        "--variants",
        default="packed_linear,fused_decode",
        help=f"comma-separated, each of {sorted(VARIANTS)} or several joined by + (the first: the base), "
        "each in float32 or, with @bfloat16 (fused_decode@bfloat16), as model.dtype: bfloat16",
    )
    ap.add_argument("--loads", type=int, default=2, help="adapter versions loaded into each engine, timed")
    ap.add_argument("--budget-s", type=float, default=1.0, help="seconds per rate measurement")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model: a dry run in seconds")
    ap.add_argument("--ops", action="store_true", help="also torch.profiler's top operators")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1 (3 or more for a spread)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = args.variants.split(",")
    unknown = [p for n in names for p in n.split("@")[0].split("+") if p not in VARIANTS]
    unknown += [n for n in names if dtype_of(n) not in ("float32", "bfloat16")]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)} (join with + to combine, @bfloat16)")
    engines = build_engines(args, names)
    prompts, sp = workload(args, engines[names[0]].vocab_size)
    ms, prefill, warmup = step_times(engines, prompts, sp, args.repeats)
    loads = load_times(engines, args.loads, args.b_std)
    result: dict[str, Any] = {
        "model": "tiny" if args.tiny else str(MODEL),
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "step_ms": {n: spread(v) for n, v in ms.items()},
        "step_ms_raw": {n: [round(x, 2) for x in v] for n, v in ms.items()},
        **limits(engines, ms, args),
        "speedup_vs_first": {
            n: spread([a / b for a, b in zip(ms[names[0]], v, strict=True)]) for n, v in ms.items()
        },
        "prefill_ms": {n: spread(v) for n, v in prefill.items()},
        "warmup_call_s": warmup,
        "load_weights_ms": {n: spread(v) for n, v in loads.items() if v},
        "profile_ms": {n: profile_call(e, prompts, sp) for n, e in engines.items()},
        "logprob_vs_trainer": {n: agreement(e, prompts, sp) for n, e in engines.items()},
    }
    if args.ops:
        result["top_ops_ms"] = {n: top_ops(e, prompts, sp) for n, e in engines.items()}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
