"""Per-trajectory lifecycle traces and the per-batch data-quality figures the trainer reports.

A trained trajectory's life, from its :class:`~asyncrl.records.Lifecycle` timestamps and turns:

==================  =====================================================================================
``env_s``           wall time of its environment steps (tool calls, grading): Σ model turns' ``env_seconds``
``generation_s``    wall time of its model turns (Σ ``ended_at - started_at``), batching waits included
``rollout_other_s`` the rest of the episode (``rollout_end - rollout_start - env_s - generation_s``)
``queue_wait_s``    ``dequeued - enqueued``: on the trajectory bus
``buffer_wait_s``   ``trained - dequeued``: in the trainer's replay buffer
``end_to_end_s``    ``trained - created``
``age``             versions between its oldest model turn and the weights that trained it
==================  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncrl.records import Trajectory

STAGES = ("env_s", "generation_s", "rollout_other_s", "queue_wait_s", "buffer_wait_s")


def trace(t: Trajectory, age: int, step: int) -> dict[str, Any]:
    """One trajectory's lifecycle breakdown (seconds) and what became of it."""
    life = t.lifecycle
    model = [u for u in t.turns if u.role == "model"]
    env_s = sum(u.env_seconds for u in model)
    gen_s = sum(max(0.0, u.ended_at - u.started_at) for u in model)
    rollout = max(0.0, life.rollout_end - life.rollout_start) if life.rollout_end else 0.0

    def span(a: float, b: float) -> float:
        return max(0.0, b - a) if a and b else 0.0

    return {
        "id": t.id,
        "worker": t.worker_id,
        "task_type": t.task.task_type,
        "step": step,
        "age": age,
        "version": t.oldest_version(),
        "outcome": t.outcome,
        "reward": t.final_reward,
        "tokens": len(t.token_ids()),
        "model_tokens": t.num_model_tokens(),
        "env_s": env_s,
        "generation_s": gen_s,
        "rollout_other_s": max(0.0, rollout - env_s - gen_s),
        "queue_wait_s": span(life.enqueued, life.dequeued),
        "buffer_wait_s": span(life.dequeued, life.trained),
        "end_to_end_s": span(life.created, life.trained),
        "trained_at": life.trained,
    }


def quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _distinct_2(outputs: list[list[int]]) -> float:
    grams = [tuple(s[i : i + 2]) for s in outputs for i in range(len(s) - 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def batch_stats(traces: list[dict[str, Any]], batch: list[Trajectory]) -> dict[str, float]:
    """Distributions and rates of one trained batch (namespaced metric keys, see docs/metrics.md)."""
    n = max(len(batch), 1)
    rewards = [t.final_reward for t in batch]
    lengths = [float(len(t.token_ids())) for t in batch]
    calls = [u.tool_call for t in batch for u in t.turns if u.role == "model" and u.tool_call is not None]
    outputs = [u.token_ids for t in batch for u in t.turns if u.role == "model"]
    out = {
        "reward/min": min(rewards, default=0.0),
        "reward/p50": quantile(rewards, 0.5),
        "reward/max": max(rewards, default=0.0),
        "length/p50_tokens": quantile(lengths, 0.5),
        "length/p90_tokens": quantile(lengths, 0.9),
        "length/max_tokens": max(lengths, default=0.0),
        "length/model_tokens_mean": sum(t.num_model_tokens() for t in batch) / n,
        "tools/calls_per_episode": len(calls) / n,
        "tools/success_rate": sum(c.ok for c in calls) / len(calls) if calls else 0.0,
        "diversity/distinct_2": _distinct_2(outputs),
    }
    for key in (*STAGES, "end_to_end_s"):
        vals = [float(tr[key]) for tr in traces]
        out[f"lifecycle/{key.removesuffix('_s')}_mean_s"] = sum(vals) / len(vals) if vals else 0.0
    out["lifecycle/end_to_end_p90_s"] = quantile([float(tr["end_to_end_s"]) for tr in traces], 0.9)
    return out
