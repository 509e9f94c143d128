"""Outcome-reward baselines, group-relative advantages and masked normalisation.

Everything here is a pure function of tensors: no I/O, no global state, no other ``asyncrl``
module. Masks are ``bool`` or numeric ``{0, 1}`` tensors; any non-zero entry counts as valid.
Masked statistics use ``torch.where`` (never multiplication), so ``nan``/``inf`` stored at
masked positions cannot leak into the result.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "GROUP_MODES",
    "GroupMode",
    "batch_mean_baseline",
    "group_advantages",
    "masked_mean",
]

GroupMode = Literal["grpo", "dr_grpo", "rloo"]
GROUP_MODES: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")


# --------------------------------------------------------------------------- helpers (package-private)


def _float(x: torch.Tensor) -> torch.Tensor:
    """Return ``x`` as a floating tensor of at least float32 precision (autograd-transparent)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _as_mask(mask: torch.Tensor, shape: torch.Size, name: str = "mask") -> torch.Tensor:
    """Validate ``mask`` against ``shape`` and return it as a ``bool`` tensor."""
    if mask.shape != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def _check_ndim(name: str, x: torch.Tensor, ndim: int) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")


def _check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}")


# --------------------------------------------------------------------------- masked statistics


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is non-zero.

    Formula: ``mean = Σ_i x_i·m_i / Σ_i m_i`` (over all elements, or along ``dim``).

    Conventions:
        * ``mask`` must have the same shape as ``x``; it is converted to ``bool``.
        * Masked entries are removed with ``torch.where`` so ``nan``/``inf`` there are harmless,
          and gradients to masked entries are exactly zero.
        * An empty selection (``Σ m = 0``) yields ``0`` (not ``nan``) and a zero gradient.

    Shapes: ``x``, ``mask``: any identical shape. Returns a 0-d tensor (``dim=None``) or ``x``
    reduced along ``dim``. Non-floating ``x`` (e.g. bool indicators) is promoted to float32.
    Reference: the masked token mean of PPO-for-LLM implementations (TRL / verl ``masked_mean``).
    """
    m = _as_mask(mask, x.shape)
    xf = _float(x)
    xs = torch.where(m, xf, torch.zeros((), dtype=xf.dtype, device=xf.device))
    if dim is None:
        return xs.sum() / m.sum().clamp_min(1).to(xf.dtype)
    return xs.sum(dim) / m.sum(dim).clamp_min(1).to(xf.dtype)


# --------------------------------------------------------------------------- outcome-level baselines


_GROUP_METRIC_KEYS: tuple[str, ...] = (
    "adv/mean",
    "adv/std",
    "adv/min",
    "adv/max",
    "reward/mean",
    "reward/std",
    "group/count",
    "group/size_mean",
    "group/frac_constant",
    "group/frac_singleton",
)
"""Metric keys :func:`group_advantages` returns (zeros for an empty batch)."""


def _check_group_inputs(rewards: torch.Tensor, group_ids: torch.Tensor, mode: str, eps: float) -> None:
    """The ``Raises`` of :func:`group_advantages`."""
    if mode not in GROUP_MODES:
        raise ValueError(f"unknown group advantage mode {mode!r}; allowed values: {', '.join(GROUP_MODES)}")
    _check_ndim("rewards", rewards, 1)
    _check_ndim("group_ids", group_ids, 1)
    if rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)} but group_ids has shape {tuple(group_ids.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def _group_metrics(
    adv: torch.Tensor, r: torch.Tensor, count: torch.Tensor, constant_g: torch.Tensor
) -> dict[str, float]:
    """The metrics :func:`group_advantages` documents, in one host sync."""
    stats = torch.stack(
        [
            adv.mean(),
            adv.std(unbiased=False),
            adv.min(),
            adv.max(),
            r.mean(),
            r.std(unbiased=False),
            torch.tensor(float(count.numel()), dtype=r.dtype, device=r.device),
            count.mean(),
            constant_g.to(r.dtype).mean(),
            (count == 1).to(r.dtype).mean(),
        ]
    ).tolist()
    return {k: float(v) for k, v in zip(_GROUP_METRIC_KEYS, stats, strict=True)}


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mode: GroupMode,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative outcome advantages (one scalar per sample).

    Let ``g`` be the group of sample ``i`` (all samples sharing ``group_ids[i]``, typically the
    ``n`` rollouts of one prompt), ``n_g`` its size, ``mean_g`` its mean reward and ``std_g`` its
    *unbiased* (``n_g − 1``) standard deviation.

    * ``"grpo"`` — GRPO, Shao et al. 2024 (DeepSeekMath):
      ``A_i = (r_i − mean_g) / (std_g + eps)``. ``eps`` is added to the std (not the variance),
      as in verl; TRL uses the same placement with ``eps = 1e-4``.
    * ``"dr_grpo"`` — Dr. GRPO, Liu et al. 2025 ("Understanding R1-Zero-Like Training"):
      ``A_i = r_i − mean_g`` (no std division; removes the question-difficulty bias).
    * ``"rloo"`` — RLOO, Ahmadian et al. 2024 ("Back to Basics"):
      ``A_i = r_i − (Σ_{j∈g, j≠i} r_j) / (n_g − 1)`` (leave-one-out mean of the *other* samples),
      which equals ``n_g/(n_g − 1) · (r_i − mean_g)``.

    Conventions:
        * Singleton groups (``n_g = 1``) get advantage exactly ``0`` in every mode (no baseline
          can be formed; the unbiased std is undefined).
        * Groups whose rewards are all equal (``max == min``) get exactly ``0`` in every mode.
          Mathematically this is already the case; the explicit rule prevents round-off in
          ``mean_g`` from being amplified by ``1/(std_g + eps)`` into ``O(0.01)`` advantages.
        * Group ids need not be contiguous or sorted; any integer values work.
        * The output is detached (advantages are data, not part of the graph).

    Shapes: ``rewards`` ``[N]`` floating, ``group_ids`` ``[N]`` integer. Returns ``(adv [N], metrics)``.
    Metrics: ``adv/mean``, ``adv/std`` (population), ``adv/min``, ``adv/max``, ``reward/mean``,
    ``reward/std`` (population), ``group/count``, ``group/size_mean``, ``group/frac_constant``
    (fraction of groups with zero reward spread, singletons included — the groups DAPO's dynamic
    sampling would drop) and ``group/frac_singleton``.

    Raises:
        ValueError: unknown ``mode``, non-1-D inputs, length mismatch, non-integer ``group_ids``,
            or negative ``eps``.
    """
    _check_group_inputs(rewards, group_ids, mode, eps)
    with torch.no_grad():
        r = _float(rewards.detach())
        n_total = r.numel()
        if n_total == 0:
            empty_metrics = {k: 0.0 for k in _GROUP_METRIC_KEYS}
            return r.clone(), empty_metrics

        uniq, inv = torch.unique(group_ids, return_inverse=True)
        n_groups = uniq.numel()
        zeros_g = torch.zeros(n_groups, dtype=r.dtype, device=r.device)
        count = zeros_g.index_add(0, inv, torch.ones_like(r))
        sums = zeros_g.index_add(0, inv, r)
        mean = sums / count  # every group has >= 1 member
        gmax = torch.full_like(zeros_g, float("-inf")).scatter_reduce(0, inv, r, reduce="amax")
        gmin = torch.full_like(zeros_g, float("inf")).scatter_reduce(0, inv, r, reduce="amin")
        constant_g = gmax == gmin  # includes singletons
        n_i = count[inv]
        centered = r - mean[inv]

        if mode == "grpo":
            var = zeros_g.index_add(0, inv, centered**2) / (count - 1).clamp_min(1)
            adv = centered / (var.sqrt()[inv] + eps)
        elif mode == "dr_grpo":
            adv = centered
        else:  # rloo
            adv = r - (sums[inv] - r) / (n_i - 1).clamp_min(1)

        adv = torch.where(constant_g[inv], torch.zeros_like(adv), adv)

        metrics = _group_metrics(adv, r, count, constant_g)
    return adv, metrics


def batch_mean_baseline(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a batch-mean baseline: ``A_i = r_i − mean_j r_j``.

    The classic variance-reduction baseline of Williams 1992 (REINFORCE) with the baseline set
    to the mean reward of the current batch (as in e.g. ReMax/REINFORCE++ style baselines).
    Unlike :func:`group_advantages` it ignores prompt grouping.

    Shapes: ``rewards`` any shape (typically ``[N]``); the mean is over all elements and the
    result has the same shape. An empty tensor is returned unchanged. Output is detached.
    """
    r = _float(rewards.detach())
    if r.numel() == 0:
        return r.clone()
    return r - r.mean()
