"""The fused prefill (``rollout.engine.fused_prefill``) against the model's own prefill, side by side, and the
prefix cache's store against the three-copy store it replaced. Prints one JSON object.

One engine (``make_engine(HFEngineConfig())``: SmolLM2-135M-Instruct + a rank-16 adapter, merged, packed and
fused, one thread), its prefill switched between the two paths in turn (the order flipping every repeat), on
three demo-like calls (the demo-real config's shapes: a 228-token system prompt, 26-token tasks in groups of
4, ~30-token first turns, 12-token tool results):

* ``cold_turn1``: 3 groups' first turns after a weight load (the system prompt computed, then the tasks);
* ``turn2``: 10 second turns, each first turn in the prefix cache (13 tokens computed a row);
* ``mixed``: 2 second turns beside a new group's first turn (windows of 13 and 27 tokens in one level:
  the padding the fused prefill skips).

The store: after ``turn2``'s call, its 10 rows' entries kept again from the call's cache by
``PrefixCache.store_rows`` and by :func:`stacked_store` (the code until 2026-12-06: the whole batch's KV
stacked, then each row gathered from the stack).

    OMP_NUM_THREADS=1 PYTHONPATH=src ASYNCRL_MODELS=.cache/models python bench/prefill_fused.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from _common import smollm2_lora_engine


def stacked_store(
    cache: Any, rows: torch.Tensor, valid: torch.Tensor, seqs: list[list[int]]
) -> list[torch.Tensor]:
    """The entries' KV as ``PrefixCache.store_rows`` computed them until 2026-12-06 (for the comparison)."""
    from asyncrl.engine.decode import layer_kv

    n_cols = valid.shape[1]
    kv = torch.stack(
        [torch.stack([k[rows, :, :n_cols], v[rows, :, :n_cols]]) for k, v in map(layer_kv, cache.layers)]
    )
    out = []
    for j, seq in enumerate(seqs):
        columns = valid[rows[j]].nonzero().squeeze(-1)[: len(seq)]
        out.append(kv[:, :, j].index_select(-2, columns))
    return out


def spread(xs: list[float], digits: int = 1) -> dict[str, float]:
    return {k: round(f(xs), digits) for k, f in (("median", statistics.median), ("min", min), ("max", max))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.engine.prefix_cache import PrefixCache
    from asyncrl.records import SamplingParams

    _, engine = smollm2_lora_engine([])
    assert isinstance(engine.forward, FusedForward)
    g = torch.Generator().manual_seed(0)

    def tokens(n: int) -> list[int]:
        return torch.randint(100, 10_000, (n,), generator=g).tolist()

    system, tool = tokens(228), tokens(12)
    groups = [[system + t] * 4 for t in (tokens(26) for _ in range(3))]
    turn1 = [p for grp in groups for p in grp]
    new_group = [system + tokens(26)] * 4
    first = SamplingParams(temperature=1.0, max_new_tokens=30)
    one = SamplingParams(temperature=1.0, max_new_tokens=1)
    ms: dict[str, dict[str, list[float]]] = {
        c: {"fused": [], "model": []} for c in ("cold_turn1", "turn2", "mixed")
    }
    store_ms: dict[str, list[float]] = {"store_rows": [], "stacked": []}
    computed: dict[str, set[int]] = {c: set() for c in ms}
    agree: list[float] = []

    def timed(call: str, prompts: list[list[int]], sp: SamplingParams, name: str) -> list[Any]:
        p0, c0 = engine.prefill_seconds, engine.prefill_tokens_computed
        out = engine.generate(prompts, sp)
        ms[call][name].append(1000 * (engine.prefill_seconds - p0))
        computed[call].add(engine.prefill_tokens_computed - c0)
        return out

    def run(name: str, record: bool) -> list[list[int]]:
        engine.forward.fused_prefill = name == "fused"
        engine.clear_prefix_cache()
        engine.generator.manual_seed(1)
        samples = timed("cold_turn1", turn1, first, name)
        turn2 = [p + s.token_ids + tool for p, s in zip(turn1, samples, strict=True)]
        timed("turn2", turn2[:10], one, name)
        timed("mixed", turn2[10:] + new_group, one, name)
        if not record:
            for v in ms.values():
                v[name].pop()
        return turn2

    run("fused", False)  # warm-up
    for r in range(args.repeats):
        for name in ("model", "fused") if r % 2 else ("fused", "model"):
            turn2 = run(name, True)
        # the store, both ways, on one call's cache: the call's rows kept as the engine keeps them
        engine.forward.fused_prefill = True
        with torch.inference_mode():
            _, cache, valid = engine.prefill_rows(turn2[:10], 1)
        rows, seqs = torch.arange(10), [list(p) for p in turn2[:10]]
        for name in ("stacked", "store_rows") if r % 2 else ("store_rows", "stacked"):
            t0 = time.perf_counter()
            with torch.inference_mode():  # as the engine keeps them, inside its call
                if name == "stacked":
                    old = stacked_store(cache, rows, valid, seqs)
                else:
                    store = PrefixCache(2**34)
                    store.store_rows(cache, rows, valid, seqs, 0)
            store_ms[name].append(1000 * (time.perf_counter() - t0))
        agree.append(
            max(float((store.entries[tuple(s)].kv - o).abs().max()) for s, o in zip(seqs, old, strict=True))
        )
    print(
        json.dumps(
            {
                "prefill_ms": {c: {n: spread(v) for n, v in d.items()} for c, d in ms.items()},
                "model_over_fused": {
                    c: spread([m / f for m, f in zip(d["model"], d["fused"], strict=True)], 3)
                    for c, d in ms.items()
                },
                "tokens_computed_a_call": {c: sorted(v) for c, v in computed.items()},
                "store_ms_10_rows": {n: spread(v) for n, v in store_ms.items()},
                "store_entries_max_abs_diff": max(agree),
                "raw": {"prefill_ms": ms, "store_ms": store_ms},
            }
        )
    )


if __name__ == "__main__":
    main()
