"""Counterfactual ablation: is the credit a segment received causal?

For each sampled trajectory (from the run's credit sample files) and each of its segments
``k = 1..n``, the episode is replayed up to the boundary before segment ``k`` (the recorded
model turns go through the environment again) and the policy then plays on from there, ``K``
times. The share of those continuations that succeed is a Monte Carlo estimate ``p_{k−1}`` of
the success probability *before* segment ``k``'s action; ``p_n`` is the recorded outcome. The
counterfactual contribution of segment ``k`` is::

    Δ_k = p_k − p_{k−1}      ("replace the step and see whether the result changes")

and the report gives ``Δ_k`` next to the credit the trainer assigned, and the Spearman rank
correlation of the two over all segments. Environments must be deterministic given the task
and the actions (the built-ins are); evaluation settings are used (no latency, no faults).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from asyncrl.algo import spearman
from asyncrl.credit.samples import CreditSample, read_samples
from asyncrl.errors import UserError


def load_policy(run_dir: Path, checkpoint: str | None) -> tuple[Any, str]:
    """The run's policy at ``checkpoint``: a weight version number, a policy directory, or the latest."""
    from asyncrl.config import load_config
    from asyncrl.policy import Policy
    from asyncrl.weights import make_weight_store

    cfg = load_config(run_dir / "config.yaml")
    if checkpoint is not None and not checkpoint.isdigit():
        return Policy.load(checkpoint, cfg=cfg.model), checkpoint
    policy = Policy.load(run_dir / "initial_policy", cfg=cfg.model)
    store = make_weight_store(cfg.weights, run_dir)
    if checkpoint is None:
        loaded = store.load_latest()
        if loaded is None:
            return policy, "initial_policy"
    else:
        from asyncrl.weights import CorruptSnapshotError

        try:
            loaded = store.load(int(checkpoint))
        except CorruptSnapshotError as exc:
            raise UserError(
                f"--checkpoint {checkpoint}: cannot load that weight version of {str(run_dir)!r} "
                f"(kept versions: {store.versions()}): {exc}"
            ) from None
    policy.load_tensors(loaded.tensors)
    return policy, f"version {loaded.version}"


def _pick(run_dir: Path, n: int) -> list[CreditSample]:
    out: list[CreditSample] = []
    for f in reversed(read_samples(run_dir)):  # newest first
        for s in f.samples:
            if s.segments and len(out) < n:
                out.append(s)
    return out


def ablate(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    trajectories: int = 4,
    k: int = 4,
    seed: int | None = None,
) -> dict[str, Any]:
    """Monte Carlo segment contributions vs assigned credit; returns a JSON-able report. The replays are
    sampled with ``seed`` (None: the run's own ``seed``)."""
    from asyncrl.config import load_config
    from asyncrl.rollout.heldout import run_episodes

    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise UserError(f"{str(run)!r} is not a run directory (no config.yaml)")
    if trajectories < 1 or k < 1:
        raise UserError("--trajectories and --k must be >= 1")
    cfg = load_config(run / "config.yaml")
    samples = _pick(run, trajectories)
    policy, which = load_policy(run, checkpoint)
    tasks, prefixes, owners = [], [], []
    for i, s in enumerate(samples):
        turns = [t.token_ids for t in s.trajectory.turns if t.role == "model"]
        for j in range(len(s.segments)):
            for _ in range(k):
                tasks.append(s.trajectory.task)
                prefixes.append(turns[:j])
                owners.append((i, j))
    trajs = (
        asyncio.run(
            run_episodes(cfg, policy, tasks, seed=cfg.seed if seed is None else seed, prefixes=prefixes)
        )
        if tasks
        else []
    )
    episodes = list({t.episode: t for t in trajs}.values())  # per-turn samples: one per episode
    wins: dict[tuple[int, int], list[float]] = {}
    for (i, j), t in zip(owners, episodes, strict=True):
        wins.setdefault((i, j), []).append(1.0 if t.outcome == "success" else 0.0)
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(samples):
        n = len(s.segments)
        p = [sum(wins[(i, j)]) / len(wins[(i, j)]) for j in range(n)]
        p.append(1.0 if s.trajectory.outcome == "success" else 0.0)
        for j, seg in enumerate(s.segments):
            rows.append(
                {
                    "trajectory": s.trajectory.id,
                    "segment": j,
                    "p_before": p[j],
                    "p_after": p[j + 1],
                    "contribution": p[j + 1] - p[j],
                    "credit": seg.credit,
                    "v_before": seg.v_before,
                    "outcome": s.trajectory.outcome,
                }
            )
    contrib = torch.tensor([r["contribution"] for r in rows])
    credit = torch.tensor([r["credit"] for r in rows])
    rho = spearman(contrib, credit) if rows else float("nan")
    report: dict[str, Any] = {
        "run": str(run),
        "policy": which,
        "strategy": cfg.credit.strategy,
        "trajectories": len(samples),
        "k": k,
        "segments": len(rows),
        "episodes": len(trajs),
        "spearman": None if rho != rho else rho,
        "rows": rows,
    }
    with_v = [r for r in rows if r["v_before"] is not None]
    if len(with_v) >= 2:
        v_rho = spearman(
            torch.tensor([r["v_before"] for r in with_v]), torch.tensor([r["p_before"] for r in with_v])
        )
        report["value_vs_mc_spearman"] = None if v_rho != v_rho else v_rho
    return report


def render_ablation(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"counterfactual ablation — {report['strategy']}, {report['policy']}, "
        f"{report['trajectories']} trajectories × K={report['k']}"
    )
    for col in ("trajectory", "seg", "p before", "p after", "contribution", "assigned credit", "outcome"):
        table.add_column(col, justify="left" if col in ("trajectory", "outcome") else "right")
    for r in report["rows"]:
        table.add_row(
            r["trajectory"][:8],
            str(r["segment"] + 1),
            f"{r['p_before']:.2f}",
            f"{r['p_after']:.2f}",
            f"{r['contribution']:+.2f}",
            f"{r['credit']:+.3f}",
            r["outcome"],
        )
    console = Console()
    console.print(table)
    rho = report["spearman"]
    console.print(
        f"Spearman rank correlation (contribution vs credit) over {report['segments']} segments: "
        + ("undefined (a constant column)" if rho is None else f"{rho:+.3f}")
    )
    if report.get("value_vs_mc_spearman") is not None:
        console.print(
            f"value model vs Monte Carlo success estimate (Spearman): {report['value_vs_mc_spearman']:+.3f}"
        )
