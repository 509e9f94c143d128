"""The weight-sync canary's cost and margins on the real 135M model, full weights and a LoRA adapter.

For each mode, on SmolLM2-135M-Instruct (``asyncrl model import``), per version: the trainer's
record at publish (fingerprint of the version's tensors + one probe forward pass), the engine's
load, and the canary check after it (the fingerprint read from the engine's model + the engine's
probe), medians over ``--versions`` versions, each one "optimiser step" (``±lr`` on every trainable
element) after the last. Margins: the probe's ``mean |Δ log p|`` engine vs trainer on a correct load
(against the float32 tolerance) and between consecutive versions (what a stale version would show),
and the float32 vs bfloat16 probe gap of the same weights (against the half-precision tolerance).
Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/canary_cost.py [--versions 5] [--rank 16] [--lr 1e-4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def _mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def measure(model_dir: Path, lora: dict[str, int] | None, versions: int, lr: float) -> dict[str, Any]:
    from asyncrl.config import CanaryConfig, LocalWeightsConfig, ModelConfig
    from asyncrl.engine import HFEngine
    from asyncrl.policy import Policy
    from asyncrl.policy.canary import CanaryRecord, publish_record
    from asyncrl.rollout.canary import WeightCanary
    from asyncrl.weights import make_weight_store

    canary_cfg = CanaryConfig()
    cfg = ModelConfig(path=str(model_dir), lora=lora)
    trainer, sampler = Policy.load(model_dir, cfg=cfg), Policy.load(model_dir, cfg=cfg)
    engine = HFEngine(sampler, [2], seed=0, max_batch=64, cuda_graphs=False)
    canary = WeightCanary(canary_cfg, ("float32", "float32"))
    record_s, load_s, check_s, fp_s, probe_s, diffs, shifts = [], [], [], [], [], [], []
    previous: CanaryRecord | None = None
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as run_dir:
        store = make_weight_store(LocalWeightsConfig(keep=2), Path(run_dir))
        for v in range(1, versions + 1):
            with torch.no_grad():  # one Adam-like step: every trainable element moves by ±lr
                for p in trainer.model.parameters():
                    if p.requires_grad:
                        p.add_(lr * torch.randn(p.shape, generator=g).sign())
            tensors = trainer.state_dict_tensors()
            t0 = time.perf_counter()
            extra = {"canary": publish_record(trainer, tensors, canary_cfg)}
            record_s.append(time.perf_counter() - t0)
            store.publish(v, tensors, step=v, extra=extra)
            loaded = store.load_latest()
            assert loaded is not None and loaded.version == v
            t0 = time.perf_counter()
            engine.load_weights(loaded.version, loaded.tensors, path=loaded.path)
            load_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            verdict = canary.verify(engine, loaded)
            check_s.append(time.perf_counter() - t0)
            assert verdict is not None and verdict.ok, verdict
            diffs.append(verdict.probe_mean_abs_diff or 0.0)
            record = CanaryRecord.from_manifest(loaded.manifest)
            assert record is not None
            t0 = time.perf_counter()
            engine.fingerprint(sorted(record.fingerprint.tensors))
            fp_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.probe(record.probe_ids)
            probe_s.append(time.perf_counter() - t0)
            if previous is not None:
                shifts.append(_mean_abs(record.probe_logprobs, previous.probe_logprobs))
            previous = record
    ms = lambda xs: round(1000 * statistics.median(xs), 1)  # noqa: E731
    return {
        "tensors": len(tensors),
        "version_mb": round(sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6, 2),
        "probe_tokens": canary_cfg.probe_tokens,
        "record_at_publish_ms": ms(record_s),
        "load_ms": ms(load_s),
        "canary_check_ms": ms(check_s),
        "fingerprint_ms": ms(fp_s),
        "probe_ms": ms(probe_s),
        "check_share_of_load": round(statistics.median(check_s) / statistics.median(load_s), 3),
        "probe_diff_correct_load_max": max(diffs),
        "probe_shift_between_versions_min": min(shifts) if shifts else None,
        "tolerance_float32": canary_cfg.probe_tolerance_float32,
    }


def half_gap(model_dir: Path, tokens: int) -> dict[str, float]:
    """The probe's ``mean |Δ log p|`` between float32 and bfloat16 copies of the same weights."""
    from asyncrl.config import CanaryConfig, ModelConfig
    from asyncrl.policy import Policy
    from asyncrl.policy.canary import probe_ids, probe_logprobs

    f32 = Policy.load(model_dir, cfg=ModelConfig(path=str(model_dir)))
    ids = probe_ids(f32.tokenizer, tokens, f32.max_context)
    a = probe_logprobs(f32.model, ids)
    del f32
    b = probe_logprobs(
        Policy.load(model_dir, cfg=ModelConfig(path=str(model_dir), dtype="bfloat16")).model, ids
    )
    return {
        "probe_gap_float32_vs_bfloat16_mean": _mean_abs(a, b),
        "probe_gap_float32_vs_bfloat16_max": max(abs(x - y) for x, y in zip(a, b, strict=True)),
        "tolerance_half": CanaryConfig().probe_tolerance_half,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4, help="per-element change of one version")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from models_util import smollm2_dir

    model_dir = smollm2_dir()
    out = {
        "model": "SmolLM2-135M-Instruct",
        "threads": torch.get_num_threads(),
        "lora": measure(model_dir, {"rank": args.rank, "alpha": 2 * args.rank}, args.versions, args.lr),
        "full": measure(model_dir, None, args.versions, args.lr / 10),
        **half_gap(model_dir, 32),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
