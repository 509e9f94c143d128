"""Tree credit: a group's trajectories as a tree of conversation states, credited by measured success.

A *node* is a conversation state at a segment boundary inside one group: the exact token prefix
up to the end of a segment (a model turn and the observation it caused). Episodes that branch
from a shared prefix (``rollout.tree``) replay the same tokens, so they pass through the same
nodes; an unbranched group is a root with one chain per trajectory. Each trajectory's last
segment ends in a leaf of its own (keyed by the trajectory id), whose outcome is its final reward.

Segment ``k`` of trajectory ``i`` (``L_i`` segments) gets::

    A_{i,k} = L_i · spread(node_{i,k}) + α (G_k − Ḡ)

with ``spread`` from :func:`asyncrl.algo.tree.spread_chains` over
:func:`asyncrl.algo.tree.tree_advantages` (mode ``credit.baseline``; ``batch_mean`` counts as
``dr_grpo`` within each tree) and the process term as in ``value_delta``. The ``L_i`` factor makes
the per-token scale that of outcome credit: on an unbranched group every segment gets ``out(i)``,
exactly the ``outcome`` strategy; where the tree branches, a segment earns the change in measured
success probability it caused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from asyncrl.algo import spread_chains, tree_advantages
from asyncrl.algo.advantages import GroupMode
from asyncrl.records import Group, Trajectory

Span = tuple[int, int, int, float]


class TreeIndex:
    """The forest of one batch: node ids per segment, ``parent``, ``outcome`` and ``leaf_weight``."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.parent: list[int] = []
        self.outcome: list[float] = []
        self.weight: list[float] = []

    def node(self, key: str, parent: int) -> int:
        if key not in self.ids:
            self.ids[key] = len(self.parent)
            self.parent.append(parent)
            self.outcome.append(0.0)
            self.weight.append(0.0)
        return self.ids[key]

    def add(self, group: int, traj: Trajectory, spans: list[Span]) -> list[int]:
        """Register ``traj``'s path (a member of the batch's ``group``-th group) and return the node of
        each of its segments."""
        here = self.node(f"root:{group}", -1)
        keys = traj.state_keys([end for _, _, end, _ in spans])
        path = []
        for k, key in enumerate(keys):
            here = self.node(f"leaf:{traj.id}" if k == len(keys) - 1 else key, here)
            path.append(here)
        if path:
            self.outcome[path[-1]] = traj.final_reward
            self.weight[path[-1]] = 1.0
        return path


class TreeCredit(NamedTuple):
    advantages: list[list[float]]
    """``L_i · spread(node_{i,k})`` per segment (the process term is the caller's)."""
    values: list[list[tuple[float, float]]]
    """``(V(parent), V(node))`` per segment: the measured success probability before and after it."""
    metrics: dict[str, float]


def tree_segment_advantages(groups: Sequence[Group], spans: list[list[Span]], mode: GroupMode) -> TreeCredit:
    """Tree credit of every segment of a batch (``spans``: per member, group by group), its
    Monte-Carlo values and ``tree/`` metrics."""
    index = TreeIndex()
    rows = [(g, t) for g, group in enumerate(groups) for t in group.members]
    paths = [index.add(g, t, sp) for (g, t), sp in zip(rows, spans, strict=True)]
    if not index.parent:
        return TreeCredit([[] for _ in spans], [[] for _ in spans], {})
    parent = torch.tensor(index.parent, dtype=torch.long)
    weight = torch.tensor(index.weight)
    seg, _, v, metrics = tree_advantages(parent, torch.tensor(index.outcome), weight, mode)
    spread = spread_chains(parent, seg, weight).tolist()
    kids = torch.zeros(len(index.parent), dtype=torch.long).index_add(
        0, parent.clamp_min(0), (parent >= 0).long()
    )
    metrics["tree/branch_nodes"] = float(((kids > 1) & (parent >= 0)).sum())
    vals = v.tolist()
    return TreeCredit(
        [[len(path) * spread[n] for n in path] for path in paths],
        [[(vals[index.parent[n]], vals[n]) for n in path] for path in paths],
        metrics,
    )
