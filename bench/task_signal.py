"""Does a real-model task start with signal? Held-out success and the cost of one GRPO batch.

The per-bucket signal check itself is ``asyncrl env signal CONFIG`` (:mod:`asyncrl.jobs.env_signal`); this
script adds the timings (wall and CPU seconds of rollout and of one learner step) on the same groups
(:func:`asyncrl.jobs.groups.play_groups`, :func:`~asyncrl.jobs.groups.group_signal`).

For a run config (and optionally a policy directory, e.g. a warm start written by ``asyncrl sft``):

* held-out success on the first ``--heldout`` tasks of the environment's held-out split, played
  as ``asyncrl eval`` plays them (``run_episodes``: the rollout sampling settings, the built-in
  engine, seed ``cfg.seed``), with outcomes, tool calls, wall and CPU seconds per episode;
* with ``--batch-tasks N``: one GRPO batch of N training tasks × ``rollout.group_size`` episodes
  (rollout wall/CPU seconds), then one ``Learner.step`` on it (train wall/CPU seconds), the share
  of groups whose members' rewards differ (the groups that carry a gradient) and tokens per
  trajectory — the figures that say how many RL steps fit in a time budget.

CPU seconds (``time.process_time``, one torch thread) are what the run would take on an idle core:
on a shared machine wall time also counts the other processes. Prints one JSON object.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/task_signal.py configs/smollm2_arithmetic.yaml \
        --policy "$(asyncrl sft CONFIG | sed -n 's/^warm-start policy: //p')" --heldout 64 --batch-tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from typing import Any

import torch


def _timed(fn: Any) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def heldout_figures(cfg: Any, policy: Any, n: int) -> dict[str, Any]:
    from asyncrl.rollout.heldout import heldout_tasks, run_episodes, summarise

    tasks = heldout_tasks(cfg, n)
    trajs, wall, cpu = _timed(lambda: asyncio.run(run_episodes(cfg, policy, tasks, seed=cfg.seed)))
    rep = summarise(trajs)
    return {
        "episodes": len(trajs),
        "success_rate": rep["success_rate"],
        "outcomes": rep["outcomes"],
        "avg_model_turns": round(rep["avg_steps"], 2),
        "tool_calls": rep["tool_calls"],
        "tool_success_rate": round(rep["tool_success_rate"], 3),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "cpu_s_per_episode": round(cpu / len(trajs), 2),
    }


def batch_figures(cfg: Any, policy: Any, n_tasks: int) -> dict[str, Any]:
    from asyncrl.envs import make_task_source
    from asyncrl.jobs.groups import group_signal, play_groups
    from asyncrl.records import groups_of
    from asyncrl.trainer.learner import Learner

    rng = random.Random(cfg.seed + 1)
    source = make_task_source(cfg.env)
    tasks = [source.sample(rng) for _ in range(n_tasks)]
    groups, roll_wall, roll_cpu = _timed(lambda: play_groups(cfg, policy, tasks, seed=cfg.seed + 1))
    for i, group in enumerate(groups):
        for t in group:
            t.group_id = f"g{i}"
            for turn in t.turns:
                if turn.role == "model":
                    turn.version = 0
    trajs = [t for group in groups for t in group]
    c = group_signal(groups)
    learner = Learner(cfg, policy)
    metrics, step_wall, step_cpu = _timed(lambda: learner.step(groups_of(trajs), version=0))
    tokens = sum(len(u.token_ids) for t in trajs for u in t.turns)
    return {
        "trajectories": len(trajs),
        "success_rate": c.successes / c.episodes,
        "groups_with_signal": c.differ / c.groups,
        "tokens_per_trajectory": round(tokens / len(trajs), 1),
        "sampled_tokens": sum(len(u.token_ids) for t in trajs for u in t.turns if u.role == "model"),
        "rollout_wall_s": round(roll_wall, 1),
        "rollout_cpu_s": round(roll_cpu, 1),
        "train_step_wall_s": round(step_wall, 1),
        "train_step_cpu_s": round(step_cpu, 1),
        "train_skipped": metrics.get("train/skipped"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--policy", default=None, help="policy directory (default: model.path, the base model)")
    ap.add_argument("--heldout", type=int, default=64, help="held-out tasks to play (0: none)")
    ap.add_argument("--batch-tasks", type=int, default=0, help="tasks of the GRPO batch to time (0: none)")
    ap.add_argument("--set", action="append", default=[], help="config override (repeatable)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from asyncrl.config import load_config
    from asyncrl.policy import Policy

    cfg = load_config(args.config, args.set)
    policy = Policy.load(args.policy or cfg.model.path, cfg=cfg.model).to(cfg.model.device)
    out: dict[str, Any] = {"config": args.config, "policy": args.policy or "base", "overrides": args.set}
    if args.heldout:
        out["heldout"] = heldout_figures(cfg, policy, args.heldout)
    if args.batch_tasks:
        out["batch"] = batch_figures(cfg, policy, args.batch_tasks)
    out["loadavg_1m"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
