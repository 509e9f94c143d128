"""The real model on environments asyncrl did not write (issues #34 item 8, #57 item 6): one row per
environment kind, SmolLM2-135M-Instruct + LoRA with the demo-real recipe (``configs/smollm2_arithmetic.yaml``:
12-step warm start, held-out evaluation, asynchronous RL, evaluation) on 2 cores, the warm start's source
``--source`` (default ``auto``: the environment's demonstrations where it has any, then rounds of the
policy's own successful episodes; docs/warm-start.md). Each row is that config with its ``env`` section
(and a system prompt that says how to answer) replaced; everything else is the recipe's. Every row is
reported whatever it shows, per seed (``--seeds``, default 0 1): held-out success of the base model
(``asyncrl eval`` on ``model.path``) -> after the warm start -> after RL (``--heldout`` tasks, default
64), the total and the RL gain in points, the samples lost, the token-exactness of the checked samples,
tool calls per episode, the wall time and the warm start's rounds. ``--set KEY=VALUE`` (repeatable)
applies dotted overrides, as ``asyncrl train --set`` reads them, to every chosen row's config after the
row's own settings (a lever is stated in the command that reproduces a row and stored in its result as
``overrides``); ``--steps`` sets ``trainer.total_steps`` and a ``--set`` of it wins. A run with other
levers than the recipe's is merged under its own key (``rg-answer@0 --steps 48 --set ...``).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/ecosystem_real.py --rows rg-answer rg-calc
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/ecosystem_real.py --rows rg-answer --seeds 0 \
        --steps 48 --set rollout.adaptive_group_size=true
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/ecosystem_real.py --dry-run   # configs only

Writes ``bench/results/ecosystem_real.json`` (rows merged by ``name@seed``, the file read again before each
write, so rows can run in separate or concurrent invocations) and prints the table that ``docs/benchmarks.md`` shows ("Environments from other
ecosystems"). A row whose kind is not on this main (its module is missing) is reported as
``not run``, never as a result.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config.loader import ConfigError, apply_overrides

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "configs" / "smollm2_arithmetic.yaml"
RESULTS = ROOT / "bench" / "results" / "ecosystem_real.json"

ANSWER_ONLY = "Solve the problem. Reply with <answer>RESULT</answer> and nothing else."
CALC = (
    "You solve problems with a calculator tool. To use it, reply with exactly:\n"
    '<tool_call>\n{"name": "calc", "arguments": {"expression": "12+7"}}\n</tool_call>\n'
    "The result comes back in the next message. Then reply with <answer>RESULT</answer> and nothing else."
)
PYTHON = (
    "You solve problems with a Python tool. To use it, reply with exactly:\n"
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(bin(12).count(\'1\'))"}}\n</tool_call>\n'
    "What it prints comes back in the next message. Then reply with <answer>RESULT</answer> and nothing else."
)


RG_ANSWER = [
    {
        "name": "basic_arithmetic",
        "config": {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 2,
            "operators": ["+", "-"],
            "size": 5000,
        },
    }
]


def _rg(datasets: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    return {
        "kind": "reasoning_gym",
        "max_turns": 3 if tools else 1,
        "reasoning_gym": {"datasets": datasets, "tools": tools, "curriculum": False},
    }


def _word_problems(path: Path, n: int = 800, seed: int = 0) -> None:
    """A question/answer JSONL file (the GSM8K shape: ``question``, ``answer``) of one-step word
    problems, written once; the held-out split is the dataset kind's content hash."""
    rng = random.Random(seed)
    shapes = [
        (
            "{name} has {a} apples and buys {b} more. How many apples does {name} have now?",
            lambda a, b: a + b,
        ),
        ("{name} had {a} marbles and gave {b} away. How many marbles are left?", lambda a, b: a - b),
        ("A box holds {a} pens. How many pens are in {b} boxes?", lambda a, b: a * b),
        ("{name} reads {a} pages a day. How many pages after {b} days?", lambda a, b: a * b),
    ]
    names = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana"]
    rows, seen = [], set()
    while len(rows) < n:
        text, fn = rng.choice(shapes)
        a, b = rng.randint(2, 60), rng.randint(2, 30)
        if fn is shapes[1][1] and b > a:
            a, b = b, a
        q = text.format(name=rng.choice(names), a=a, b=b)
        if q not in seen:
            seen.add(q)
            rows.append({"question": q, "answer": str(fn(a, b))})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rows(work: Path) -> dict[str, dict[str, Any]]:
    """name -> {env, system_prompt, needs (a module that must exist on this main)}."""
    data = work / "word_problems.jsonl"
    return {
        "rg-answer": {
            "what": "reasoning-gym basic_arithmetic (2 terms of 1-2 digits, + -), answer only",
            "env": _rg(RG_ANSWER, []),
            "system_prompt": ANSWER_ONLY,
        },
        "rg-calc": {
            "what": "reasoning-gym chain_sum (3 terms of 2 digits), calc tool",
            "env": _rg(
                [
                    {
                        "name": "chain_sum",
                        "config": {
                            "min_terms": 3,
                            "max_terms": 3,
                            "min_digits": 2,
                            "max_digits": 2,
                            "size": 5000,
                        },
                    }
                ],
                ["calc"],
            ),
            "system_prompt": CALC,
        },
        "rg-python": {
            "what": "reasoning-gym count_bits (n < 4096), python tool in the sandbox",
            "env": _rg(
                [{"name": "count_bits", "config": {"min_n": 1, "max_n": 4095, "size": 4000}}], ["python"]
            ),
            "system_prompt": PYTHON,
        },
        "dataset": {
            "what": "a JSONL file of 800 one-step word problems, numeric scorer, calc tool",
            "env": {
                "kind": "dataset",
                "max_turns": 3,
                "dataset": {"path": str(data), "scorer": "numeric", "tools": ["calc"]},
            },
            "system_prompt": CALC,
            "prepare": lambda: _word_problems(data),
        },
        # the next rows take their env section, system prompt and warm start from a shipped config
        "class": {
            "what": "a TRL environment_factory class, unchanged (configs/trl_class.yaml)",
            "from_config": ROOT / "configs" / "trl_class.yaml",
        },
        "gem": {
            "what": "a GEM / TextArena game through its gym interface (configs/gem_guess.yaml)",
            "from_config": ROOT / "configs" / "gem_guess.yaml",
        },
        "mix": {
            "what": "one run over two environments (calculator 1 : reasoning-gym basic_arithmetic 1)",
            "env": {
                "kind": "mix",
                "mix": [
                    {"name": "calc", "weight": 1.0, "env": yaml.safe_load(BASE.read_text())["env"]},
                    {"name": "rg", "weight": 1.0, "env": _rg(RG_ANSWER, [])},
                ],
            },
            "system_prompt": None,  # the recipe's (calc tool, then the answer)
        },
    }


