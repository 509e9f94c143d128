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

**Siblings** (``siblings=True``, runs with tree groups): a tree group already holds counterfactuals.
Where a node ``p`` branched, its children are alternative segments played from the same state, so
segment ``k`` (ending in node ``c``, a child of ``p``) is compared with its siblings, at no cost::

    Δ_k = V(c) − V(siblings of c)        V(c) = mean final reward of the leaves below c,
                                         V(siblings) = mean final reward of the leaves below p's
                                         other children (pooled)

Only segments that branched can be judged this way (the others are counted, not listed); each
node counts once, in the episode that sampled it (a replayed turn is shared context). The
estimate uses the group's own leaves — for ``tree`` credit it is the very measurement the credit
was built from (a consistency check, not an independent one); for any other credit of the same
groups (e.g. outcome credit on tree groups) it is an independent one.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.algo import spearman
from asyncrl.config import load_config
from asyncrl.credit.samples import CreditGroup, CreditSample, read_samples
from asyncrl.errors import UserError
from asyncrl.rollout.heldout import run_episodes

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.policy.model import Policy


def load_policy(run_dir: Path, checkpoint: str | None) -> tuple[Policy, str]:
    """The run's policy at ``checkpoint``: a weight version number, a policy directory, or the latest."""
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


def sibling_rows(groups: list[CreditGroup]) -> tuple[list[dict[str, Any]], int]:
    """The sibling contrast of every branching segment of the sampled tree groups (module docstring);
    also returns how many sampled segments had no sibling."""
    from asyncrl.credit.tree import TreeIndex

    rows: list[dict[str, Any]] = []
    lonely = 0
    for members in (g.samples for g in groups):
        index = TreeIndex()
        paths = [
            index.add(0, m.trajectory, [(g.start, g.start, g.end, g.process_reward) for g in m.segments])
            for m in members
        ]
        wins, leaves = _leaf_sums(index.parent, index.outcome, index.weight)
        kids: dict[int, list[int]] = {}
        for node, par in enumerate(index.parent):
            kids.setdefault(par, []).append(node)
        for m, path in zip(members, paths, strict=True):
            own = [not t.shared for t in m.trajectory.turns if t.role == "model"]
            for j, (node, mine) in enumerate(zip(path, own, strict=False)):
                if not mine:
                    continue
                sibs = [c for c in kids[index.parent[node]] if c != node and leaves[c] > 0]
                if not sibs or leaves[node] == 0:
                    lonely += 1
                    continue
                n_sib = sum(leaves[c] for c in sibs)
                p_sib, p_node = sum(wins[c] for c in sibs) / n_sib, wins[node] / leaves[node]
                rows.append(_row(m, j, p_sib, p_node, leaves=leaves[node], sibling_leaves=n_sib))
    return rows, lonely


def _leaf_sums(
    parent: list[int], outcome: list[float], weight: list[float]
) -> tuple[list[float], list[float]]:
    """Per node: the summed final reward and the number of the leaves below it."""
    wins, leaves = [0.0] * len(parent), [0.0] * len(parent)
    for node, w in enumerate(weight):
        at = node
        while w and at >= 0:
            wins[at] += outcome[node] * w
            leaves[at] += w
            at = parent[at]
    return wins, leaves


def _pick(run_dir: Path, n: int, whole_groups: bool = False) -> list[CreditGroup]:
    """The newest ``n`` sampled trajectories with segments, in their groups (``whole_groups``: whole
    groups until at least ``n``)."""
    out: list[CreditGroup] = []
    taken = 0
    for f in reversed(read_samples(run_dir)):  # newest first
        for g in f.groups:
            kept = [s for s in g.samples if s.segments][: None if whole_groups else max(n - taken, 0)]
            if kept and taken < n:
                out.append(CreditGroup(id=g.id, samples=kept))
                taken += len(kept)
    return out


