"""Held-out evaluation: run the policy on the environment's held-out split and summarise.

Evaluation measures the policy, not the tools: simulated latency and fault injection are
switched off (the guard stays on). Episodes are sampled with the rollout sampling settings
(pass@1 under the policy's own distribution, the quantity RL optimises); the engine is seeded,
so the same checkpoint and config give the same numbers.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.control.buckets import bucket_of
from asyncrl.envs import make_task_source
from asyncrl.errors import UserError
from asyncrl.records import Task, Trajectory

if TYPE_CHECKING:
    from asyncrl.gateway.agent import AgentRunner
    from asyncrl.policy.model import Policy


async def run_episodes(
    cfg: RunConfig,
    policy: Policy,
    tasks: list[Task],
    *,
    seed: int,
    temperature: float | None = None,
    prefixes: list[list[list[int]]] | None = None,
) -> list[Trajectory]:
    """Run one episode per task, all concurrently (bounded by rollout.concurrent_episodes), with the
    worker's players (:class:`~asyncrl.rollout.runners.EpisodePlayer`, episode ``i``'s environment seeded
    ``seed + i``; ``env.kind: agent``, the user's program through a private gateway); every sample of
    every episode, in task order (``multi_turn: per_turn`` episodes are several). ``temperature``
    replaces the run's sampling temperature (environment episodes).

    ``prefixes[i]``: model turns replayed before the policy samples in episode ``i`` (see ``run_episode``).
    """
    from asyncrl.engine import make_engine
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.policy.chat import make_renderer
    from asyncrl.policy.model import context_limit
    from asyncrl.rollout.runners import EpisodePlayer

    es = cfg.eval_settings()
    if temperature is not None:
        es = replace(es, sampling=es.sampling.model_copy(update={"temperature": temperature}))
    renderer, max_context = make_renderer(cfg.model, policy), context_limit(cfg.model, policy)
    batcher = TurnBatcher.of(make_engine(es.engine, policy, renderer.stop_token_ids, seed=seed), es.engine)
    # no temperature jitter, no per-bucket factor: evaluation plays the sampling settings as they are
    player = EpisodePlayer(
        es, batcher, renderer, max_context, "eval", random.Random(seed), lambda: 0.0, lambda _: 1.0
    )
    agent: AgentRunner | None = None
    gate = asyncio.Semaphore(es.concurrent_episodes)

    async def one(i: int, task: Task) -> list[Trajectory]:
        async with gate:
            if agent is not None:  # env.kind: agent — the user's program, through a private gateway
                return await agent.episode(task)
            return await player.episode(task, seed + i, prefix=prefixes[i] if prefixes is not None else None)

    try:
        if cfg.env.kind == "agent":
            from asyncrl.gateway.agent import AgentRunner

            agent = await AgentRunner.start(cfg, batcher, renderer, max_context, worker_id="eval")
        return [t for ts in await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))) for t in ts]
    finally:
        if agent is not None:
            await agent.stop()
        batcher.close()


def top_reply_share(episodes: list[Trajectory]) -> float | None:
    """The share of ``episodes`` whose final reply (the last model turn's token ids) is their most common
    one; ``None`` without a reply. A policy that collapsed to one answer scores ~1 whatever the tasks ask
    (held-out success then measures how often that answer is right, not what was learned)."""
    replies = [
        tuple(next((u.token_ids for u in reversed(t.turns) if u.role == "model"), ())) for t in episodes
    ]
    replies = [r for r in replies if r]
    return Counter(replies).most_common(1)[0][1] / len(replies) if replies else None


def _distinct(seqs: list[list[int]], n: int) -> float:
    grams = [tuple(s[i : i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def retokenization_stats(trajs: list[Trajectory]) -> dict[str, float | None]:
    """Token-exactness: ``token_exact_rate`` over the checked samples (trained ids = the template's
    rendering of the sampled chat, compared apart from the rendering that built them), the samples
    that could not be checked beside it (``token_exact_unchecked``: ``render_diff`` is ``None``),
    and ``retokenization_exact_rate`` (re-tokenising the rendered text would have given the same
    ids)."""
    exact = [t.render_diff for t in trajs if t.render_diff is not None]
    retok = [t.retokenization_diff for t in trajs if t.retokenization_diff is not None]
    return {
        "token_exact_checked": len(exact),
        "token_exact_unchecked": len(trajs) - len(exact),
        "token_exact_rate": (sum(d == 0 for d in exact) / len(exact)) if exact else None,
        "retokenization_exact_rate": (sum(d == 0 for d in retok) / len(retok)) if retok else None,
        "retokenization_diff_tokens": sum(retok),
    }


def summarise(trajs: list[Trajectory]) -> dict[str, Any]:
    """Success rate, average model turns, tool-call success and output diversity, overall and per task type."""

    def stats(ts: list[Trajectory]) -> dict[str, Any]:
        calls = [t.tool_call for tr in ts for t in tr.turns if t.role == "model" and t.tool_call is not None]
        outputs = [t.token_ids for tr in ts for t in tr.turns if t.role == "model"]
        episodes = list({t.episode: t for t in ts}.values())  # an episode's samples share its outcome
        n = max(len(episodes), 1)
        return {
            "episodes": len(episodes),
            "success_rate": sum(t.outcome == "success" for t in episodes) / n,
            "avg_steps": len(outputs) / n,
            "tool_calls": len(calls),
            "tool_success_rate": (sum(c.ok for c in calls) / len(calls)) if calls else 0.0,
            "distinct_1": _distinct(outputs, 1),
            "distinct_2": _distinct(outputs, 2),
            "top_reply_share": top_reply_share(episodes),
            "mean_reward": sum(t.final_reward for t in episodes) / n,
            "outcomes": dict(Counter(t.outcome for t in episodes)),
        }

    def by(key: Callable[[Task], str | int]) -> list[tuple[str | int, list[Trajectory]]]:
        groups: dict[str | int, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            groups[key(t.task)].append(t)
        return sorted(groups.items())

    report = {**stats(trajs), **retokenization_stats(trajs)}
    report["per_bucket"] = bucket_counts(trajs)
    report["per_task_type"] = {k: stats(v) for k, v in by(lambda t: t.task_type)}
    report["per_difficulty"] = {str(k): stats(v)["success_rate"] for k, v in by(lambda t: t.difficulty)}
    if any(t.task.env for t in trajs):  # env.kind: mix — every environment's own held-out figures
        report["per_env"] = {k: {**stats(v), **retokenization_stats(v)} for k, v in by(lambda t: t.env) if k}
    return report


def bucket_counts(trajs: list[Trajectory]) -> dict[str, list[int]]:
    """Bucket (:func:`~asyncrl.control.buckets.bucket_of`) -> ``[successful episodes, episodes]``: what the
    curriculum starts from (``orchestrator.curriculum.start_from_eval``)."""
    out: dict[str, list[int]] = {}
    for t in {t.episode: t for t in trajs}.values():  # an episode's samples share its outcome
        counts = out.setdefault(bucket_of(t.task), [0, 0])
        counts[0] += t.outcome == "success"
        counts[1] += 1
    return dict(sorted(out.items()))


def heldout_tasks(cfg: RunConfig, limit: int | None = None) -> list[Task]:
    tasks = make_task_source(cfg.env).heldout()
    return tasks[:limit] if limit else tasks


def evaluate_policy(cfg: RunConfig, policy: Policy, *, seed: int, limit: int | None = None) -> dict[str, Any]:
    tasks = heldout_tasks(cfg, limit)
    trajs = asyncio.run(run_episodes(cfg, policy, tasks, seed=seed))
    return summarise(trajs)


def evaluate_checkpoint(cfg: RunConfig, path: str | None, *, limit: int | None = None) -> dict[str, Any]:
    """Evaluate the policy directory ``path`` (default: ``model.path``, the pretrained model itself); a
    trainer checkpoint (``checkpoints/step_N``) is evaluated by the policy it holds (its ``policy/``)."""
    from asyncrl.policy import Policy

    path = path or cfg.model.path
    if path is None:
        raise UserError(
            "asyncrl eval: give --checkpoint DIR (a policy written by sft or train), or set model.path"
        )
    if (Path(path) / "policy" / "config.json").is_file():
        path = str(Path(path) / "policy")
    policy = Policy.load(path, cfg=cfg.model).to(cfg.model.device)
    report = evaluate_policy(cfg, policy, limit=limit, seed=cfg.seed)
    report["checkpoint"] = str(path)
    return report


def render_eval(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"held-out evaluation ({report['episodes']} episodes)")
    for col in ("task type", "episodes", "success", "avg steps", "tool success", "distinct-2"):
        table.add_column(col, justify="right" if col != "task type" else "left")
    envs = [(f"env {k}", r) for k, r in (report.get("per_env") or {}).items()]
    rows = [("all", report), *envs, *report["per_task_type"].items()]
    for name, r in rows:
        table.add_row(
            name,
            str(r["episodes"]),
            f"{r['success_rate']:.1%}",
            f"{r['avg_steps']:.2f}",
            f"{r['tool_success_rate']:.1%}",
            f"{r['distinct_2']:.3f}",
        )
    Console().print(table)
