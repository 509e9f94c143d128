"""The GPU run: the built-in engine's decode step, then async vs sync, on one GPU; prints one JSON object.

    python bench/gpu_async_vs_sync.py [--steps 10] [--latency 0.2] [--batches 64 512] [--out FILE]
    python bench/gpu_async_vs_sync.py --tiny        # the same script on the CPU with a tiny model (a check)

Written for one H200 (issue #11, item 5; the engine part is issue #10, item 6) and meant to finish
within 8 minutes there. Throughput, not quality, is measured, so the model is a Qwen2-shaped
network of about 0.46B parameters built from its config with random weights (hidden 1024,
24 layers, 16 query / 2 key-value heads, MLP 5504; the character tokenizer's vocabulary is tiny,
so nearly every parameter is in the transformer blocks).

Part 1, **engine**: per-step decode latency and tokens/s of the built-in engine for each batch in
``--batches`` (prompts of 64 tokens, 64 new tokens, no stop tokens): the growing cache ("before":
new shapes every step, one kernel launch per op), the static cache with CUDA graphs ("after":
fixed shapes, one graph replay per step), and ``transformers.generate`` at the first batch as the
reference the issue quotes.

Part 2, **runs**: ``asyncrl train`` on the calculator with lognormal tool latency (median
``--latency`` seconds, sigma 1, capped at 5 s), no warm start, in ``async`` and in ``sync`` mode for
``--steps`` training steps each; trainer, rollout worker and orchestrator share the GPU. Reported
per mode: samples/s, generated tokens/s (rollout worker), trained tokens/s (trainer), trainer
utilisation (busy share of its life, and the share spent inside the learner's step), per-step
decode latency inside the run, and the speedup of async over sync.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GPU_MODEL = {
    "hidden_size": 1024,
    "num_layers": 24,
    "num_heads": 16,
    "num_kv_heads": 2,
    "intermediate_size": 5504,
    "max_context": 512,
}
TINY_MODEL = {
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 192,
    "max_context": 320,
}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_part(
    model: dict[str, int], device_spec: str, batches: list[int], new_tokens: int
) -> dict[str, Any]:
    """Decode-step latency of the growing-cache and static-cache paths, and of ``generate``."""
    import torch

    from asyncrl.config import HFEngineConfig, ModelConfig
    from asyncrl.engine import HFEngine
    from asyncrl.policy import Policy, num_parameters
    from asyncrl.records import SamplingParams

    policy = Policy.build(ModelConfig(**model)).to(device_spec)  # type: ignore[arg-type]
    dev = policy.device
    policy.model.train(False)
    out: dict[str, Any] = {"parameters": num_parameters(policy.model), "device": str(dev), "rows": []}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    g = torch.Generator().manual_seed(0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    for batch in batches:
        prompts = torch.randint(10, 90, (batch, 64), generator=g).tolist()
        for name, static in (("growing_cache", False), ("static_cache_graphs", True)):
            engine = HFEngine(
                policy,
                HFEngineConfig(max_batch=batch, static_cache="on" if static else "off", prefix_cache=False),
                [],
                seed=0,
            )
            t_first = time.perf_counter()
            engine.generate(prompts, sp)  # warm-up (and graph capture on the static path)
            _sync(dev)
            first = time.perf_counter() - t_first
            steps0, secs0 = engine.decode_steps, engine.decode_seconds
            t0 = time.perf_counter()
            samples = engine.generate(prompts, sp)
            _sync(dev)
            wall = time.perf_counter() - t0
            steps = engine.decode_steps - steps0
            tokens = sum(len(s.token_ids) for s in samples)
            captured = [d.graph is not None for d in engine._decoders.values()]
            out["rows"].append(
                {
                    "path": name,
                    "batch": batch,
                    "ms_per_decode_step": round(1000 * (engine.decode_seconds - secs0) / max(steps, 1), 2),
                    "tokens_per_second": round(tokens / wall, 1),
                    "first_call_seconds": round(first, 2),
                    "cuda_graphs": bool(captured) and all(captured),
                    "capture_errors": [d.capture_error for d in engine._decoders.values() if d.capture_error],
                }
            )
            del engine
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    # transformers.generate at the first batch: the reference point the issue measured
    batch = batches[0]
    ids = torch.randint(10, 90, (batch, 64), generator=g).to(dev)
    kw: dict[str, Any] = {"do_sample": True, "max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    kw["pad_token_id"] = 0
    with torch.inference_mode():
        policy.model.generate(ids, **kw)  # warm-up
        _sync(dev)
        t0 = time.perf_counter()
        policy.model.generate(ids, **kw)
        _sync(dev)
        wall = time.perf_counter() - t0
    out["rows"].append(
        {
            "path": "transformers_generate",
            "batch": batch,
            "ms_per_decode_step": round(1000 * wall / new_tokens, 2),  # prefill included
            "tokens_per_second": round(batch * new_tokens / wall, 1),
        }
    )
    return out


def _role_rows(run_dir: Path, role: str) -> list[dict[str, Any]]:
    """A role's metric rows (events left out), read with the one JSONL reader."""
    from asyncrl.telemetry.jsonl import read_jsonl_dir

    return [r for r in read_jsonl_dir(run_dir / "metrics") if r.get("role") == role and "event" not in r]