def ablate(
    run_dir: str | Path,
    *,
    checkpoint: str | None = None,
    trajectories: int = 4,
    k: int = 4,
    seed: int | None = None,
    siblings: bool = False,
) -> dict[str, Any]:
    """Monte Carlo segment contributions vs assigned credit; returns a JSON-able report. The replays are
    sampled with ``seed`` (None: the run's own ``seed``); ``siblings``: no replays, each branching
    segment of the sampled tree groups is compared with its siblings instead (module docstring)."""
    run = Path(run_dir)
    if not (run / "config.yaml").is_file():
        raise UserError(f"{str(run)!r} is not a run directory (no config.yaml)")
    if trajectories < 1 or k < 1:
        raise UserError("--trajectories and --k must be >= 1")
    cfg = load_config(run / "config.yaml")
    groups = _pick(run, trajectories, whole_groups=siblings)
    samples = [s for g in groups for s in g.samples]
    report: dict[str, Any] = {"run": str(run), "strategy": cfg.credit.strategy, "trajectories": len(samples)}
    if siblings:
        if not cfg.rollout.tree.enabled:
            raise UserError(
                f"--siblings needs tree groups, and {str(run)!r} was run without rollout.tree.enabled; "
                "leave --siblings out to replay the segments instead"
            )
        rows, lonely = sibling_rows(groups)
        report.update(
            policy="recorded tree groups", counterfactual="siblings", k=0, episodes=0, unbranched=lonely
        )
    else:
        policy, which = load_policy(run, checkpoint)
        rows, episodes = _replay_rows(cfg, policy, samples, k, cfg.seed if seed is None else seed)
        report.update(policy=which, counterfactual="replay", k=k, episodes=episodes)
    rho = _rho([r["contribution"] for r in rows], [r["credit"] for r in rows])
    report.update(segments=len(rows), spearman=rho, rows=rows)
    with_v = [r for r in rows if r["v_before"] is not None]
    if len(with_v) >= 2 and not siblings:
        report["value_vs_mc_spearman"] = _rho(
            [r["v_before"] for r in with_v], [r["p_before"] for r in with_v]
        )
    return report


def _rho(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of ``a`` and ``b``; ``None`` where it is undefined (a constant column)."""
    rho = spearman(torch.tensor(a), torch.tensor(b)) if a else float("nan")
    return None if math.isnan(rho) else rho


def _replay_rows(
    cfg: RunConfig, policy: Policy, samples: list[CreditSample], k: int, seed: int
) -> tuple[list[dict[str, Any]], int]:
    """Replay every sample to each segment boundary and let the policy play on ``k`` times."""
    tasks, prefixes, owners = [], [], []
    for i, s in enumerate(samples):
        turns = [t.token_ids for t in s.trajectory.turns if t.role == "model"]
        for j in range(len(s.segments)):
            for _ in range(k):
                tasks.append(s.trajectory.task)
                prefixes.append(turns[:j])
                owners.append((i, j))
    trajs = asyncio.run(run_episodes(cfg, policy, tasks, seed=seed, prefixes=prefixes)) if tasks else []
    episodes = list({t.episode: t for t in trajs}.values())  # per-turn samples: one per episode
    wins: dict[tuple[int, int], list[float]] = {}
    for (i, j), t in zip(owners, episodes, strict=True):
        wins.setdefault((i, j), []).append(1.0 if t.outcome == "success" else 0.0)
    rows: list[dict[str, Any]] = []
    for i, s in enumerate(samples):
        n = len(s.segments)
        p = [sum(wins[(i, j)]) / len(wins[(i, j)]) for j in range(n)]
        p.append(1.0 if s.trajectory.outcome == "success" else 0.0)
        rows += [_row(s, j, p[j], p[j + 1]) for j in range(n)]
    return rows, len(trajs)


def _row(s: CreditSample, j: int, p_before: float, p_after: float, **extra: float) -> dict[str, Any]:
    """One judged segment (``j`` of ``s``): success before and after it, its contribution and its credit."""
    seg = s.segments[j]
    return {
        "trajectory": s.trajectory.id,
        "segment": j,
        "p_before": p_before,
        "p_after": p_after,
        "contribution": p_after - p_before,
        "credit": seg.credit,
        "v_before": seg.v_before,
        "outcome": s.trajectory.outcome,
        **extra,
    }


def render_ablation(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    sib = report["counterfactual"] == "siblings"
    how = "tree siblings" if sib else f"K={report['k']}"
    table = Table(
        title=f"counterfactual ablation — {report['strategy']}, {report['policy']}, "
        f"{report['trajectories']} trajectories × {how}"
    )
    before, after = ("p siblings", "p subtree") if sib else ("p before", "p after")
    for col in ("trajectory", "seg", before, after, "contribution", "assigned credit", "outcome"):
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
    if sib:
        console.print(f"segments without a sibling (not judged): {report['unbranched']}")
    if report.get("value_vs_mc_spearman") is not None:
        console.print(
            f"value model vs Monte Carlo success estimate (Spearman): {report['value_vs_mc_spearman']:+.3f}"
        )
