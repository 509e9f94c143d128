"""Weight publish + load latency for models of about 1M, 10M and 100M parameters; prints one JSON object.

    .venv/bin/python bench/weights_latency.py [--repeats 3] [--sizes 1M 10M 100M]

For each size a Qwen2-shaped policy is built from config (random init) and, ``--repeats`` times,
its weights are published to a fresh local weight store (one safetensors file + manifest, sha256,
fsync, atomic pointer flip: what the trainer does) and loaded back into a second copy of the model
the way a rollout worker does (read, verify checksum, copy into the module). Median seconds per
phase are reported, with the bytes moved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES = {  # hidden, layers, heads, kv heads, intermediate (≈ 1M / 10M / 100M parameters)
    "1M": (128, 4, 4, 2, 384),
    "10M": (320, 8, 8, 4, 960),
    "100M": (768, 13, 12, 4, 2304),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    from asyncrl.config import ModelConfig
    from asyncrl.policy import Policy
    from asyncrl.weights import LocalWeightStore

    torch.set_num_threads(1)
    out = {}
    for name in args.sizes:
        h, layers, heads, kv, inter = SIZES[name]
        cfg = ModelConfig(
            hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, intermediate_size=inter
        )
        trainer, worker = Policy.build(cfg), Policy.build(cfg)
        publish, load, apply = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            store = LocalWeightStore(Path(tmp), keep=2)
            for v in range(1, args.repeats + 1):
                t0 = time.perf_counter()
                store.publish(v, trainer.state_dict_tensors(), step=v)
                t1 = time.perf_counter()
                snap = store.load_latest()
                t2 = time.perf_counter()
                assert snap is not None and snap.version == v
                worker.load_tensors(snap.tensors)
                t3 = time.perf_counter()
                publish.append(t1 - t0)
                load.append(t2 - t1)
                apply.append(t3 - t2)
            nbytes = int(snap.manifest["bytes"])
        out[name] = {
            "parameters": trainer.num_parameters(),
            "bytes": nbytes,
            "publish_s": round(statistics.median(publish), 4),
            "load_verify_s": round(statistics.median(load), 4),
            "apply_s": round(statistics.median(apply), 4),
            "publish_MB_per_s": round(nbytes / 1e6 / statistics.median(publish), 1),
        }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
