"""How long the rollout worker's engine takes to load a LoRA adapter version (refold + repack), on SmolLM2.

``make_engine(HFEngineConfig())`` (the engine a worker runs) on SmolLM2-135M-Instruct with a rank-16 adapter,
``--loads`` loads of the same version, the first ``--warmup`` dropped. Prints one JSON object. Run it with
``PYTHONPATH`` at each tree's ``src/`` to compare two trees side by side (alternate them, as
docs/benchmarks.md does):

    OMP_NUM_THREADS=1 PYTHONPATH=src ASYNCRL_MODELS=.cache/models python bench/lora_load.py [--loads 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from asyncrl.config import HFEngineConfig, ModelConfig
    from asyncrl.engine import make_engine
    from asyncrl.policy import Policy
    from models_util import smollm2_dir

    model_dir = smollm2_dir()
    policy = Policy.load(
        model_dir, cfg=ModelConfig(path=str(model_dir), lora={"rank": args.rank, "alpha": 2 * args.rank})
    )
    engine = make_engine(HFEngineConfig(), policy, [2], seed=0)
    tensors = policy.state_dict_tensors()
    ms = []
    for version in range(1, args.loads + 1):
        t0 = time.perf_counter()
        engine.load_weights(version, tensors)
        ms.append(1000 * (time.perf_counter() - t0))
    kept = ms[args.warmup :]
    out = {
        "asyncrl": str(Path(sys.modules["asyncrl"].__file__ or "").parent),
        "load_ms": [round(x, 1) for x in kept],
        "median_ms": round(statistics.median(kept), 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
