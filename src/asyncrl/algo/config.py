"""Plain configuration for :func:`asyncrl.algo.policy_loss` (pydantic v2, no other asyncrl imports)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AGG_MODES", "POLICY_LOSS_KINDS", "AggMode", "PolicyLossConfig", "PolicyLossKind"]

PolicyLossKind = Literal["ppo_clip", "decoupled_ppo", "tis", "cispo", "reinforce"]
POLICY_LOSS_KINDS: tuple[str, ...] = ("ppo_clip", "decoupled_ppo", "tis", "cispo", "reinforce")
AggMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AGG_MODES: tuple[str, ...] = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


class PolicyLossConfig(BaseModel):
    """Configuration of the unified off-policy objective ``J = E_μ[w · f(ρ) · A]``.

    See :func:`asyncrl.algo.policy_loss` and ``docs/algorithms.md`` for the formulas. Unknown
    keys are rejected (``extra="forbid"``); every field is range-checked.
    """

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    kind: PolicyLossKind = "ppo_clip"
    """Objective ``f``: ``ppo_clip`` (PPO, Schulman et al. 2017), ``decoupled_ppo`` (Hilton et al.
    2021 / AReaL, needs ``prox_logp``), ``tis`` (truncated-IS REINFORCE, Yao et al. 2025),
    ``cispo`` (clipped-IS-weight REINFORCE, MiniMax-M1 2025) or ``reinforce`` (on-policy, ignores ρ)."""

    eps_low: float = Field(default=0.2, gt=0, lt=1)
    """Lower PPO clip: the ratio is clipped at ``1 − eps_low`` (ppo_clip, decoupled_ppo)."""

    eps_high: float = Field(default=0.28, gt=0, le=10)
    """Upper PPO clip: the ratio is clipped at ``1 + eps_high``. Default 0.28 is DAPO's
    "clip-higher" (Yu et al. 2025), decoupled from ``eps_low`` to leave room for low-probability
    tokens to grow; set 0.2 for symmetric PPO."""

    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual-clip constant ``c > 1`` (Ye et al. 2020, "Mastering Complex Control in MOBA Games"):
    for ``A < 0`` the per-token PPO loss is additionally bounded by ``−c·A``. ``None`` disables."""

    is_cap: float = Field(default=5.0, ge=1)
    """Truncation ``C`` of importance weights: ``min(ρ, C)`` for ``tis`` and ``min(π_prox/μ, C)``
    for ``decoupled_ppo`` (truncated, not masked; use ``max_behaviour_divergence`` to mask)."""

    cispo_eps_low: float = Field(default=1.0, gt=0, le=1)
    """CISPO lower bound: the IS weight is clipped below at ``1 − cispo_eps_low``. Default 1.0
    means no lower bound (MiniMax-M1 sets ε_low^IS large and only tunes ε_high^IS)."""

    cispo_eps_high: float = Field(default=4.0, gt=0)
    """CISPO upper bound: the IS weight is clipped above at ``1 + cispo_eps_high`` (default 5.0,
    matching ``is_cap``)."""

    staleness_gamma: float = Field(default=1.0, gt=0, le=1)
    """Per-token staleness discount ``w = staleness_gamma ** age`` where ``age`` is how many policy
    versions the sample is behind (trainer version minus its oldest token's). 1.0 disables staleness weighting."""

    max_behaviour_divergence: float | None = Field(default=None, gt=0)
    """If set, tokens with ``|logp − behaviour_logp| > max_behaviour_divergence`` (or whole
    sequences whose masked mean of that quantity exceeds it, see ``divergence_level``) are
    dropped from the loss. ``None`` disables."""

    divergence_level: Literal["token", "sequence"] = "token"
    """Granularity of the ``max_behaviour_divergence`` filter: per token or per sequence."""

    agg: AggMode = "token_mean"
    """Loss aggregation: ``token_mean`` (Σ l·m / Σ m over the batch, DAPO token-level),
    ``seq_mean_token_mean`` (mean over sequences of the per-sequence token mean, original GRPO) or
    ``seq_mean_token_sum_norm`` (mean over sequences of Σ_t l·m / max_tokens, Dr. GRPO)."""

    max_tokens: int | None = Field(default=None, ge=1)
    """Constant normaliser for ``seq_mean_token_sum_norm`` (Dr. GRPO: the generation budget).
    ``None`` uses the padded length ``T`` of the batch."""
