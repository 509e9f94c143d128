"""The decode profile's dry run (issue #37 item 1): ``bench/decode_profile.py --tiny`` runs every part
(step times, the physical limit, the per-module profile) on a tiny model in seconds, and its profile
adds up to the step it profiles."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_dry_run_reports_step_limit_and_a_profile_that_sums(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "decode_profile.py"),
        "--tiny",
        "--batch",
        "4",
        "--prompt-tokens",
        "12",
        "--new-tokens",
        "5",
        "--budget-s",
        "0.02",
        "--variants",
        "packed_linear,unpacked,default+packed_linear,fused_decode,fused_decode@bfloat16",  # packed first
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["repeats"] == 3 and len(out["step_ms_raw"]["unpacked"]) == 3
    assert (
        set(out["step_ms"])
        == set(out["profile_ms"])
        == {
            "unpacked",
            "packed_linear",
            "default+packed_linear",
            "fused_decode",
            "fused_decode@bfloat16",
        }
        == set(out["load_weights_ms"])
    )
    assert all(v["min"] > 0 for v in out["load_weights_ms"].values())
    assert (
        out["speedup_vs_first"]["packed_linear"]["median"] == 1.0
        and out["prefill_ms"]["packed_linear"]["min"] > 0
    )
    step = out["step_ms"]["unpacked"]
    assert 0 < step["min"] <= step["median"] <= step["max"]
    assert set(out["limit"]) == {"float32", "bfloat16"}  # the limit at each variant's own dtype
    limit, half = out["limit"]["float32"], out["limit"]["bfloat16"]
    assert limit["dtype"] == "float32" and half["dtype"] == "bfloat16"
    assert (
        half["weight_mb"] < limit["weight_mb"] and half["gflop"] == limit["gflop"]  # the bytes at 2 a weight
    )
    bf16_step = out["step_ms"]["fused_decode@bfloat16"]["median"]
    assert math.isclose(
        out["ratio"]["fused_decode@bfloat16"]["median"], bf16_step / half["limit_ms"], rel_tol=0.02
    )
    assert limit["limit_ms"] == max(limit["compute_ms"], limit["memory_ms"]) > 0
    assert limit["bandwidth_gbs"] > 0 and limit["matmul_gflops"] > 0
    assert limit["limit_ms_stacked"] == max(limit["compute_ms_stacked"], limit["memory_ms"]) > 0
    assert sum(s["count"] for s in limit["matmul_shapes"]) == 2 * 7 + 1  # 2 layers' linears, the LM head
    assert math.isclose(out["ratio"]["unpacked"]["median"], step["median"] / limit["limit_ms"], rel_tol=0.02)
    for n, v in out["logprob_vs_trainer"].items():  # the tiny model: the float32 noise floor
        small = (1e-5, 1e-6) if "@" not in n else (2e-2, 5e-3)  # bfloat16: its fold into the merged copy too
        assert v["tokens"] == 4 * 5 and v["max_abs"] < small[0] and v["mean_abs"] < small[1]
    prof = out["profile_ms"]["packed_linear"]
    parts = {k: v for k, v in prof.items() if k != "step"}
    assert {
        "embedding",
        "qkv_proj",
        "attention_core",
        "mlp_matmuls",
        "lm_head",
        "sampling",
        "loop_rest",
    } <= set(parts)
    assert math.isclose(sum(parts.values()), prof["step"], rel_tol=1e-3, abs_tol=0.01)
    assert all(parts[k] > 0 for k in ("qkv_proj", "mlp_matmuls", "lm_head", "sampling"))
    fused = out["profile_ms"]["fused_decode"]  # the written-out step profiles by the same parts
    assert all(
        fused[k] > 0 for k in ("qkv_proj", "attention_core", "o_proj", "mlp_matmuls", "norms", "lm_head")
    )
    assert math.isclose(
        sum(v for k, v in fused.items() if k != "step"), fused["step"], rel_tol=1e-3, abs_tol=0.01
    )
    joined = out["profile_ms"]["default+packed_linear"]  # variants joined by + profile too
    assert joined["attention_core"] > 0
    assert math.isclose(
        sum(v for k, v in joined.items() if k != "step"), joined["step"], rel_tol=1e-3, abs_tol=0.01
    )
