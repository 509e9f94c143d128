"""The share of role wall time spent in the framework rather than in generation, training or
environment calls, from a finished run's metrics; prints one JSON object.

    .venv/bin/python bench/overhead.py RUN_DIR

Per role process (its last metric row; every incarnation counted):

* trainer: ``learn_seconds`` (forward, backward, optimiser) is useful work, ``idle_seconds`` is
  waiting for data; the framework's share is ``busy_seconds - learn_seconds`` (queue reads and
  acks, de-duplication, buffer assembly, weight publishing, checkpoints, archive, metrics);
* rollout worker: generation (``gen_busy_seconds``) and environment calls overlap in its event
  loop; the framework's share is the time spent putting trajectories on the queue
  (``put_seconds``, which also contains back-pressure waits, so it is an upper bound) plus loading
  new weight versions (``weight_load_seconds``).

``overhead_share`` = framework seconds / Σ role wall seconds (target below 2%).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    run = Path(sys.argv[1])
    last: dict[tuple[str, int], dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "pid" in r and "event" not in r and "alive_s" in r:
            last[(r["role"], r["pid"])] = r
    wall = trainer_fw = rollout_fw = learn = gen = 0.0
    for (role, _), r in last.items():
        if role == "trainer":
            wall += r["alive_s"]
            learn += r.get("trainer/learn_seconds") or 0.0
            trainer_fw += (r.get("trainer/busy_seconds") or 0.0) - (r.get("trainer/learn_seconds") or 0.0)
        elif role.startswith("rollout"):
            wall += r["alive_s"]
            gen += r.get("rollout/gen_busy_seconds") or 0.0
            rollout_fw += (r.get("rollout/put_seconds") or 0.0) + (
                r.get("rollout/weight_load_seconds") or 0.0
            )
    out = {
        "run": str(run),
        "role_wall_seconds": round(wall, 1),
        "trainer_learn_seconds": round(learn, 1),
        "rollout_generation_seconds": round(gen, 1),
        "trainer_framework_seconds": round(trainer_fw, 2),
        "rollout_framework_seconds": round(rollout_fw, 2),
        "overhead_share": round((trainer_fw + rollout_fw) / wall, 4) if wall else None,
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
