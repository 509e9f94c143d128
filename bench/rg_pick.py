"""Pick the reasoning-gym rows of the ecosystem table by a stated rule (issue #57 item 6), not by trying
until one works: walk reasoning-gym's registered datasets in alphabetical order, skip those another row
uses, build each alone with its default config (``size`` 5000: a pool wide enough for the held-out split)
at its lowest level (``env.max_difficulty: 0``), and
measure the base model's held-out pass@G there (``--tasks`` held-out tasks, each played G times with the
recipe's sampling: ``configs/smollm2_arithmetic.yaml``, G = its ``rollout.group_size``). The first
``--want`` datasets with pass@G above 0 are the picks. Every dataset looked at is printed (one JSON line
each, whatever it shows), so the scan can be checked.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/rg_pick.py --want 2 --tasks 16

Writes ``bench/results/rg_pick.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "configs" / "smollm2_arithmetic.yaml"
RESULTS = ROOT / "bench" / "results" / "rg_pick.json"
USED_ELSEWHERE = {"basic_arithmetic", "chain_sum", "count_bits"}
"""Datasets the table's other rows use (rg-answer's first table, rg-calc, rg-python, the mix)."""
ANSWER_ONLY = "Solve the problem. Reply with <answer>RESULT</answer> and nothing else."


def _config(name: str, tasks: int) -> Any:
    raw = yaml.safe_load(BASE.read_text())
    raw["model"]["system_prompt"] = ANSWER_ONLY
    raw["env"] = {
        "kind": "reasoning_gym",
        "max_turns": 1,
        "max_difficulty": 0,
        "heldout_size": tasks,
        # size only widens the pool a held-out split is drawn from (reasoning-gym's default 500 leaves
        # some datasets fewer than 16 held-out tasks); the task distribution is the default config's
        "reasoning_gym": {"datasets": [{"name": name, "config": {"size": 5000}}]},
    }
    return _from_dict(raw)


def _from_dict(raw: dict[str, Any]) -> Any:
    import tempfile

    from asyncrl.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(raw, f)
    return load_config(f.name, [])


def measure(name: str, policy: Any, tasks: int) -> dict[str, Any]:
    """Base pass@G of one dataset at its lowest level, or why it could not be measured."""
    from asyncrl.errors import UserError
    from asyncrl.jobs.groups import group_signal, play_groups
    from asyncrl.rollout.heldout import heldout_tasks

    t0 = time.perf_counter()
    try:
        cfg = _config(name, tasks)
        held = heldout_tasks(cfg, tasks)
        p, pg = group_signal(play_groups(cfg, policy, held, seed=cfg.seed)).rates()
    except (UserError, ValueError) as exc:
        return {"dataset": name, "status": f"not measured: {str(exc).splitlines()[0][:160]}"}
    return {
        "dataset": name,
        "success": p,
        "pass_at_g": pg,
        "tasks": len(held),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--want", type=int, default=2, help="stop after this many datasets with pass@G > 0")
    ap.add_argument("--tasks", type=int, default=16, help="held-out tasks per dataset")
    ap.add_argument("--start", default="", help="resume the walk at this dataset name")
    args = ap.parse_args()
    import reasoning_gym

    from asyncrl.policy import Policy

    names = sorted(n for n in reasoning_gym.factory.DATASETS if n >= args.start and n not in USED_ELSEWHERE)
    policy = Policy.from_config(_from_dict(yaml.safe_load(BASE.read_text())).model)
    rows, picks = [], []
    for name in names:
        row = measure(name, policy, args.tasks)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if (row.get("pass_at_g") or 0) > 0:
            picks.append(name)
            if len(picks) == args.want:
                break
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    if args.start and RESULTS.exists():  # a resumed walk keeps what the earlier part scanned
        rows = [r for r in json.loads(RESULTS.read_text())["scanned"] if r["dataset"] < args.start] + rows
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "rule": __doc__.split("\n\n")[0],
        "picks": picks,
        "scanned": rows,
    }
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"picks": picks, "scanned": len(rows)}))


if __name__ == "__main__":
    main()
