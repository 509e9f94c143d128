"""Prefill with the fused step's q/k/v and gate/up parts unpacked (the default) or packed, side by side.

With ``rollout.engine.fused_decode`` the decode step runs the stacked q/k/v and gate/up matmuls, so their
parts compute only prefills and keep no packed copy (``PackedLinear.unpack``: nothing to repack at a load).
This measures what that costs the prefill: one engine (``make_engine(HFEngineConfig())``, SmolLM2-135M-Instruct
+ a rank-16 adapter, one thread), a demo-like second turn (10 rows: a shared 228-token prefix, 40 tokens of
their own, the first turn's 24 sampled tokens in the prefix cache and 12 tokens of a tool result, one new
token), its parts unpacked and packed in turn (the order flipping every repeat), the prefix cache rebuilt
before each. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src ASYNCRL_MODELS=.cache/models python bench/prefill_parts.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from _common import smollm2_lora_engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.records import SamplingParams

    _, engine = smollm2_lora_engine([2])
    assert isinstance(engine.forward, FusedForward)
    parts = [p for stack in engine.forward.fused.stacks for p in stack.parts]
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, 10_000, (228,), generator=g).tolist()
    turn1 = [prefix + torch.randint(100, 10_000, (40,), generator=g).tolist() for _ in range(10)]
    tool = torch.randint(100, 10_000, (12,), generator=g).tolist()
    first = engine.generate(turn1, SamplingParams(temperature=1.0, max_new_tokens=24))
    turn2 = [p + s.token_ids + tool for p, s in zip(turn1, first, strict=True)]
    one = SamplingParams(temperature=1.0, max_new_tokens=1)

    computed: list[int] = []

    def prefill_ms() -> float:
        engine.clear_prefix_cache()
        engine.generate(turn1, one)  # the first turn's prompts in the prefix cache (its sample is not)
        p0, c0 = engine.prefill_seconds, engine.prefill_tokens_computed
        engine.generate(turn2, one)
        computed.append(engine.prefill_tokens_computed - c0)
        return 1000 * (engine.prefill_seconds - p0)

    ms: dict[str, list[float]] = {"unpacked": [], "packed": []}
    prefill_ms()  # warm-up
    for r in range(args.repeats):
        for name in sorted(ms, reverse=bool(r % 2)):
            for p in parts:
                if name == "packed":
                    p.repack()
                else:
                    p.unpack()
            ms[name].append(prefill_ms())
    ratio = [u / p for u, p in zip(ms["unpacked"], ms["packed"], strict=True)]
    print(
        json.dumps(
            {
                "prefill_ms": {n: [round(x, 1) for x in v] for n, v in ms.items()},
                "median_ms": {n: round(statistics.median(v), 1) for n, v in ms.items()},
                "unpacked_over_packed": {
                    "median": round(statistics.median(ratio), 3),
                    "min": round(min(ratio), 3),
                    "max": round(max(ratio), 3),
                },
                "tokens_computed_a_call": sorted(set(computed)),
            }
        )
    )


if __name__ == "__main__":
    main()
