"""Per-environment figures of an ``env.kind: mix`` run: ``summary.json``'s ``per_env`` and its report table.

Every row is one environment of ``env.mix``: its configured weight and curriculum share; its own held-out
success before and after training (the evaluations' ``per_env``, each over that environment's own
held-out split); its training episodes, success, mean reward, environment faults and model tokens,
counted from the ``rollout/group`` events (:class:`~asyncrl.telemetry.reports.GroupReport`, which carry
the environment); and its cost, the run's total apportioned by the tokens each environment generated.
A member that is broken shows in its own row only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.telemetry.report_blocks import Block, Heading, Note, Table, num, pct
from asyncrl.telemetry.report_signal import GroupCounts
from asyncrl.telemetry.reports import GroupReport

__all__ = ["EnvTally", "env_blocks", "per_env"]

ENV_COLUMNS = {
    "weight": ("weight", pct),
    "curriculum share": ("curriculum_share", pct),
    "held-out before": ("initial_success", pct),
    "held-out after": ("final_success", pct),
    "train episodes": ("train_episodes", num),
    "train success": ("train_success_rate", pct),
    "faults": ("faults", num),
    "tokens": ("tokens", num),
    "cost (USD)": ("cost_usd", num),
}
"""The report's per-environment table: column → (``per_env`` field, formatter)."""


@dataclass
class EnvTally:
    """Training groups counted per environment (held-out probes and untagged groups are not)."""

    envs: dict[str, GroupCounts] = field(default_factory=dict)

    def observe(self, g: GroupReport) -> None:
        if g.env and not g.heldout:
            self.envs.setdefault(g.env, GroupCounts()).add(g)

    @classmethod
    def of(cls, reports: Iterable[object]) -> EnvTally:
        tally = cls()
        for r in reports:
            if isinstance(r, GroupReport):
                tally.observe(r)
        return tally


def per_env(
    weights: dict[str, float],
    tally: EnvTally,
    prior: dict[str, Any],
    final: dict[str, Any],
    cost_usd: float | None = None,
    shares: dict[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """``summary.json``'s ``per_env``: one row per environment of ``weights`` (``env.mix``'s names and
    weights), in config order; ``prior``/``final``: the held-out evaluations before and after."""
    total_w = sum(weights.values()) or 1.0
    total_tokens = sum(c.tokens for c in tally.envs.values())
    out: dict[str, dict[str, Any]] = {}
    for name, w in weights.items():
        c = tally.envs.get(name, GroupCounts())
        before = (prior.get("per_env") or {}).get(name) or {}
        after = (final.get("per_env") or {}).get(name) or {}
        token_share = c.tokens / total_tokens if total_tokens else 0.0
        out[name] = {
            "weight": w / total_w,
            "curriculum_share": (shares or {}).get(name),
            "initial_success": before.get("success_rate"),
            "final_success": after.get("success_rate"),
            "heldout_episodes": after.get("episodes", before.get("episodes", 0)),
            "final_mean_reward": after.get("mean_reward"),
            "train_episodes": c.episodes,
            "train_success_rate": c.success,
            "train_mean_reward": c.reward / c.episodes if c.episodes else None,
            "faults": c.faults,
            "tokens": c.tokens,
            "token_share": token_share,
            "cost_usd": cost_usd * token_share if cost_usd is not None else None,
        }
    return out


def env_blocks(summary: dict[str, Any]) -> list[Block]:
    """The report's per-environment table (``summary.json``'s ``per_env``); nothing without a mix."""
    rows_in = summary.get("per_env") or {}
    if not rows_in:
        return []
    cells = [(name, *(f(r.get(k)) for k, f in ENV_COLUMNS.values())) for name, r in rows_in.items()]
    note = Note(
        "Held-out success is over each environment's own held-out split; cost is the run's total "
        "apportioned by the model tokens each environment generated.",
        cls="intro",
    )
    return [Heading("Per environment"), Table(["environment", *ENV_COLUMNS], cells), note]
