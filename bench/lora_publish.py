"""Weight versions of the real 135M model: full weights vs a LoRA adapter, side by side.

For each mode, on SmolLM2-135M-Instruct (``asyncrl model import``): the bytes a version holds,
the time to publish it to the local weight store (safetensors + sha256 + fsync + atomic
rename), and the time for a rollout engine to load it (read + verify + copy into the model).
Prints one JSON object.

    PYTHONPATH=src python bench/lora_publish.py [--versions 5] [--rank 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def measure(model_dir: Path, lora: dict[str, int] | None, versions: int) -> dict[str, float]:
    from asyncrl.config import HFEngineConfig, LocalWeightsConfig, ModelConfig
    from asyncrl.engine import HFEngine
    from asyncrl.policy import Policy
    from asyncrl.weights import make_weight_store

    cfg = ModelConfig(path=str(model_dir), lora=lora)
    trainer, sampler = Policy.load(model_dir, cfg=cfg), Policy.load(model_dir, cfg=cfg)
    engine = HFEngine(
        sampler, HFEngineConfig(cuda_graphs=False, prefix_cache=False, prefix_sharing=False), [2], seed=0
    )
    publish, load = [], []
    with tempfile.TemporaryDirectory() as run_dir:
        store = make_weight_store(LocalWeightsConfig(keep=2), Path(run_dir))
        nbytes = 0
        for v in range(1, versions + 1):
            with torch.no_grad():  # a training step's worth of change
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(1e-4)
            t0 = time.perf_counter()
            tensors = trainer.state_dict_tensors()
            store.publish(v, tensors, step=v)
            publish.append(time.perf_counter() - t0)
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            t0 = time.perf_counter()
            loaded = store.load_latest()
            assert loaded is not None and loaded.version == v
            engine.load_weights(loaded.version, loaded.tensors, path=loaded.path)
            load.append(time.perf_counter() - t0)
    return {
        "version_mb": round(nbytes / 1e6, 2),
        "tensors": len(tensors),
        "publish_s_median": round(statistics.median(publish), 4),
        "load_s_median": round(statistics.median(load), 4),
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from models_util import smollm2_dir

    model = smollm2_dir()
    full = measure(model, None, args.versions)
    lora = measure(model, {"rank": args.rank, "alpha": 2 * args.rank}, args.versions)
    print(
        json.dumps(
            {
                "model": "SmolLM2-135M-Instruct (float32)",
                "versions": args.versions,
                "full": full,
                f"lora_r{args.rank}": lora,
                "size_ratio": round(full["version_mb"] / lora["version_mb"], 1),
                "publish_plus_load_speedup": round(
                    (full["publish_s_median"] + full["load_s_median"])
                    / (lora["publish_s_median"] + lora["load_s_median"]),
                    1,
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