def run_part(args: argparse.Namespace, model: dict[str, int], device_spec: str, root: Path) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    sets = [f"model.{k}={v}" for k, v in model.items()]
    sets += [
        f"model.device={device_spec}",
        "env.kind=calculator",
        f"env.heldout_size={args.heldout}",
        "env.latency.kind=lognormal",
        f"env.latency.seconds={args.latency}",
        "env.latency.sigma=1.0",
        "env.latency.max_seconds=5.0",
        f"rollout.group_size={args.group}",
        f"rollout.concurrent_episodes={args.concurrent}",
        f"rollout.engine.max_batch={args.concurrent}",
        f"rollout.sampling.max_new_tokens={args.new_tokens}",
        f"trainer.batch_size={args.batch}",
        f"trainer.total_steps={args.steps}",
        f"trainer.checkpoint_every={args.steps + 1}",  # a 0.46B checkpoint is ~5 GB with the optimiser
        "trainer.sft.steps=0",  # random weights: throughput, not quality
        "telemetry.eval_every=0",
        "telemetry.archive=false",
        "weights.keep=2",
        f"run_root={root}",
        f"cache_dir={root / 'cache'}",
        *args.overrides,
    ]
    results: dict[str, Any] = {}
    for mode in ("async", "sync"):
        cfg = load_config(None, [*sets, f"control.mode={mode}", f"name=gpu-{mode}"])
        run_dir, s = train(cfg, display=False, eval_limit=args.heldout)
        rl = max(float(s["rl_seconds"]), 1e-9)
        roll_rows, trainer_rows = _role_rows(run_dir, "rollout-0"), _role_rows(run_dir, "trainer")
        roll, trainer = roll_rows[-1] if roll_rows else {}, trainer_rows[-1] if trainer_rows else {}
        trained_tokens = sum(float(r.get("train/tokens", 0.0)) for r in trainer_rows)
        steps = float(roll.get("rollout/decode_steps", 0.0))
        results[mode] = {
            "rl_seconds": round(rl, 1),
            "samples_trained": s["samples_trained"],
            "samples_per_second": round(s["samples_trained"] / rl, 2),
            "rollout_tokens_per_second": round(float(roll.get("rollout/gen_tokens", 0.0)) / rl, 1),
            "trainer_tokens_per_second": round(trained_tokens / rl, 1),
            "trainer_busy_fraction": round(float(s["trainer_busy_fraction"]), 3),
            "trainer_learn_fraction": round(
                float(trainer.get("trainer/learn_seconds", 0.0))
                / max(float(trainer.get("alive_s", rl)), 1e-9),
                3,
            ),
            "rollout_gen_busy_fraction": round(float(roll.get("rollout/gen_busy_seconds", 0.0)) / rl, 3),
            "ms_per_decode_step": round(
                1000 * float(roll.get("rollout/decode_seconds", 0.0)) / max(steps, 1), 2
            ),
            "staleness_mean": round(float(s["staleness_mean"]), 2),
            "samples_dropped_stale": s["samples_dropped_stale"],
            "lost_trajectories": s["lost_trajectories"],
            "run_dir": str(run_dir),
        }
    a, y = results["async"], results["sync"]
    results["speedup_samples_per_second"] = round(
        a["samples_per_second"] / max(y["samples_per_second"], 1e-9), 2
    )
    results["speedup_rl_wall"] = round(y["rl_seconds"] / max(a["rl_seconds"], 1e-9), 2)
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny model on whatever device is here (a CPU check)")
    ap.add_argument("--steps", type=int, default=10, help="training steps per mode")
    ap.add_argument("--latency", type=float, default=0.2, help="median tool latency, seconds")
    ap.add_argument("--batches", nargs="+", type=int, default=[64, 512], help="engine part: decode batches")
    ap.add_argument("--new-tokens", type=int, default=64, help="engine part: tokens per sequence")
    ap.add_argument("--batch", type=int, default=64, help="runs: trajectories per training step")
    ap.add_argument("--group", type=int, default=8, help="runs: group size")
    ap.add_argument(
        "--concurrent", type=int, default=256, help="runs: episodes in flight (and max decode batch)"
    )
    ap.add_argument("--heldout", type=int, default=16, help="runs: held-out tasks evaluated before/after")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--root", help="keep the run directories here (default: a temporary directory, removed)")
    ap.add_argument(
        "--set", dest="overrides", action="append", default=[], help="extra config overrides for the runs"
    )
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    model = TINY_MODEL if args.tiny else GPU_MODEL
    device = "auto" if args.tiny else "cuda"
    if args.tiny:
        args.batches = sorted({min(b, 16) for b in args.batches})
        args.new_tokens = min(args.new_tokens, 16)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"tiny": args.tiny, "model": model, "args": dict(vars(args))}
    if not args.skip_engine:
        result["engine"] = engine_part(model, device, args.batches, args.new_tokens)
        result["engine_seconds"] = round(time.perf_counter() - t0, 1)
        if args.out:  # a later failure or time-out still leaves part 1 on disk
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not args.skip_runs:
        t1 = time.perf_counter()
        if args.root:
            result["runs"] = run_part(args, model, device, Path(args.root))
        else:
            with tempfile.TemporaryDirectory(prefix="asyncrl-gpu-bench-") as tmp:
                result["runs"] = run_part(args, model, device, Path(tmp))
        result["runs_seconds"] = round(time.perf_counter() - t1, 1)
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
