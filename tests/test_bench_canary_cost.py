"""``bench/canary_cost.py`` on the tiny model: every part is timed, and a check is its fingerprint plus
its probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench_util import ROOT


def test_tiny_run_times_every_part() -> None:
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "canary_cost.py"), "--tiny", "--repeats", "2"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert set(out["median_ms"]) == {"load", "fingerprint", "uncached_forward", "probe"}
    assert all(len(v) == 2 and min(v) > 0 for v in out["raw_ms"].values())
    assert out["check_ms"] == round(out["median_ms"]["fingerprint"] + out["median_ms"]["probe"], 1)
    assert out["median_ms"]["probe"] > out["median_ms"]["uncached_forward"]  # the probe includes it
