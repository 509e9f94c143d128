"""The warm start (``asyncrl sft CONFIG --force``) on one torch thread against every core, in one run.

The warm start computes alone (no role runs yet), so ``launcher.solo_threads: 0`` gives it every core
the process may use (``asyncrl.bootstrap.torch_threads``). Until `make` stopped exporting
``OMP_NUM_THREADS=1``, ``make demo`` trained it on one thread. Each setting runs ``asyncrl sft`` in a
fresh process, alternating (``--repeats`` times each, so drift on a shared machine hits both alike),
with ``OMP_NUM_THREADS`` unset. Reported per setting: the process's wall seconds, the warm start's own
``seconds`` and ``train_seconds`` (``warmstart.json``) and its held-out success, with median, min and
max; then the median ratio. Prints one JSON object.

    PYTHONPATH=src .venv/bin/python bench/warm_start_threads.py [--config configs/demo.yaml] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS = {"one thread": 1, "every core": 0}  # launcher.solo_threads


def one_run(config: str, solo_threads: int, cache: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cmd = [sys.executable, "-m", "asyncrl.cli", "sft", config, "--force"]
    cmd += ["--set", f"launcher.solo_threads={solo_threads}", "--set", f"cache_dir={cache}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (meta_path,) = cache.glob("warmstart-*/warmstart.json")
    meta = json.loads(meta_path.read_text())
    return {
        "wall_s": round(wall, 1),
        "seconds": round(meta["seconds"], 1),
        "train_seconds": round(meta["train_seconds"], 1),
        "heldout_success": meta["heldout_success"],
    }


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 2), "min": min(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, threads in SETTINGS.items():
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(one_run(args.config, threads, Path(tmp)))
    out: dict[str, Any] = {
        "config": args.config,
        "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "runs": runs,
        "summary": {
            name: {k: spread([r[k] for r in rs]) for k in ("wall_s", "seconds", "train_seconds")}
            for name, rs in runs.items()
        },
    }
    one, every = (statistics.median(r["train_seconds"] for r in runs[n]) for n in SETTINGS)
    out["train_seconds_ratio_every_core_over_one"] = round(every / one, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
