"""The weight-sync canary's cost and margins on the real 135M model, full weights and a LoRA adapter.

For each mode, on SmolLM2-135M-Instruct (``asyncrl model import``), per version: the trainer's
record at publish (fingerprint of the version's tensors + one probe forward pass), the engine's
load, and the canary check after it (the fingerprint read from the engine's model + the engine's
probe), medians over ``--versions`` versions, each one "optimiser step" (``±lr`` on every trainable
element) after the last. Margins: the probe's ``mean |Δ log p|`` engine vs trainer on a correct load
(against the float32 tolerance) and between consecutive versions (what a stale version would show),
and the float32 vs bfloat16 probe gap of the same weights (against the half-precision tolerance).
With LoRA, per version, what the probe adds to a demo-like generation call run after it, and riding
along it (``weights.canary.ride_along``): ``*_extra_ms`` over the call alone. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/canary_cost.py [--versions 5] [--rank 16] [--lr 1e-4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch


def _mean_abs(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


class Clock:
    """Wall and CPU time of timed sections, by name (CPU time is what a loaded machine distorts least)."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def time(self, name: str, fn: Any) -> Any:
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        self.wall.setdefault(name, []).append(time.perf_counter() - w)
        self.cpu.setdefault(name, []).append(time.process_time() - c)
        return out

    def report(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.wall:
            out[f"{name}_ms"] = round(1000 * statistics.median(self.wall[name]), 1)
            out[f"{name}_cpu_ms"] = round(1000 * statistics.median(self.cpu[name]), 1)
        return out


def measure(model_dir: Path, lora: dict[str, int] | None, versions: int, lr: float) -> dict[str, Any]:
    from asyncrl.config import CanaryConfig, HFEngineConfig, LocalWeightsConfig, ModelConfig
    from asyncrl.engine import HFEngine, make_engine
    from asyncrl.policy import Policy
    from asyncrl.policy.canary import CanaryRecord, publish_record
    from asyncrl.rollout.canary import WeightCanary
    from asyncrl.weights import make_weight_store

    canary_cfg = CanaryConfig()
    cfg = ModelConfig(path=str(model_dir), lora=lora)
    trainer, sampler = Policy.load(model_dir, cfg=cfg), Policy.load(model_dir, cfg=cfg)
    engine = make_engine(HFEngineConfig(), sampler, [2], seed=0)  # what a rollout worker runs
    assert isinstance(engine, HFEngine)
    canary = WeightCanary(canary_cfg, ("float32", "float32"))
    clock, diffs, shifts = Clock(), [], []
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
            record_doc = clock.time(
                "record_at_publish", partial(publish_record, trainer, tensors, canary_cfg)
            )
            store.publish(v, tensors, step=v, extra={"canary": record_doc})
            loaded = store.load_latest()
            assert loaded is not None and loaded.version == v
            clock.time("load", partial(engine.load_weights, loaded.version, loaded.tensors, path=loaded.path))
            verdict = clock.time("canary_check", partial(canary.verify, engine, loaded))
            assert verdict is not None and verdict.ok, verdict
            diffs.append(verdict.probe_mean_abs_diff or 0.0)
            record = CanaryRecord.from_manifest(loaded.manifest)
            assert record is not None
            clock.time("fingerprint", partial(engine.fingerprint, sorted(record.fingerprint.tensors)))
            clock.time("probe", partial(engine.probe, record.probe_ids))
            if lora is not None:
                ride_along(clock, engine, record.probe_ids, v)
            if previous is not None:
                shifts.append(_mean_abs(record.probe_logprobs, previous.probe_logprobs))
            previous = record
    times = clock.report()
    ride = {}
    if "call_alone_ms" in times:
        for name in ("call_then_probe", "call_with_probe_riding"):
            extra = [a - b for a, b in zip(clock.wall[name], clock.wall["call_alone"], strict=True)]
            ride[f"{name}_extra_ms"] = {
                "median": round(1000 * statistics.median(extra), 1),
                "min": round(1000 * min(extra), 1),
                "max": round(1000 * max(extra), 1),
            }
    return {
        "tensors": len(tensors),
        "version_mb": round(sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6, 2),
        "probe_tokens": canary_cfg.probe_tokens,
        **times,
        "check_cpu_over_load_cpu": round(times["canary_check_cpu_ms"] / max(times["load_cpu_ms"], 1e-9), 2),
        **ride,
        "probe_diff_correct_load_max": max(diffs),
        "probe_shift_between_versions_min": min(shifts) if shifts else None,
        "tolerance_float32": canary_cfg.probe_tolerance_float32,
    }


def ride_along(clock: Clock, engine: Any, ids: list[int], seed: int) -> None:
    """A demo-like second turn (10 rows: a shared 228-token prefix, 40 tokens of their own, the first turn's
    24 sampled tokens and 12 of a tool result; up to 24 new tokens at temperature 1, the first turn's KV in
    the prefix cache) alone, then with the probe after it, then with the probe riding along it
    (``generate_probed``); in the order of ``seed``'s parity, the same first turn before each."""
    from asyncrl.records import SamplingParams

    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(100, 10_000, (228,), generator=g).tolist()
    turn1 = [prefix + torch.randint(100, 10_000, (40,), generator=g).tolist() for _ in range(10)]
    tool = torch.randint(100, 10_000, (12,), generator=g).tolist()
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    runs = {
        "call_alone": lambda p: engine.generate(p, sp),
        "call_then_probe": lambda p: (engine.generate(p, sp), engine.probe(ids)),
        "call_with_probe_riding": lambda p: engine.generate_probed(p, sp, ids),
    }
    for name in sorted(runs, reverse=bool(seed % 2)):
        engine.clear_prefix_cache()
        engine.generator.manual_seed(seed)
        first = engine.generate(turn1, sp)  # the turn before: its KV in the prefix cache
        turn2 = [p + s.token_ids + tool for p, s in zip(turn1, first, strict=True)]
        clock.time(name, partial(runs[name], turn2))


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
