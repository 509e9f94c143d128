"""Credit from a rollout tree: Monte-Carlo success probability per node (pure tensor maths).

A *tree group* is one task rolled out as a tree: the root is the task, each edge is one
*segment* (a model turn plus the observation it caused) and at chosen turn boundaries a node
branches into several children that continue the same conversation. Every leaf is a finished
episode with an outcome. Because the leaves below a node all share its prefix, their mean
outcome *measures* the probability that the task still succeeds from that node — no learned
value model is needed (VinePPO's Monte-Carlo values; Tree-GRPO's step-level tree advantages;
the seed documents' "看每一段之后，剩余任务的成功概率变化").

A forest of trees is passed flat: node ``i`` has ``parent[i] < i`` (``-1`` for a root), so the
arrays are in topological order and several trees (groups) can share one call.
"""

from __future__ import annotations

import torch

from .advantages import GROUP_MODES, GroupMode, _check_ndim, _float

__all__ = ["ancestor_matrix", "spread_chains", "tree_advantages", "tree_values"]


def _check_forest(parent: torch.Tensor) -> None:
    _check_ndim("parent", parent, 1)
    if parent.dtype.is_floating_point or parent.dtype == torch.bool:
        raise ValueError(f"parent must be an integer tensor, got dtype {parent.dtype}")
    n = parent.numel()
    if n and bool((parent >= torch.arange(n, device=parent.device)).any()):
        raise ValueError("parent[i] must be < i (nodes in topological order, -1 for a root)")
    if n and bool((parent < -1).any()):
        raise ValueError("parent[i] must be -1 (a root) or the index of an earlier node")


def ancestor_matrix(parent: torch.Tensor) -> torch.Tensor:
    """``M[a, n] = True`` iff node ``a`` is ``n`` or one of its ancestors. Shape ``[N, N]`` bool.

    Built by walking every node up one level per iteration (``depth`` tensor operations).
    """
    _check_forest(parent)
    n = parent.numel()
    idx = torch.arange(n, device=parent.device)
    m = torch.eye(n, dtype=torch.bool, device=parent.device)
    cur = parent.clone()
    while bool((cur >= 0).any()):
        live = cur >= 0
        m[cur[live], idx[live]] = True
        cur = torch.where(live, parent[cur.clamp_min(0)], cur)
    return m


