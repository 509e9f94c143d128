"""Segment-level credit assignment and value-model calibration (pure tensor maths).

A *segment* is one model turn plus the observation it caused. Functions here work on
``[B, K]`` tensors (``B`` trajectories, ``K`` segments at most, ``seg_mask`` marks real
segments) or on flat ``[N]`` tensors of steps; none of them imports a model or reads a file.
"""

from __future__ import annotations

import torch

from .advantages import GroupMode, _as_mask, _check_ndim, _check_same_shape, _float, group_advantages

__all__ = ["brier_score", "roc_auc", "spearman", "turn_group_advantages", "value_delta_credit"]


def value_delta_credit(
    v_before: torch.Tensor,
    v_after: torch.Tensor,
    target: torch.Tensor,
    seg_mask: torch.Tensor,
    eps: float,
    min_ratio: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Value-delta segment credit, rescaled to sum to ``target`` (the seed documents' attribution).

    For trajectory ``b`` with real segments ``k = 1..n_b`` (``seg_mask``)::

        d_k = V(after k) − V(before k)                 raw credit: change in estimated success
        S   = Σ_k d_k,   L = Σ_k |d_k|
        c_k = target · d_k / S                         if |S| ≥ max(eps, min_ratio · L) and S·target > 0
        c_k = target / n_b                             otherwise (the guard: uniform, = outcome credit)

    so that ``Σ_k c_k = target`` exactly in both cases. The guard covers (a) a raw sum near zero
    (the value model saw no net change, so ``target / S`` would explode), (b) deltas that mostly
    cancel (``|S| < min_ratio · L``; this bounds ``|c_k| ≤ |target| / min_ratio``) and (c) a raw
    sum whose sign disagrees with ``target`` (rescaling would flip every credit). When the
    terminal ``V(after n_b)`` is the observed outcome, ``S = outcome − V(before 1)``: a value
    baseline advantage.

    Conventions: padded segments (``seg_mask = 0``) get ``0`` and never enter ``S`` or ``L``;
    a row without segments gets zeros; ``target = 0`` gives all-zero credits. Detached output.
    ``eps`` and ``min_ratio`` are ``credit.value_delta_eps`` and ``credit.value_delta_min_ratio``.

    Shapes: ``v_before``, ``v_after``, ``seg_mask``: ``[B, K]``; ``target``: ``[B]``.
    Returns ``(credits [B, K], metrics)`` with ``credit/guard_frac`` (share of the rows with
    segments and ``target ≠ 0`` that fell back to uniform) and ``credit/raw_sum_mean`` (mean ``S``
    of those rows).
    """
    _check_ndim("v_before", v_before, 2)
    _check_same_shape("v_before", v_before, v_after=v_after, seg_mask=seg_mask)
    _check_ndim("target", target, 1)
    if target.shape[0] != v_before.shape[0]:
        raise ValueError(f"target has {target.shape[0]} rows, v_before has {v_before.shape[0]}")
    if eps < 0 or min_ratio < 0:
        raise ValueError(f"eps and min_ratio must be >= 0, got {eps}, {min_ratio}")
    m = _as_mask(seg_mask, v_before.shape)
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float32)
        d = torch.where(m, _float(v_after.detach()) - _float(v_before.detach()), zero)
        tgt = _float(target.detach())
        n = m.sum(1)
        s = d.sum(1)
        big = d.abs().sum(1)
        ok = (s.abs() >= torch.clamp(big * min_ratio, min=eps)) & (s * tgt > 0)
        scaled = d * (tgt / torch.where(ok, s, torch.ones_like(s))).unsqueeze(1)
        uniform = (tgt / n.clamp_min(1)).unsqueeze(1).expand_as(d)
        credits = torch.where(m, torch.where(ok.unsqueeze(1), scaled, uniform), zero)
        has = (n > 0) & (tgt != 0)  # rows with something to distribute
        guard = (~ok & has).float()
        rows = float(has.sum())
        metrics = {
            "credit/guard_frac": float(guard.sum()) / rows if rows else 0.0,
            "credit/raw_sum_mean": float(s[has].mean()) if rows else 0.0,
        }
    return credits, metrics


def turn_group_advantages(
    episode_adv: torch.Tensor,
    step_returns: torch.Tensor,
    state_ids: torch.Tensor,
    mode: GroupMode,
    weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO-style step-relative advantages (Feng et al. 2025, "Group-in-Group Policy Optimization").

    Steps (model turns) of all trajectories of a task group that start from an *identical* state
    (``state_ids`` equal; the caller hashes the exact context before the turn) form a step group
    ``s``. Each step gets its episode advantage plus a step-relative one::

        A_j = A^E_{traj(j)} + ω · A^S_j,    A^S = group_advantages(G, state_ids, mode)

    where ``G_j`` is the step's return (the caller's discounted reward-to-go) and
    ``group_advantages`` is the GRPO / Dr.GRPO / RLOO normalisation within a step group
    (:func:`asyncrl.algo.group_advantages`: singleton and constant step groups get ``A^S = 0``,
    so a step whose state no other step shares keeps its episode advantage).

    Shapes: ``episode_adv``, ``step_returns``, ``state_ids``: ``[N]`` (one entry per step; the
    state ids must already be unique across task groups). Returns ``(adv [N], metrics)`` with
    ``credit/step_groups``, ``credit/step_group_size_mean``, ``credit/step_frac_singleton`` and
    ``credit/step_adv_std``. Detached.
    """
    _check_ndim("episode_adv", episode_adv, 1)
    _check_same_shape("episode_adv", episode_adv, step_returns=step_returns, state_ids=state_ids)
    step_adv, gm = group_advantages(step_returns, state_ids, mode)
    with torch.no_grad():
        out = _float(episode_adv.detach()) + weight * step_adv
    return out, {
        "credit/step_groups": gm["group/count"],
        "credit/step_group_size_mean": gm["group/size_mean"],
        "credit/step_frac_singleton": gm["group/frac_singleton"],
        "credit/step_adv_std": gm["adv/std"],
    }


def brier_score(prob: torch.Tensor, label: torch.Tensor) -> float:
    """Brier score ``mean_i (p_i − y_i)²`` of probabilities ``p`` for binary labels ``y`` (0 if empty).

    Brier 1950; lower is better, a constant 0.5 forecast scores 0.25. Shapes ``[N]``.
    """
    _check_ndim("prob", prob, 1)
    _check_same_shape("prob", prob, label=label)
    if prob.numel() == 0:
        return 0.0
    return float(((_float(prob.detach()) - _float(label.detach())) ** 2).mean())


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``x`` with ties given their average rank."""
    x = _float(x.detach())
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(1, x.numel() + 1, dtype=x.dtype)
    uniq, inv = torch.unique(x, return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=x.dtype).index_add(0, inv, ranks)
    counts = torch.zeros(uniq.numel(), dtype=x.dtype).index_add(0, inv, torch.ones_like(x))
    return (sums / counts)[inv]


def roc_auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve (Mann–Whitney U / (n₊ n₋)), ties counted one half.

    ``AUC = (Σ_{i: y_i=1} rank(s_i) − n₊(n₊+1)/2) / (n₊ n₋)`` with average ranks for ties
    (Hanley & McNeil 1982). Returns ``nan`` when only one class is present (undefined).
    Shapes ``[N]``; any non-zero label is positive.
    """
    _check_ndim("score", score, 1)
    _check_same_shape("score", score, label=label)
    pos = label.detach() != 0
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = _ranks(score)
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation: Pearson correlation of the average ranks of ``x`` and ``y``.

    Returns ``nan`` when fewer than two entries are given or either side is constant.
    Shapes ``[N]``.
    """
    _check_ndim("x", x, 1)
    _check_same_shape("x", x, y=y)
    if x.numel() < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float(rx.norm() * ry.norm())
    return float((rx * ry).sum()) / den if den > 0 else float("nan")
