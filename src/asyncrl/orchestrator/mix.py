"""``env.kind: mix``: the orchestrator's view of each environment of the run (docs/metrics.md#per-environment).

:func:`curriculum_shares` turns the curriculum's bucket weights into each environment's share of the
draws: the weight a worker gives a bucket is its curriculum weight times its prior (the environment's
configured weight spread over its buckets, :func:`asyncrl.control.buckets.bucket_prior`), exactly as
:class:`~asyncrl.control.worker.WorkerControl` draws. :func:`env_metrics` is the ``env/<name>/...``
metrics of the training groups counted so far (:class:`~asyncrl.telemetry.report_envs.EnvTally`).
"""

from __future__ import annotations

from asyncrl.telemetry.report_envs import EnvTally
from asyncrl.telemetry.report_signal import GroupCounts


def curriculum_shares(weights: dict[str, float], prior: dict[str, float]) -> dict[str, float]:
    """Each environment's share (sums to 1) of training draws under the curriculum ``weights``
    (buckets without a weight count 1, as the workers take them); ``{}`` without a mix."""
    if not prior:
        return {}
    scaled = {b: max(weights.get(b, 1.0), 0.0) * p for b, p in prior.items()}
    total = sum(scaled.values())
    out: dict[str, float] = {}
    for b, x in scaled.items():
        name = b.partition("/")[0]
        out[name] = out.get(name, 0.0) + (x / total if total > 0 else 0.0)
    return out


def env_metrics(tally: EnvTally, shares: dict[str, float]) -> dict[str, float]:
    """``env/<name>/...``: episodes, success rate, mean reward, faults and tokens of the training groups
    since the orchestrator started, and the curriculum share."""
    out: dict[str, float] = {}
    for name in sorted(set(tally.envs) | set(shares)):
        c = tally.envs.get(name, GroupCounts())
        n = max(c.episodes, 1)
        out |= {
            f"env/{name}/episodes": float(c.episodes),
            f"env/{name}/success_rate": c.successes / n,
            f"env/{name}/mean_reward": c.reward / n,
            f"env/{name}/faults": float(c.faults),
            f"env/{name}/tokens": float(c.tokens),
        }
        if name in shares:
            out[f"env/{name}/curriculum_share"] = shares[name]
    return out
