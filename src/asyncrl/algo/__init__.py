"""Pure RL algorithm core of asyncrl: tensors and plain config in, tensors and metrics out.

This package imports only ``torch``, ``pydantic`` and the standard library (``typing``, ``math``)
— never another ``asyncrl`` module — and performs no I/O. Formulas, conventions and references
for every function are in ``docs/algorithms.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import AGG_MODES, POLICY_LOSS_KINDS, AggMode, PolicyLossConfig, PolicyLossKind

if TYPE_CHECKING:  # at run time these load with torch on first use (``__getattr__``)
    from .advantages import (
        GROUP_MODES,
        GroupMode,
        batch_mean_baseline,
        group_advantages,
        masked_mean,
    )
    from .kl import (
        KL_KINDS,
        LOG_RATIO_CLAMP,
        KLKind,
        approx_kl,
        kl_estimate,
        kl_mean,
    )
    from .losses import (
        aggregate_loss,
        entropy_loss,
        kl_penalty_loss,
        microbatch_weights,
        policy_loss,
        policy_loss_mask,
        staleness_weight,
        value_loss,
    )
    from .returns import gae, turn_level_gae
    from .segments import brier_score, roc_auc, spearman, turn_group_advantages, value_delta_credit
    from .tree import ancestor_matrix, spread_chains, tree_advantages, tree_values

__all__ = [
    "AGG_MODES",
    "GROUP_MODES",
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "POLICY_LOSS_KINDS",
    "AggMode",
    "GroupMode",
    "KLKind",
    "PolicyLossConfig",
    "PolicyLossKind",
    "aggregate_loss",
    "ancestor_matrix",
    "approx_kl",
    "batch_mean_baseline",
    "brier_score",
    "entropy_loss",
    "gae",
    "group_advantages",
    "kl_estimate",
    "kl_mean",
    "kl_penalty_loss",
    "masked_mean",
    "microbatch_weights",
    "policy_loss",
    "policy_loss_mask",
    "roc_auc",
    "spearman",
    "spread_chains",
    "staleness_weight",
    "tree_advantages",
    "tree_values",
    "turn_group_advantages",
    "turn_level_gae",
    "value_delta_credit",
    "value_loss",
]


def __getattr__(name: str) -> object:
    """The names of ``__all__`` computed with torch, loaded on first use: ``asyncrl.config`` reads only
    ``algo.config`` (pydantic), so the commands that compute nothing (``asyncrl --help``, ``config``,
    ``status``, ``stop``, ``cost``) start without importing torch (~1.5 s of CPU)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import advantages, kl, losses, returns, segments, tree

    for mod in (advantages, kl, losses, returns, segments, tree):
        globals().update((k, v) for k, v in vars(mod).items() if k in __all__)
    return globals()[name]
