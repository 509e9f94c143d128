"""What one weight load and one weight-sync canary check cost the built-in engine, as JSON.

SmolLM2-135M-Instruct + a random non-zero LoRA adapter (rank 16, ``bench/decode_profile.py``'s
``build_policy``), the default engine (merged copy, packed linears, fused step), one torch thread.
Each repeat loads a new adapter version (the merged copy's refold and repack) and times the canary's
parts on it: the fingerprint of the adapter tensors, the uncached forward over the probe, and the whole
probe (that forward, then the generation path: a prefill of the probe's first half for two rows and a
decode step per token of the second half). Medians of ``--repeats`` after one warm-up.

Usage: ``OMP_NUM_THREADS=1 PYTHONPATH=src python bench/canary_cost.py [--repeats 5] [--probe-tokens 32]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from decode_profile import adapter_version, build_policy

from asyncrl.engine.hf import HFEngine
from asyncrl.policy.canary import probe_ids, probe_logprobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--probe-tokens", type=int, default=32)
    ap.add_argument("--tiny", action="store_true", help="the tiny test model (a dry run)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = build_policy(argparse.Namespace(tiny=args.tiny, b_std=0.02))
    engine = HFEngine(policy, [], seed=0, max_batch=16, cuda_graphs=False, prefix_sharing=True)
    ids = probe_ids(policy.tokenizer, args.probe_tokens, policy.max_context)
    names = sorted(policy.state_dict_tensors())
    ms: dict[str, list[float]] = {"load": [], "fingerprint": [], "uncached_forward": [], "probe": []}
    for v in range(args.repeats + 1):
        tensors = adapter_version(policy, 0.02, seed=v + 1)
        parts = {
            "load": lambda v=v, tensors=tensors: engine.load_weights(v + 1, tensors),
            "fingerprint": lambda: engine.fingerprint(names),
            "uncached_forward": lambda: probe_logprobs(engine.model, ids),
            "probe": lambda: engine.probe(ids),
        }
        for name, fn in parts.items():
            t0 = time.perf_counter()
            fn()
            if v:  # the first round warms up
                ms[name].append((time.perf_counter() - t0) * 1000)
    med = {k: round(statistics.median(v), 1) for k, v in ms.items()}
    print(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "probe_tokens": len(ids),
                "repeats": args.repeats,
                "median_ms": med,
                "check_ms": round(med["fingerprint"] + med["probe"], 1),
                "raw_ms": {k: [round(x, 1) for x in v] for k, v in ms.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