def tree_values(
    parent: torch.Tensor, outcome: torch.Tensor, leaf_weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte-Carlo node values ``V`` and each node's root index.

    ``V(n) = Σ_{ℓ ≤ n} w_ℓ · R_ℓ / Σ_{ℓ ≤ n} w_ℓ`` over the leaves ``ℓ`` in ``n``'s subtree
    (``w = leaf_weight``: ``1`` for a leaf whose outcome counts, ``0`` for inner nodes and for
    leaves left out, e.g. truncated episodes). A node with no weighted leaf below it carries no
    evidence and inherits its parent's value (a root with none gets ``0``), so its segment
    advantage is exactly ``0``.

    Shapes: all ``[N]``. Returns ``(V [N], root [N] long)``. Detached.
    """
    _check_forest(parent)
    for name, x in (("outcome", outcome), ("leaf_weight", leaf_weight)):
        if x.shape != parent.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)} but parent has {tuple(parent.shape)}")
    if bool((leaf_weight < 0).any()):
        raise ValueError("leaf_weight must be >= 0")
    with torch.no_grad():
        m = ancestor_matrix(parent).to(torch.float32)
        w = _float(leaf_weight.detach())
        r = _float(outcome.detach())
        mass = m @ w
        total = m @ (w * r)
        own = torch.where(mass > 0, total / mass.clamp_min(1e-30), torch.zeros_like(total))
        # the value of a node without evidence is its deepest evidenced ancestor's (or 0)
        depth = m.sum(0)
        evidenced = m.T.bool() & (mass > 0).unsqueeze(0)  # [n, a]: a ≤ n and a has leaves
        nearest = torch.where(evidenced, depth.unsqueeze(0), -1.0).argmax(1)
        v = torch.where(evidenced.any(1), own[nearest], torch.zeros_like(own))
        root = torch.where(m.T.bool() & (parent < 0).unsqueeze(0), 1, 0).argmax(1)
    return v, root


def tree_advantages(
    parent: torch.Tensor,
    outcome: torch.Tensor,
    leaf_weight: torch.Tensor,
    mode: GroupMode,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """Segment advantages from a tree, and the group-relative outcome advantage of each leaf.

    With ``V`` from :func:`tree_values`, ``T(n)`` the tree of node ``n`` and ``L_T`` its weighted
    leaves (``n_T`` of them, outcomes ``R``, mean ``V(root)``, unbiased std ``σ_T``)::

        s_T      = 1 / (σ_T + eps)      mode "grpo"
                 = 1                    mode "dr_grpo"
                 = n_T / (n_T − 1)      mode "rloo"
        seg(n)   = s_T · (V(n) − V(parent(n)))          the segment into n; 0 at a root
        out(ℓ)   = s_T · (R_ℓ − V(root))                 a weighted leaf; 0 for any other node

    ``out`` is exactly :func:`~asyncrl.algo.advantages.group_advantages` over each tree's
    weighted leaves, and the segment advantages telescope to it along every root→leaf path:
    ``Σ_{n on path to ℓ} seg(n) = out(ℓ)``. Tree credit therefore only *redistributes* the
    outcome advantage among a path's segments — a segment earns what it changed the measured
    success probability by, and the path still sums to the GRPO signal.

    Conventions (as ``group_advantages``): a tree with fewer than two weighted leaves, or whose
    weighted outcomes are all equal, gets all-zero ``seg`` and ``out``; a singleton branch
    (one child) gets ``seg = 0`` unless leaves end at the parent itself; outputs are detached.

    Shapes: all ``[N]``. Returns ``(seg [N], out [N], V [N], metrics)``; metrics
    ``tree/count``, ``tree/leaves_mean``, ``tree/informative_frac`` (share of non-root segments
    with ``seg ≠ 0``) and ``tree/value_root_mean``.
    """
    if mode not in GROUP_MODES:
        raise ValueError(f"unknown group advantage mode {mode!r}; allowed values: {', '.join(GROUP_MODES)}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    v, root = tree_values(parent, outcome, leaf_weight)
    with torch.no_grad():
        r = _float(outcome.detach())
        w = _float(leaf_weight.detach())
        leaf = w > 0
        n_t = torch.zeros_like(r).index_add(0, root, leaf.to(r.dtype))[root]
        dev = torch.where(leaf, r - v[root], torch.zeros_like(r))
        var = torch.zeros_like(r).index_add(0, root, dev**2)[root] / (n_t - 1).clamp_min(1)
        scale = _scale(mode, var.sqrt(), n_t, eps)
        spread = torch.zeros_like(r).index_add(0, root, dev.abs())[root]
        live = (n_t >= 2) & (spread > 0)
        scale = torch.where(live, scale, torch.zeros_like(scale))
        up = torch.where(parent >= 0, v[parent.clamp_min(0)], v)
        seg = scale * (v - up)
        out = torch.where(leaf, scale * dev, torch.zeros_like(r))
        inner = parent >= 0
        is_root = ~inner
        metrics = {
            "tree/count": float(is_root.sum()),
            "tree/leaves_mean": float(leaf.sum()) / max(1, int(is_root.sum())),
            "tree/informative_frac": float((seg[inner] != 0).float().mean()) if bool(inner.any()) else 0.0,
            "tree/value_root_mean": float(v[is_root].mean()) if bool(is_root.any()) else 0.0,
        }
    return seg, out, v, metrics


def spread_chains(parent: torch.Tensor, seg: torch.Tensor, leaf_weight: torch.Tensor) -> torch.Tensor:
    """Share each unbranched chain's credit equally among its segments.

    A node is *pass-through* when it is not a root, not a weighted leaf and has exactly one
    child. A chain is a maximal run ``c → … → b`` whose inner nodes are all pass-through: its top
    ``c`` hangs off a root or a branching node. Every node of a chain has the same Monte-Carlo
    value (the same leaves lie below), so :func:`tree_advantages` gives the whole change
    ``V(b) − V(parent(c))`` to the chain's first segment and ``0`` to the rest — which turn of
    an unbranched run caused it cannot be measured. This spreads it evenly instead::

        spread(n) = seg(top(n)) / |chain(top(n))|

    Sums along every root→leaf path are unchanged. A flat group (a root with one unbranched
    path per leaf) then gives each of a leaf's ``L`` segments ``out(ℓ) / L``.

    Shapes: all ``[N]``. Returns ``spread [N]`` (0 at roots). Detached.
    """
    _check_forest(parent)
    with torch.no_grad():
        n = parent.numel()
        is_root = parent < 0
        kids = torch.zeros(n, dtype=torch.long, device=parent.device).index_add(
            0, parent[~is_root], torch.ones(int((~is_root).sum()), dtype=torch.long, device=parent.device)
        )
        passing = ~is_root & (leaf_weight <= 0) & (kids == 1)
        m = ancestor_matrix(parent)
        depth = m.sum(0)
        # top(n): the deepest non-root ancestor-or-self whose parent does not pass through
        starts = ~is_root & ~passing[parent.clamp_min(0)]
        cand = m.T & starts.unsqueeze(0)  # [n, a]
        top = torch.where(cand, depth.unsqueeze(0), -1).argmax(1)
        length = torch.zeros(n, dtype=torch.long, device=parent.device).index_add(
            0, top[~is_root], torch.ones(int((~is_root).sum()), dtype=torch.long, device=parent.device)
        )
        out = seg.detach()[top] / length[top].clamp_min(1).to(seg.dtype)
        return torch.where(is_root, torch.zeros_like(out), out)


def _scale(mode: GroupMode, std: torch.Tensor, n: torch.Tensor, eps: float) -> torch.Tensor:
    if mode == "grpo":
        return 1.0 / (std + eps)
    if mode == "dr_grpo":
        return torch.ones_like(std)
    return n / (n - 1).clamp_min(1)
