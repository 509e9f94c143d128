"""The GPU suite's dry run (issue #37 item 5): every part of ``bench/gpu_suite.py`` runs, tiny, on the
CPU, so the script cannot fail on a lent GPU for a typo; and a part that fails is reported, not hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models_util import smollm2_dir

ROOT = Path(__file__).resolve().parents[1]


def _suite(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "suite.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_suite.py"), "--dry-run", "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(out.read_text())


@pytest.mark.slow
def test_dry_run_runs_every_part(tmp_path: Path) -> None:
    """About 60 s on two quiet cores: each part's code path, with a tiny model and one or two steps."""
    rc, result = _suite(tmp_path, "--root", str(tmp_path / "runs"), "--shape-from", str(smollm2_dir()))
    assert rc == 0, {k: v.get("error") for k, v in result.items() if isinstance(v, dict)}
    paths = {row["path"] for row in result["engine"]["rows"]}
    assert paths == {"growing_cache", "static_cache_graphs", "transformers_generate"}
    assert all(row["tokens_per_second"] > 0 for row in result["engine"]["rows"])
    assert result["vllm"]["path"] == "vllm"  # measured, or 'not installed' where vLLM is absent
    assert result["demo_real"]["weights"] == "random (SmolLM2's shape)"
    assert result["demo_real"]["trainer_steps"] >= 1 and result["demo_real"]["lost_trajectories"] == 0
    assert result["fsdp2"]["backend"] == "gloo" and result["fsdp2"]["trainer_steps"] >= 1
    runs = result["async_vs_sync"]
    assert runs["async"]["samples_trained"] > 0 and runs["sync"]["samples_trained"] > 0
    assert set(result["seconds"]) == {"engine", "vllm", "demo_real", "async_vs_sync", "fsdp2"}


def test_a_failing_part_is_reported_and_fails_the_dry_run(tmp_path: Path) -> None:
    """A part that raises (here: a shape directory that does not exist) is a row with its error."""
    rc, result = _suite(tmp_path, "--parts", "demo_real", "--shape-from", str(tmp_path / "missing"))
    assert rc == 1
    assert result["demo_real"]["status"] == "failed" and result["demo_real"]["error"]
