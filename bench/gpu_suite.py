"""The GPU suite (issue #37 item 5): everything a lent GPU should measure, in one script of <= 10 min
on one H200, writing JSON after every part and printing a table at the end.

    python bench/gpu_suite.py --out gpu_suite.json              # on the GPU machine
    PYTHONPATH=src python bench/gpu_suite.py --dry-run          # every part, tiny, on the CPU (a check)

Parts (each isolated: a part that fails is reported with its error and the others still run):

1. **engine** -- the same batch (``--batch`` prompts of 64 tokens, 64 new tokens) through the built-in
   engine with the growing cache, the built-in engine with the static cache + CUDA graphs,
   ``transformers.generate``, and vLLM (``rollout.engine.kind: vllm``) when it is installed (else
   reported ``not installed``); ms per decode step and tokens/s. The model is the 0.46B Qwen2-shaped
   network of ``bench/gpu_async_vs_sync.py`` with random weights (throughput, not quality).
2. **demo_real** -- ``configs/smollm2_arithmetic.yaml`` end to end (warm start, evaluations, 24
   asynchronous RL steps) on the GPU. With ``--model-path`` holding SmolLM2-135M-Instruct's weights
   they are used; otherwise (the GPU machine cannot download and the 517 MB model does not travel) a
   model of SmolLM2's exact shape, tokenizer and chat template with random weights is built from the
   small files of ``--shape-from`` (config.json, tokenizer, template: 3.5 MB): the same pipeline and
   shapes, so its wall times are real and its held-out figures meaningless (``weights: random``).
3. **async_vs_sync** -- ``bench/gpu_async_vs_sync.py``'s runs: the calculator with lognormal tool
   latency in ``async`` and ``sync`` mode, samples/s and the speedup.
4. **fsdp2** -- a two-rank trainer group (``trainer.world_size: 2``, ``trainer.parallel: fsdp``):
   nccl on CUDA, gloo on the CPU. On a single GPU both ranks share the device; where NCCL refuses that
   (``Duplicate GPU detected``) the part reports the error rather than hiding it.

``--dry-run`` runs every part with a tiny model and one or two steps on whatever device is here (the
CPU in CI: ``tests/test_gpu_suite.py``), so the script cannot fail on the device for a typo.
Carrying asyncrl's pure-Python dependencies to the GPU machine: docs/benchmarks.md ("GPU suite").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_async_vs_sync import GPU_MODEL, TINY_MODEL, engine_part, run_part

ROOT = Path(__file__).resolve().parents[1]
DEMO_REAL = ROOT / "configs" / "smollm2_arithmetic.yaml"
SHAPE_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_SHAPE |= {"intermediate_size": 128, "head_dim": 16}


def vllm_row(model: dict[str, int], device: str, batch: int, new_tokens: int) -> dict[str, Any]:
    """vLLM on the engine part's batch, or ``not installed``."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"path": "vllm", "status": "not installed"}
    import torch

    from asyncrl.config import ModelConfig
    from asyncrl.config.rollout import VLLMEngineConfig
    from asyncrl.engine import make_engine
    from asyncrl.policy import Policy
    from asyncrl.records import SamplingParams

    policy = Policy.build(ModelConfig(**model)).to(device)  # type: ignore[arg-type]
    engine = make_engine(VLLMEngineConfig(max_batch=batch, vllm_dtype="bfloat16"), policy, [], seed=0)
    try:
        prompts = torch.randint(10, 90, (batch, 64), generator=torch.Generator().manual_seed(0)).tolist()
        sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
        engine.generate(prompts, sp)  # warm-up
        t0 = time.perf_counter()
        samples = engine.generate(prompts, sp)
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    tokens = sum(len(s.token_ids) for s in samples)
    return {"path": "vllm", "batch": batch, "ms_per_decode_step": round(1000 * wall / new_tokens, 2),
            "tokens_per_second": round(tokens / wall, 1)}  # fmt: skip