def config_for(
    name: str,
    row: dict[str, Any],
    work: Path,
    steps: int,
    heldout: int,
    seed: int,
    source: str,
    overrides: list[str] | None = None,
) -> Path:
    cfg = yaml.safe_load(BASE.read_text())
    cfg["name"] = f"eco-{name}"
    cfg["seed"] = seed
    # a seed is the run's and its warm start's: trainer.sft.seed is in the warm-start cache key, the run's
    # seed is not, so without this two seeds would share one warm start (the lever runs of 2026-12-07 did)
    cfg["trainer"]["sft"]["seed"] = seed
    cfg["trainer"]["sft"]["source"] = source  # the recipe's own is demos (its calculator demonstrator)
    cfg["run_root"] = str(work / "runs")
    if "from_config" in row:  # its env, system prompt and warm start; the rest is the recipe's
        shipped = yaml.safe_load(Path(row["from_config"]).read_text())
        row = {**row, "env": shipped["env"], "system_prompt": shipped.get("model", {}).get("system_prompt")}
        sft = dict(shipped.get("trainer", {}).get("sft", {}))
        if source != "demos" and sft.get("steps") == 0:  # "no demonstrations, no warm start": now rounds
            del sft["steps"]
        cfg["trainer"]["sft"] = {**cfg["trainer"]["sft"], **sft}
    if row["system_prompt"] is not None:
        cfg["model"]["system_prompt"] = row["system_prompt"]
    cfg["env"] = {**row["env"], "heldout_size": heldout}
    cfg["trainer"]["total_steps"] = steps
    cfg = apply_overrides(cfg, list(overrides or []))  # the command's levers, after the row's own
    path = work / f"{name}-s{seed}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _mean_metric(path: Path, key: str) -> float | None:
    """The mean of ``key`` over the run's metric records (None when no record has it)."""
    values = []
    for line in path.read_text().splitlines() if path.exists() else []:
        value = json.loads(line).get(key)
        if isinstance(value, (int, float)):
            values.append(float(value))
    return sum(values) / len(values) if values else None


