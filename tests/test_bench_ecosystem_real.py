"""``bench/ecosystem_real.py``'s ``--set``: the overrides reach the row's generated config after the
row's own settings, a run with levers is stored under its own key (never over the recipe's row), and
a mistyped lever is the config loader's message (no traceback) and exit 2 before anything trains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from bench_util import ROOT, load_bench

eco = load_bench("ecosystem_real")


def test_overrides_reach_the_config_after_the_rows_own(tmp_path: Path) -> None:
    row = eco.rows(tmp_path)["rg-answer"]
    path = eco.config_for(
        "rg-answer",
        row,
        tmp_path,
        steps=48,
        heldout=64,
        seed=1,
        source="auto",
        overrides=["rollout.adaptive_group_size=true", "trainer.total_steps=12", "trainer.sft.steps=100"],
    )
    cfg = yaml.safe_load(path.read_text())
    assert cfg["rollout"]["adaptive_group_size"] is True
    assert cfg["trainer"]["total_steps"] == 12  # a --set of it wins over --steps
    assert cfg["trainer"]["sft"]["steps"] == 100
    assert cfg["trainer"]["sft"]["source"] == "auto"  # the row's own settings stay
    assert cfg["env"]["kind"] == "reasoning_gym" and cfg["seed"] == 1
    assert cfg["trainer"]["sft"]["seed"] == 1  # each seed its own warm start (sft.seed is in its cache key)


def test_a_run_with_levers_has_its_own_key() -> None:
    assert eco.result_key("rg-answer", 0, 24, []) == "rg-answer@0"
    key = eco.result_key("rg-answer", 1, 48, ["rollout.adaptive_group_size=true"])
    assert key == "rg-answer@1 --steps 48 --set rollout.adaptive_group_size=true"
    table = eco.table({key: {"status": "failed"}, "rg-answer@0": {"status": "failed"}})
    assert "| rg-answer --steps 48 --set rollout.adaptive_group_size=true | 1 | failed |" in table
    assert "| rg-answer | 0 | failed |" in table


def test_a_mistyped_lever_exits_2_without_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "bench" / "ecosystem_real.py"), "--rows", "rg-answer", "--seeds", "0"]
    cmd += ["--work", str(tmp_path), "--dry-run", "--set", "rollout.adaptive_group_sze=true"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "rollout.adaptive_group_sze" in proc.stderr and "Traceback" not in proc.stderr
