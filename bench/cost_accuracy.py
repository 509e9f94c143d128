"""Check the cost ledger on a finished run; prints one JSON object, exits 1 if a target is missed.

    .venv/bin/python bench/cost_accuracy.py runs/demo-<time>

Targets ([cost] issue): device-seconds within 5% of RL wall time × devices; an estimate made from
the first 10% of the run within 20% of the actual total.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    from asyncrl.jobs.cost_report import cost_report

    run = Path(sys.argv[1])
    report = cost_report(run)
    ratio = report["reconciliation"]["ratio"]
    error = report["estimate_from_first_10pct"]["relative_error"]
    result = {
        "run": str(run),
        "total_usd": report["total_usd"],
        "estimate_from_first_10pct_usd": report["estimate_from_first_10pct"]["total_usd"],
        "estimate_relative_error": error,
        "device_seconds_over_wall_x_devices": ratio,
        "reconciliation_ok": abs(ratio - 1) <= 0.05,
        "estimate_ok": abs(error) <= 0.20,
    }
    print(json.dumps(result, indent=2))
    return 0 if result["reconciliation_ok"] and result["estimate_ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