def base_success(config: Path, heldout: int) -> float | None:
    """Held-out success of the base model itself (``asyncrl eval`` on ``model.path``), the table's start."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "asyncrl.cli", "eval", str(config), "--limit", str(heldout), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return float(json.loads(proc.stdout)["success_rate"])


def _warm_start_rounds(run_dir: Path) -> list[dict[str, Any]] | None:
    meta = run_dir / "initial_policy" / "warmstart.json"
    rollouts = json.loads(meta.read_text()).get("rollouts") if meta.exists() else None
    return rollouts["rounds"] if rollouts else None


def run_row(name: str, config: Path, work: Path) -> dict[str, Any]:
    before = set((work / "runs").glob(f"eco-{name}-*")) if (work / "runs").exists() else set()
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "train", str(config), "--no-display"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    new = sorted(set((work / "runs").glob(f"eco-{name}-*")) - before)
    summary_path = new[-1] / "summary.json" if new else None
    if proc.returncode != 0 or summary_path is None or not summary_path.exists():
        return {"status": "failed", "rc": proc.returncode, "stderr_tail": proc.stderr[-2000:], "wall_s": wall}
    s = json.loads(summary_path.read_text())
    return {
        "status": "ran",
        "heldout_after_warm_start": s["initial_success"],
        "heldout_after_rl": s["final_success"],
        # near 1: the policy gives one reply to every task (its success is that answer's base rate)
        "same_reply_after_rl": s.get("final_top_reply_share"),
        "trainer_steps": s["trainer_steps"],
        "lost": s["lost_trajectories"],
        "token_exact_rate": s.get("token_exact_rate"),
        "token_exact_checked": s.get("token_exact_checked"),
        "token_exact_unchecked": s.get("token_exact_unchecked"),
        "tool_calls_per_episode": _mean_metric(
            summary_path.parent / "metrics.jsonl", "tools/calls_per_episode"
        ),
        "wall_s": wall,
        "rl_s": s.get("rl_seconds"),
        "warm_start_rounds": _warm_start_rounds(summary_path.parent),
        "run_dir": str(summary_path.parent),
    }


def _load_results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def result_key(name: str, seed: int, steps: int, overrides: list[str]) -> str:
    """``name@seed`` for the recipe itself; a run with other levers is its own entry (never overwrites
    the recipe's): ``name@seed --steps 48 --set rollout.adaptive_group_size=true``."""
    levers = ([f"--steps {steps}"] if steps != 24 else []) + [f"--set {o}" for o in overrides]
    return " ".join([f"{name}@{seed}", *levers])


def _points(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{100 * (b - a):+.1f}"


def table(results: dict[str, Any]) -> str:
    lines = [
        "| row | seed | held-out: base → warm start → RL | gain: total / RL | steps | lost "
        "| token-exact (checked) | tool calls / episode | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        name, _, rest = key.partition("@")
        seed, _, levers = rest.partition(" ")
        name = f"{name} {levers}" if levers else name
        seed = seed or str(r.get("seed", ""))
        if r.get("status") != "ran":
            lines.append(f"| {name} | {seed} | {r.get('status')} | | | | | | |")
            continue
        exact = r["token_exact_rate"]
        exact_s = "None" if exact is None else f"{exact:.3f} ({r['token_exact_checked']})"
        calls = "—" if r["tool_calls_per_episode"] is None else f"{r['tool_calls_per_episode']:.2f}"
        base, ws, rl = r.get("heldout_base"), r["heldout_after_warm_start"], r["heldout_after_rl"]
        base_s = "—" if base is None else f"{base:.1%}"
        lines.append(
            f"| {name} | {seed} | {base_s} → {ws:.1%} → {rl:.1%} | {_points(base, rl)} / {_points(ws, rl)} "
            f"| {r['trainer_steps']} | {r['lost']} | {exact_s} | {calls} | {r['wall_s'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", help="rows to run (default: all)")
    ap.add_argument("--steps", type=int, default=24, help="RL steps (the recipe's 24)")
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument(
        "--source", default="auto", choices=["demos", "rollouts", "auto"], help="trainer.sft.source"
    )
    ap.add_argument("--work", default=str(ROOT / "runs" / "ecosystem-real"))
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override applied to every row's config (repeatable), e.g. rollout.adaptive_group_size=true",
    )
    ap.add_argument("--dry-run", action="store_true", help="write and validate the configs; train nothing")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    all_rows = rows(work)
    chosen = args.rows or list(all_rows)
    unknown = [r for r in chosen if r not in all_rows]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {list(all_rows)}")
    from asyncrl.config import load_config
    from asyncrl.envs.registry import make_task_source

    for name, seed in [(n, s) for n in chosen for s in args.seeds]:
        row = all_rows[name]
        if "prepare" in row:
            row["prepare"]()
        if "from_config" in row and not Path(row["from_config"]).exists():
            print(
                json.dumps({"row": name, "status": f"not run: {row['from_config'].name} is not on this main"})
            )
            continue
        # a typo in --set or a split too small fails here, in one line, before any training
        try:
            config = config_for(name, row, work, args.steps, args.heldout, seed, args.source, args.overrides)
            make_task_source(load_config(str(config), []).env).heldout()
        except ConfigError as exc:
            ap.error(f"row {name}: {exc}")
        if args.dry_run:
            print(json.dumps({"row": name, "config": str(config), "valid": True}))
            continue
        out = {
            "what": row["what"],
            "seed": seed,
            "source": args.source,
            "steps": args.steps,
            "overrides": args.overrides,
            "date": time.strftime("%Y-%m-%d"),
            "heldout_base": base_success(config, args.heldout),
            **run_row(name, config, work),
        }
        results = _load_results()  # read again: another invocation may have merged rows meanwhile
        results[result_key(name, seed, args.steps, args.overrides)] = out
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps({"row": name, **{k: v for k, v in out.items() if k != "stderr_tail"}}), flush=True)
    if not args.dry_run:
        print(table(_load_results()))


if __name__ == "__main__":
    main()
