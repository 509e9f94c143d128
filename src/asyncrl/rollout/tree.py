"""Tree groups: one task rolled out as a tree of episodes that branch at turn boundaries.

A flat group plays ``group_size`` independent episodes of a task. A tree group (``rollout.tree``)
starts ``roots`` independent episodes, then grows round by round: it picks *branch points* — the
state after model turn ``k`` of an episode it already has — and starts ``branch − 1`` new episodes
from each. A new episode restores the state by **replaying** the prefix's ``k`` model turns into
a fresh environment (the actions are re-executed; the environment's tools run again and are
counted as ``tree_replayed_turns``), then samples on from there. Replayed turns keep the log-probs
and version they were sampled with and are marked ``shared``: context in the new episode, trained
once, in the episode that sampled them. The leaves of one round run concurrently, so the engine
batches them and prefills their shared prefix together.

Non-deterministic tools: if a replayed step's observation differs from the original's, the new
episode's token prefix differs, so it does not pass through the original's nodes — tree credit
(:mod:`asyncrl.credit.tree`, which finds nodes by token prefix) treats it as a separate branch,
never as evidence about a state it did not visit. Such replays are counted (``replay_diverged``).
Slow tools make replay cost wall time; an environment may make it cheap by being deterministic
and fast to reset, which the built-in ones are.

Branch points (``rollout.tree.points``): ``every_turn`` takes the shallowest untried nodes first,
``first_k`` only nodes after the first ``first_k`` turns, ``entropy`` the nodes whose next turn
was sampled with the highest mean surprisal ``−log p`` (an unbiased estimate of the policy's
entropy there: where the policy was least sure, a branch is most informative).

Budget (``rollout.tree.budget``): ``leaves`` — exactly ``group_size`` episodes, as a flat group;
``tokens`` — episodes until the generated (not replayed) tokens reach ``group_size`` × the roots'
mean, at most :meth:`~asyncrl.config.RolloutConfig.tree_max_leaves` episodes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asyncrl.config import TreeConfig
from asyncrl.records import Trajectory, TreeStats, Turn

LeafRunner = Callable[[list[Turn]], Awaitable[Trajectory]]
"""Plays one episode that first replays the given model turns (``[]``: a fresh root episode)."""


@dataclass(frozen=True)
class BranchPoint:
    """The state after model turn ``k`` (1-based) of ``leaf``; ``score`` orders the candidates."""

    leaf: Trajectory
    k: int
    key: str
    score: float

    def prefix(self) -> list[Turn]:
        return model_turns(self.leaf)[: self.k]


def model_turns(traj: Trajectory) -> list[Turn]:
    return [t for t in traj.turns if t.role == "model"]


def branch_points(leaf: Trajectory) -> list[BranchPoint]:
    """Every state after a model turn of ``leaf`` from which the episode went on (``1 ≤ k < L``),
    keyed by :meth:`~asyncrl.records.Trajectory.state_keys` of the token prefix up to the next model
    turn (the key tree credit gives that node), scored by that turn's mean surprisal."""
    turns, starts = model_turns(leaf), [start for start, _ in leaf.segments()]
    keys = leaf.state_keys(starts[1:])
    return [BranchPoint(leaf, k, key, _surprisal(turns[k].logprobs or [])) for k, key in enumerate(keys, 1)]


def _surprisal(lp: list[float]) -> float:
    return -sum(lp) / len(lp) if lp else 0.0


def choose_points(leaves: list[Trajectory], cfg: TreeConfig, tried: set[str], n: int) -> list[BranchPoint]:
    """Up to ``n`` untried branch points by ``cfg.points`` (one per distinct state)."""
    cands: dict[str, BranchPoint] = {}
    for leaf in leaves:
        for p in branch_points(leaf):
            if p.key not in tried and p.key not in cands and (cfg.points != "first_k" or p.k <= cfg.first_k):
                cands[p.key] = p
    if cfg.points == "entropy":
        ranked = sorted(cands.values(), key=lambda p: -p.score)
    else:  # shallowest first; ties in the order the episodes finished
        ranked = sorted(cands.values(), key=lambda p: p.k)
    return ranked[:n]


def mark_replayed(child: Trajectory, prefix: list[Turn], parent: Trajectory) -> bool:
    """Give the child's replayed turns their original log-probs and version and mark them shared.

    Returns whether the replay reproduced the parent's token prefix (deterministic tools)."""
    for turn, orig in zip(model_turns(child), prefix, strict=False):
        turn.logprobs, turn.version, turn.shared = orig.logprobs, orig.version, True
    child.reward_components["tree_replayed_turns"] = float(len(prefix))
    starts = [start for start, _ in parent.segments()]  # the prefix: tokens before model turn k + 1
    n = starts[len(prefix)] if len(prefix) < len(starts) else None
    return child.token_ids()[:n] == parent.token_ids()[:n]


async def grow_tree(
    run_leaf: LeafRunner, cfg: TreeConfig, group_size: int, max_leaves: int
) -> tuple[list[Trajectory], TreeStats]:
    """Play one tree group; returns its finished episodes (the leaves) and what it took."""
    stats = TreeStats(roots=min(cfg.roots, group_size))
    leaves = list(await asyncio.gather(*(run_leaf([]) for _ in range(stats.roots))))
    target_tokens = group_size * (sum(t.num_model_tokens() for t in leaves) / max(1, len(leaves)))

    def remaining() -> int:
        """Episodes still to start."""
        if cfg.budget == "leaves":
            return group_size - len(leaves)
        made = sum(t.num_model_tokens() for t in leaves)
        per = max(1.0, made / max(1, len(leaves)))  # over-estimates a branch: the next round tops up
        return max(0, min(math.ceil(max(0.0, target_tokens - made) / per), max_leaves - len(leaves)))

    tried: set[str] = set()
    while (want := remaining()) > 0:
        stats.rounds += 1
        points = choose_points(leaves, cfg, tried, math.ceil(want / (cfg.branch - 1)))
        # branches first (their children bring new points next round); nothing to branch: fresh roots
        starts: list[BranchPoint | None] = [p for p in points for _ in range(cfg.branch - 1)]
        starts = starts[:want]
        if not starts:
            starts = [None] * want
        tried.update(p.key for p in points)
        stats.branch_points += len(points)
        children = await asyncio.gather(*(run_leaf(p.prefix() if p else []) for p in starts))
        for child, p in zip(children, starts, strict=True):
            if p is not None:
                stats.replayed_turns += p.k
                stats.replay_diverged += not mark_replayed(child, p.prefix(), p.leaf)
            else:
                stats.roots += 1
        leaves.extend(children)
    return leaves, stats
