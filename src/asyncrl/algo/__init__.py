"""Pure RL algorithm core of asyncrl: tensors and plain config in, tensors and metrics out.

This package imports only ``torch``, ``pydantic`` and the standard library (``typing``, ``math``,
``importlib``) — never another ``asyncrl`` module — and performs no I/O. Formulas, conventions and
references for every function are in ``docs/algorithms.md``.

The names computed with torch load on first use (PEP 562 ``__getattr__``): ``asyncrl.config`` reads
only ``algo.config`` (pydantic), so the commands that compute nothing (``asyncrl --help``, ``config``,
``status``, ``stop``, ``cost``) start without importing torch (~1.5 s of CPU). :data:`LAZY` is the
one list of them, name -> module; ``__all__`` and ``__getattr__`` are built from it. mypy reads no
table, so the ``TYPE_CHECKING`` block names them again for it (``tests/test_algo.py`` checks that the
three agree).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .config import AGG_MODES as AGG_MODES
from .config import POLICY_LOSS_KINDS as POLICY_LOSS_KINDS
from .config import AggMode as AggMode
from .config import PolicyLossConfig as PolicyLossConfig
from .config import PolicyLossKind as PolicyLossKind

LAZY: dict[str, str] = {  # name -> the module of this package that defines it
    "GroupMode": "advantages",
    "batch_mean_baseline": "advantages",
    "group_advantages": "advantages",
    "masked_mean": "advantages",
    "approx_kl": "kl",
    "kl_estimate": "kl",
    "kl_mean": "kl",
    "aggregate_loss": "losses",
    "entropy_loss": "losses",
    "kl_penalty_loss": "losses",
    "microbatch_weights": "losses",
    "policy_loss": "losses",
    "policy_loss_mask": "losses",
    "staleness_weight": "losses",
    "value_loss": "losses",
    "gae": "returns",
    "turn_level_gae": "returns",
    "brier_score": "segments",
    "roc_auc": "segments",
    "spearman": "segments",
    "turn_group_advantages": "segments",
    "value_delta_credit": "segments",
    "spread_chains": "tree",
    "tree_advantages": "tree",
    "tree_values": "tree",
}

if TYPE_CHECKING:  # for mypy only (``X as X`` re-exports); at run time :data:`LAZY` serves these
    from .advantages import GroupMode as GroupMode
    from .advantages import batch_mean_baseline as batch_mean_baseline
    from .advantages import group_advantages as group_advantages
    from .advantages import masked_mean as masked_mean
    from .kl import approx_kl as approx_kl
    from .kl import kl_estimate as kl_estimate
    from .kl import kl_mean as kl_mean
    from .losses import aggregate_loss as aggregate_loss
    from .losses import entropy_loss as entropy_loss
    from .losses import kl_penalty_loss as kl_penalty_loss
    from .losses import microbatch_weights as microbatch_weights
    from .losses import policy_loss as policy_loss
    from .losses import policy_loss_mask as policy_loss_mask
    from .losses import staleness_weight as staleness_weight
    from .losses import value_loss as value_loss
    from .returns import gae as gae
    from .returns import turn_level_gae as turn_level_gae
    from .segments import brier_score as brier_score
    from .segments import roc_auc as roc_auc
    from .segments import spearman as spearman
    from .segments import turn_group_advantages as turn_group_advantages
    from .segments import value_delta_credit as value_delta_credit
    from .tree import spread_chains as spread_chains
    from .tree import tree_advantages as tree_advantages
    from .tree import tree_values as tree_values
else:  # mypy reads only a literal ``__all__`` (one it cannot read would hide every name above)
    __all__ = ["AGG_MODES", "POLICY_LOSS_KINDS", "AggMode", "PolicyLossConfig", "PolicyLossKind", *LAZY]


def __getattr__(name: str) -> object:
    """The name of :data:`LAZY`, loaded (with its module, and torch) on first use and kept."""
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = vars(importlib.import_module(f".{LAZY[name]}", __name__))[name]
    globals()[name] = value
    return value