def shape_copy(source: Path, dest: Path, *, shrink: bool) -> Path:
    """A model directory of ``source``'s shape, tokenizer and template with random weights (seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dest.mkdir(parents=True, exist_ok=True)
    for name in SHAPE_FILES:
        if (source / name).exists():
            (dest / name).write_bytes((source / name).read_bytes())
    config = AutoConfig.from_pretrained(dest)
    if shrink:
        for key, value in TINY_SHAPE.items():
            setattr(config, key, value)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(dest)
    return dest


def demo_real_part(args: argparse.Namespace, device: str, root: Path) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    path = Path(args.model_path) if args.model_path else None
    random_weights = path is None or not (path / "model.safetensors").exists()
    if random_weights:
        path = shape_copy(Path(args.shape_from), root / "smollm2-shape", shrink=args.dry_run)
    sets = [f"model.path={path}", f"model.device={device}", f"run_root={root}", f"cache_dir={root / 'cache'}"]
    sets += ["telemetry.archive=false", "name=gpu-demo-real"]
    if args.dry_run:
        sets += [
            "trainer.total_steps=1",
            "trainer.sft.steps=1",
            "trainer.batch_size=4",
            "rollout.group_size=2",
        ]
        sets += ["telemetry.eval_every=0"]
    t0 = time.perf_counter()
    run_dir, s = train(load_config(str(DEMO_REAL), sets), display=False, eval_limit=args.heldout)
    return {
        "weights": "random (SmolLM2's shape)" if random_weights else "SmolLM2-135M-Instruct",
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "rl_seconds": round(float(s["rl_seconds"]), 1),
        "trainer_steps": s.get("trainer_steps"),
        "seconds_per_step": round(float(s["rl_seconds"]) / max(int(s.get("trainer_steps") or 1), 1), 2),
        "heldout_before": s["initial_success"],
        "heldout_after": s["final_success"],
        "lost_trajectories": s["lost_trajectories"],
        "run_dir": str(run_dir),
    }


def fsdp2_part(args: argparse.Namespace, model: dict[str, int], device: str, root: Path) -> dict[str, Any]:
    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    sets = [f"model.{k}={v}" for k, v in model.items()]
    sets += [f"model.device={device}", "trainer.world_size=2", "trainer.parallel=fsdp", "trainer.sft.steps=0"]
    sets += [f"trainer.total_steps={args.fsdp_steps}", "trainer.batch_size=16", "rollout.group_size=4"]
    sets += ["telemetry.eval_every=0", "telemetry.archive=false", f"run_root={root}", "name=gpu-fsdp2"]
    sets += [f"cache_dir={root / 'cache'}", f"trainer.checkpoint_every={args.fsdp_steps + 1}"]
    t0 = time.perf_counter()
    run_dir, s = train(load_config(None, sets), display=False, eval_limit=2)
    return {
        "backend": "nccl" if device == "cuda" else "gloo",
        "world_size": 2,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "trainer_steps": s.get("trainer_steps"),
        "samples_trained": s["samples_trained"],
        "trainer_busy_fraction": round(float(s["trainer_busy_fraction"]), 3),
        "lost_trajectories": s["lost_trajectories"],
        "run_dir": str(run_dir),
    }


def _part(result: dict[str, Any], name: str, fn: Callable[[], Any], out: str | None) -> None:
    t0 = time.perf_counter()
    try:
        result[name] = fn()
    except Exception as exc:  # a part that fails is a row of the report, not the end of the suite
        result[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
    result.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
    if out:  # a later failure or time-out still leaves the parts done on disk
        Path(out).write_text(json.dumps(result, indent=2) + "\n")


def table(result: dict[str, Any]) -> str:
    lines = ["| part | row | figure |", "|---|---|---|"]
    engine = result.get("engine", {})
    for row in [*engine.get("rows", []), result.get("vllm", {})]:
        if row:
            figure = (
                row.get("status") or f"{row['ms_per_decode_step']} ms/step, {row['tokens_per_second']} tok/s"
            )
            lines.append(f"| engine | {row.get('path')} (batch {row.get('batch', '-')}) | {figure} |")
    for name in [n for n in ("demo_real", "fsdp2") if n in result]:
        part = result[name]
        figure = part.get("error") or f"{part.get('wall_seconds')} s wall, {part.get('trainer_steps')} steps"
        lines.append(f"| {name} | {part.get('weights', part.get('backend', ''))} | {figure} |")
    runs = result.get("async_vs_sync", {})
    if "speedup_samples_per_second" in runs:
        figure = f"async {runs['async']['samples_per_second']} vs sync {runs['sync']['samples_per_second']} samples/s"
        lines.append(f"| async_vs_sync | speedup {runs['speedup_samples_per_second']}x | {figure} |")
    elif runs:
        lines.append(f"| async_vs_sync | | {runs.get('error')} |")
    if engine.get("status") == "failed":
        lines.append(f"| engine | | {engine['error']} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="every part, tiny, on the device here (a check)")
    ap.add_argument("--batch", type=int, default=64, help="engine: prompts in the batch")
    ap.add_argument("--new-tokens", type=int, default=64, help="engine: tokens per sequence")
    ap.add_argument("--model-path", help="demo_real: SmolLM2-135M-Instruct's directory, if it is here")
    ap.add_argument("--shape-from", default=str(ROOT / ".cache" / "models" / "smollm2-135m-instruct"),
                    help="demo_real: a directory with SmolLM2's config.json, tokenizer and template")  # fmt: skip
    ap.add_argument("--heldout", type=int, default=64, help="demo_real: held-out tasks before/after")
    ap.add_argument("--fsdp-steps", type=int, default=4)
    ap.add_argument("--parts", nargs="*", default=["engine", "demo_real", "async_vs_sync", "fsdp2"])
    ap.add_argument("--out", help="also write the JSON here (after every part)")
    ap.add_argument("--root", help="keep the run directories here (default: a temporary directory)")
    args = ap.parse_args(argv)
    # async_vs_sync's knobs (gpu_async_vs_sync.run_part reads them)
    args.steps, args.latency, args.group, args.concurrent, args.overrides = 10, 0.2, 8, 256, []
    if args.dry_run:
        args.batch, args.new_tokens, args.heldout, args.fsdp_steps = 2, 4, 2, 1
        args.steps, args.latency, args.group, args.concurrent = 1, 0.0, 2, 4
    args.batches = [args.batch]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and not args.dry_run
    device, model = ("cuda", GPU_MODEL) if cuda else ("cpu", TINY_MODEL)
    result: dict[str, Any] = {"dry_run": args.dry_run, "device": device, "date": time.strftime("%Y-%m-%d")}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory(prefix="asyncrl-gpu-suite-") as tmp:
        root = Path(args.root or tmp)
        parts: dict[str, Callable[[], Any]] = {
            "engine": lambda: engine_part(model, device, args.batches, args.new_tokens),
            "vllm": lambda: vllm_row(model, device, args.batch, args.new_tokens),
            "demo_real": lambda: demo_real_part(args, device, root / "demo-real"),
            "async_vs_sync": lambda: run_part(args, model, device, root / "async-vs-sync"),
            "fsdp2": lambda: fsdp2_part(args, model, device, root / "fsdp2"),
        }
        for name in args.parts + (["vllm"] if "engine" in args.parts else []):
            _part(result, name, parts[name], args.out)
    print(json.dumps(result, indent=2))
    print(table(result))
    failed = [
        n for n in args.parts if isinstance(result.get(n), dict) and result[n].get("status") == "failed"
    ]
    return 1 if failed and args.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
