"""The orchestrator's measured figures (docs/orchestrator.md); prints one JSON object.

    PYTHONPATH=src .venv/bin/python bench/control_figures.py            # drift only (seconds)
    PYTHONPATH=src .venv/bin/python bench/control_figures.py --runs     # + breaker and kill runs

* drift: false-positive rate of the per-bucket CUSUM (defaults) on stationary streams of group-mean
  rewards (8 Bernoulli(0.4) rewards per group) over many seeds, and its detection delay (in
  groups) on an injected +0.3 jump of the success probability;
* breaker (``--runs``): the fault-switch scenario of tests/test_control_e2e.py -- reaction time in
  episodes and seconds, and the time from the fault clearing to the breaker closing;
* kill (``--runs``): kill -9 of the orchestrator alone mid-run, then ``--resume`` -- whether the
  restored state equals the last saved one, and the recovery time.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def drift(seeds: int = 1000, n: int = 300, at: int = 100, jump: float = 0.3) -> dict[str, Any]:
    from asyncrl.orchestrator.drift import Cusum
    from test_control_rules import _stream

    fired = 0
    for s in range(seeds):
        c = Cusum()  # defaults = the config defaults
        fired += any(c.update(x) is not None for x in _stream(s, n))
    delays, misses = [], 0
    for s in range(seeds):
        c = Cusum()
        for i, x in enumerate(_stream(100_000 + s, n, at, jump)):
            if c.update(x) is not None:
                delays.append(i - at)
                break
        else:
            misses += 1
    after = [d for d in delays if d >= 0]
    return {
        "seeds": seeds,
        "stream_groups": n,
        "false_positive_rate_per_stream": fired / seeds,
        "false_alarm_before_jump": len(delays) - len(after),
        "jump": jump,
        "detection_delay_groups_median": statistics.median(after),
        "detection_delay_groups_p95": sorted(after)[int(0.95 * len(after))],
        "missed": misses,
    }


def runs() -> dict[str, Any]:
    from test_control_e2e import breaker_scenario, kill_scenario

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        b = breaker_scenario(Path(tmp) / "breaker", cache)
        out["breaker"] = {
            "consecutive": b["opened"]["evidence"]["streak"],
            "anomalous_episodes_reported_before_open": b["anomalous_episodes_reported_before_open"],
            "reaction_s_from_first_faulty_group": b["reaction_s_from_first_faulty_group"],
            "reaction_s_from_switch": b["reaction_s_from_switch"],
            "close_s_from_switch_off": b["recovery_s_from_switch_off"],
        }
        for lease in (60, 10):
            out[f"kill_lease_{lease}s"] = _kill(
                kill_scenario(Path(tmp) / f"kill{lease}", cache, 10, f"transport.lease_seconds={lease}")
            )
    return out


def _kill(k: dict[str, Any]) -> dict[str, Any]:
    return {
        "restored_equals_saved": k["restored"] == k["saved"],
        "orphans_reaped": k["orphans_alive_after_kill"],
        "completed": k["returncode"] == 0 and k["summary"].get("trainer_steps") == k["total_steps"],
        "restore_s_orchestrator_state_and_reap": k["restore_s"],
        "recovery_s_resume_to_next_version": k["recovery_s"],
        "downtime_s_kill_to_next_version": k["downtime_s"],
        "duplicates": k["summary"].get("duplicates_recorded"),
        "lost": k["summary"].get("lost_trajectories"),
    }


def main() -> int:
    result: dict[str, Any] = {"drift": drift()}
    if "--runs" in sys.argv:
        result.update(runs())
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
