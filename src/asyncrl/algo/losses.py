"""Policy, value, KL-penalty and entropy losses.

Every loss returns ``(loss, metrics)``: ``loss`` is a differentiable 0-d tensor, ``metrics`` a
``dict[str, float]`` of detached python floats with namespaced keys (``loss/…``, ``policy/…``,
``kl/…``, ``value/…``, ``entropy/…``). All metrics of one call are transferred with a single
device synchronisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .advantages import _as_mask, _check_ndim, _check_same_shape, _float, masked_mean
from .config import AGG_MODES, POLICY_LOSS_KINDS, AggMode, PolicyLossConfig
from .kl import LOG_RATIO_CLAMP, KLKind, approx_kl, kl_estimate

__all__ = [
    "aggregate_loss",
    "entropy_loss",
    "kl_penalty_loss",
    "microbatch_weights",
    "policy_loss",
    "policy_loss_mask",
    "staleness_weight",
    "value_loss",
]


def _to_metrics(items: dict[str, torch.Tensor]) -> dict[str, float]:
    """Detach and convert 0-d tensors to python floats with one host transfer."""
    if not items:
        return {}
    vals = torch.stack([v.detach().to(torch.float32).reshape(()) for v in items.values()]).tolist()
    return {k: float(v) for k, v in zip(items.keys(), vals, strict=True)}


def aggregate_loss(
    loss_tok: torch.Tensor, mask: torch.Tensor, agg: AggMode, max_tokens: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss ``l [B, T]`` to a scalar.

    * ``"token_mean"``: ``Σ_{b,t} l·m / Σ_{b,t} m`` — every valid token in the batch has equal
      weight (DAPO, Yu et al. 2025, "token-level policy gradient loss").
    * ``"seq_mean_token_mean"``: ``mean_{b: n_b>0} ( Σ_t l·m / n_b )`` with ``n_b = Σ_t m`` —
      per-sequence token mean, then mean over the sequences that have at least one valid token
      (original GRPO, Shao et al. 2024).
    * ``"seq_mean_token_sum_norm"``: ``Σ_b Σ_t l·m / (B · L)`` with ``L = max_tokens`` (default
      ``T``) — a constant normaliser, free of length bias (Dr. GRPO, Liu et al. 2025). All ``B``
      rows count, including rows without valid tokens.

    Conventions: masked entries are removed with ``torch.where``; an all-zero mask gives ``0``
    with a zero (finite) gradient.

    Shapes: ``loss_tok``, ``mask``: ``[B, T]``. Returns a 0-d tensor.

    Raises:
        ValueError: unknown ``agg``, shape mismatch, or ``max_tokens < 1``.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown aggregation {agg!r}; allowed values: {', '.join(AGG_MODES)}")
    _check_ndim("loss_tok", loss_tok, 2)
    m = _as_mask(mask, loss_tok.shape)
    lt = torch.where(m, loss_tok, torch.zeros((), dtype=loss_tok.dtype, device=loss_tok.device))
    if agg == "token_mean":
        return lt.sum() / m.sum().clamp_min(1).to(lt.dtype)
    per_seq_sum = lt.sum(dim=1)
    if agg == "seq_mean_token_mean":
        n_tok = m.sum(dim=1)
        per_seq = per_seq_sum / n_tok.clamp_min(1).to(lt.dtype)  # empty rows are exactly 0
        n_seq = (n_tok > 0).sum()
        return per_seq.sum() / n_seq.clamp_min(1).to(lt.dtype)
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    batch, length = loss_tok.shape
    norm = max_tokens if max_tokens is not None else length
    return per_seq_sum.sum() / float(max(batch, 1) * max(norm, 1))


def microbatch_weights(masks: Sequence[torch.Tensor], agg: AggMode) -> list[float]:
    """Weights ``w_i`` that make micro-batch losses add up to the whole batch's loss.

    For a batch split by rows into micro-batches ``i`` with per-token losses ``l_i`` and masks
    ``m_i`` (any widths: padding columns hold no valid tokens),
    ``Σ_i w_i · aggregate_loss(l_i, m_i, agg) = aggregate_loss(l, m, agg)``, so accumulating the
    gradients of ``w_i · L_i`` gives the gradient of the whole batch (gradient accumulation):

    * ``token_mean``: ``w_i = n_i / Σ_j n_j`` with ``n_i = Σ m_i`` (valid tokens);
    * ``seq_mean_token_mean``: ``w_i = r_i / Σ_j r_j`` with ``r_i`` the rows of ``m_i`` holding at
      least one valid token;
    * ``seq_mean_token_sum_norm``: ``w_i = B_i / Σ_j B_j`` (rows), provided every micro-batch uses
      the same ``max_tokens`` (pass the whole batch's padded length when the config leaves it unset).

    Conventions: a micro-batch with nothing to count gets ``w_i = 0`` (its loss is 0 anyway); all
    zero when the whole batch has nothing to count. Masks are ``[B_i, T_i]``, bool or 0/1.

    Raises:
        ValueError: unknown ``agg`` or a mask that is not 2-D.
    """
    if agg not in AGG_MODES:
        raise ValueError(f"unknown aggregation {agg!r}; allowed values: {', '.join(AGG_MODES)}")
    counts: list[float] = []
    for i, mask in enumerate(masks):
        _check_ndim(f"masks[{i}]", mask, 2)
        m = mask if mask.dtype == torch.bool else mask != 0
        if agg == "token_mean":
            counts.append(float(m.sum()))
        elif agg == "seq_mean_token_mean":
            counts.append(float(m.any(dim=1).sum()))
        else:
            counts.append(float(m.shape[0]))
    total = sum(counts)
    return [c / total if total > 0 else 0.0 for c in counts]


def policy_loss_mask(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cfg: PolicyLossConfig
) -> torch.Tensor:
    """The tokens :func:`policy_loss` aggregates over: ``mask`` minus the divergence filter.

    With ``cfg.max_behaviour_divergence = δ`` and ``d = |logp − behaviour_logp|`` (detached; masked
    entries 0): ``"token"`` keeps tokens with ``d ≤ δ``, ``"sequence"`` keeps whole rows whose masked
    mean of ``d`` is ``≤ δ``. Without a filter it is ``mask`` as bool. Shapes: all ``[B, T]``.
    """
    m = _as_mask(mask, logp.shape)
    if cfg.max_behaviour_divergence is None:
        return m
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    lp = torch.where(m, _float(logp.detach()), zero)
    mu = torch.where(m, _float(behaviour_logp.detach()), zero)
    dev = (lp - mu).abs()
    if cfg.divergence_level == "token":
        return m & (dev <= cfg.max_behaviour_divergence)
    seq_dev = masked_mean(dev, m, dim=1)
    return m & (seq_dev <= cfg.max_behaviour_divergence).unsqueeze(1)


def staleness_weight(age: torch.Tensor, gamma: float) -> torch.Tensor:
    """Staleness discount ``w = gamma ** age`` for samples generated ``age`` policy versions ago.

    Not a verbatim published method: an exponential down-weighting of stale samples in the spirit
    of staleness-aware asynchronous SGD (Zhang et al. 2016, which divides the step by the
    staleness) and bounded-staleness asynchronous RL (AReaL, Fu et al. 2025, which bounds ``age``
    instead of weighting it). ``w = 1`` at ``age = 0`` and, for ``gamma < 1``, strictly decreasing in
    ``age``. ``gamma = 1`` disables it (``w ≡ 1``).

    Shapes: ``age`` any shape (integer or float version lags, must be ``>= 0``); returns a tensor of
    the same shape in ``age``'s float dtype (at least float32). Detached.

    Raises:
        ValueError: ``gamma`` outside ``(0, 1]`` or a negative age.
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    a = _float(age.detach())
    if a.numel() > 0 and bool((a < 0).any()):
        raise ValueError("age must be >= 0 everywhere")
    if gamma == 1.0:
        return torch.ones_like(a)
    return torch.exp(a * math.log(gamma))


def _ppo_clip_tokens(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (dual-)clipped PPO loss; returns (loss, clip_active, dual_clip_active)."""
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(pg1, pg2)
    clip_active = pg2 > pg1
    if dual_clip_c is None:
        return loss, clip_active, torch.zeros_like(clip_active)
    pg3 = -adv * dual_clip_c
    dual_active = (adv < 0) & (pg3 < loss)
    loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
    return loss, clip_active, dual_active


@dataclass(frozen=True)
class _KindInputs:
    """What every loss kind sees: ``lp`` log π_θ (with grad), ``mu`` behaviour log-probs and ``adv``
    advantages (masked positions 0), ``prox`` the raw proximal log-probs (``None`` unless given),
    ``rho = exp(clamp(lp − mu))``, ``m`` the bool mask, ``cfg`` the loss config. All ``[B, T]``."""

    lp: torch.Tensor
    mu: torch.Tensor
    prox: torch.Tensor | None
    adv: torch.Tensor
    rho: torch.Tensor
    m: torch.Tensor
    cfg: PolicyLossConfig


@dataclass(frozen=True)
class _KindTerms:
    """A kind's per-token loss ``tok`` (before the staleness weight) and what its metrics need."""

    tok: torch.Tensor
    clipped: torch.Tensor
    clip_active: torch.Tensor
    is_weight: torch.Tensor
    dual_active: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def _ppo_clip(x: _KindInputs) -> _KindTerms:
    """``l = max(−A·ρ, −A·clip(ρ, 1−eps_low, 1+eps_high))`` (dual clip: ``min(l, −c·A)`` where A < 0)."""
    c = x.cfg
    tok, clip_active, dual_active = _ppo_clip_tokens(x.rho, x.adv, c.eps_low, c.eps_high, c.dual_clip_c)
    clipped = (x.rho < 1.0 - c.eps_low) | (x.rho > 1.0 + c.eps_high)
    return _KindTerms(tok, clipped, clip_active, torch.ones_like(x.lp), dual_active)


def _decoupled_ppo(x: _KindInputs) -> _KindTerms:
    """``r = π_θ/π_prox``, ``v = sg(min(π_prox/μ, is_cap))``, ``l = v · ppo_clip(r)``."""
    c = x.cfg
    assert x.prox is not None  # validated by policy_loss
    prox = torch.where(
        x.m, x.prox.detach().to(x.lp.dtype), torch.zeros((), dtype=x.lp.dtype, device=x.lp.device)
    )
    r = torch.exp((x.lp - prox).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    is_weight = torch.exp((prox - x.mu).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=c.is_cap)
    inner, clip_active, dual_active = _ppo_clip_tokens(r, x.adv, c.eps_low, c.eps_high, c.dual_clip_c)
    clipped = (r < 1.0 - c.eps_low) | (r > 1.0 + c.eps_high)
    extra = {"kl/prox_k3": approx_kl(x.lp, prox, x.m)}
    return _KindTerms(is_weight * inner, clipped, clip_active, is_weight, dual_active, extra)


def _tis(x: _KindInputs) -> _KindTerms:
    """``l = −sg(min(ρ, is_cap)) · A · logp``."""
    raw = x.rho.detach()
    is_weight = raw.clamp(max=x.cfg.is_cap)
    clipped = raw > x.cfg.is_cap
    return _KindTerms(-is_weight * x.adv * x.lp, clipped, clipped, is_weight, torch.zeros_like(x.m))


def _cispo(x: _KindInputs) -> _KindTerms:
    """``l = −sg(clip(ρ, 1−cispo_eps_low, 1+cispo_eps_high)) · A · logp``."""
    raw = x.rho.detach()
    lo, hi = 1.0 - x.cfg.cispo_eps_low, 1.0 + x.cfg.cispo_eps_high
    is_weight = raw.clamp(lo, hi)
    clipped = (raw < lo) | (raw > hi)
    return _KindTerms(-is_weight * x.adv * x.lp, clipped, clipped, is_weight, torch.zeros_like(x.m))


def _reinforce(x: _KindInputs) -> _KindTerms:
    """``l = −A · logp``."""
    clipped = torch.zeros_like(x.m)
    return _KindTerms(-x.adv * x.lp, clipped, clipped, torch.ones_like(x.lp), torch.zeros_like(x.m))


_KIND_TERMS: dict[str, Callable[[_KindInputs], _KindTerms]] = {
    "ppo_clip": _ppo_clip,
    "decoupled_ppo": _decoupled_ppo,
    "tis": _tis,
    "cispo": _cispo,
    "reinforce": _reinforce,
}
"""One function per ``PolicyLossConfig.kind``; :func:`policy_loss` does everything they share."""


def _check_policy_inputs(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
    prox_logp: torch.Tensor | None,
    age: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`policy_loss`'s inputs checked; returns ``advantages`` broadcast to ``[B, T]``.

    Shapes: ``logp`` (requires grad), ``behaviour_logp``, ``mask``, ``prox_logp``: ``[B, T]``;
    ``advantages``: ``[B, T]`` or ``[B]`` (broadcast over tokens); ``age``: ``[B, T]`` or ``[B]``.

    Raises:
        ValueError: unknown ``cfg.kind``/``cfg.agg``, ``decoupled_ppo`` without ``prox_logp``,
            any shape mismatch, or a negative ``age``.
        TypeError: ``cfg`` is not a :class:`PolicyLossConfig`.
    """
    if not isinstance(cfg, PolicyLossConfig):
        raise TypeError(f"cfg must be a PolicyLossConfig, got {type(cfg).__name__}")
    if cfg.kind not in POLICY_LOSS_KINDS:
        raise ValueError(
            f"unknown policy loss kind {cfg.kind!r}; allowed values: {', '.join(POLICY_LOSS_KINDS)}"
        )
    if cfg.agg not in AGG_MODES:
        raise ValueError(f"unknown aggregation {cfg.agg!r}; allowed values: {', '.join(AGG_MODES)}")
    _check_ndim("logp", logp, 2)
    _check_same_shape("logp", logp, behaviour_logp=behaviour_logp, mask=mask)
    batch, length = logp.shape
    if advantages.shape == (batch,):
        advantages = advantages.unsqueeze(1).expand(batch, length)
    elif advantages.shape != logp.shape:
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected {tuple(logp.shape)} or ({batch},)"
        )
    if cfg.kind == "decoupled_ppo" and prox_logp is None:
        raise ValueError("kind='decoupled_ppo' requires prox_logp (log-probs under the proximal policy)")
    if prox_logp is not None:
        _check_same_shape("logp", logp, prox_logp=prox_logp)
    if age is not None and age.shape not in (logp.shape, torch.Size([batch])):
        raise ValueError(f"age has shape {tuple(age.shape)}; expected {tuple(logp.shape)} or ({batch},)")
    return advantages


def _token_age(age: torch.Tensor | None, lp: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per-token age ``[B, T]`` (a ``[B]`` age is broadcast; masked entries and ``None`` are 0)."""
    if age is None:
        return torch.zeros_like(lp)
    age_t = _float(age.detach()).to(lp.dtype)
    if age_t.dim() == 1:
        age_t = age_t.unsqueeze(1).expand_as(lp)
    return torch.where(m, age_t, torch.zeros((), dtype=lp.dtype, device=lp.device))


def _policy_metrics(
    loss: torch.Tensor,
    t: _KindTerms,
    lp: torch.Tensor,
    mu: torch.Tensor,
    rho: torch.Tensor,
    m: torch.Tensor,
    keep: torch.Tensor,
    w: torch.Tensor,
    age_t: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """:func:`policy_loss`'s metrics as 0-d tensors (one host sync later, as python floats):
    ``loss/policy``; ``policy/clip_frac`` (fraction of kept tokens whose
    clipped quantity — r for the PPO kinds, the IS weight for tis/cispo — was outside its bounds;
    0 for reinforce), ``policy/clip_frac_active`` (fraction where clipping changed the loss value,
    i.e. verl's ``pg_clipfrac``; equal to ``clip_frac`` for tis/cispo), ``policy/dual_clip_frac``,
    ``policy/ratio_mean``/``ratio_max``/``ratio_min`` (ρ = π_θ/μ over valid tokens),
    ``policy/is_weight_mean`` (mean detached IS weight; 1 for ppo_clip/reinforce),
    ``kl/behaviour_k3`` (:func:`approx_kl`, i.e. k3 estimate of KL(μ ‖ π_θ)), ``kl/prox_k3`` (decoupled_ppo only),
    ``policy/staleness_weight_mean``, ``policy/age_mean``, ``policy/masked_frac`` (fraction of
    valid tokens removed by the divergence filter) and ``policy/tokens`` (tokens in the loss).
    """
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    one = torch.ones((), dtype=lp.dtype, device=lp.device)
    n_valid = m.sum()
    any_valid = n_valid > 0
    rho_d = rho.detach()
    ratio_max = torch.where(any_valid, torch.where(m, rho_d, -torch.inf).max(), zero)
    ratio_min = torch.where(any_valid, torch.where(m, rho_d, torch.inf).min(), zero)
    items: dict[str, torch.Tensor] = {
        "loss/policy": loss.detach(),
        "policy/clip_frac": masked_mean(t.clipped, keep),
        "policy/clip_frac_active": masked_mean(t.clip_active, keep),
        "policy/dual_clip_frac": masked_mean(t.dual_active, keep),
        "policy/ratio_mean": masked_mean(rho_d, m),
        "policy/ratio_max": ratio_max,
        "policy/ratio_min": ratio_min,
        "policy/is_weight_mean": torch.where(any_valid, masked_mean(t.is_weight.detach(), m), one),
        "kl/behaviour_k3": approx_kl(lp, mu, m),
        "policy/staleness_weight_mean": torch.where(any_valid, masked_mean(w, m), one),
        "policy/age_mean": masked_mean(age_t, m),
        "policy/masked_frac": masked_mean(m & ~keep, m),
        "policy/tokens": keep.sum(),
    }
    items.update(t.extra)
    return items


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
    *,
    prox_logp: torch.Tensor | None = None,
    age: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Unified off-policy policy-gradient loss ``L = −J``, ``J = E_μ[ w · f(ρ) · A ]``.

    Notation (per token): ``ρ = π_θ/μ = exp(logp − behaviour_logp)`` with ``μ`` the behaviour
    policy that generated the token (the inference engine); ``A`` the advantage;
    ``w = cfg.staleness_gamma ** age`` the staleness weight. Per-token losses ``l`` (before ``w``):

    * ``ppo_clip`` — PPO, Schulman et al. 2017, with asymmetric bounds (DAPO clip-higher)::

          pg1 = −A·ρ,  pg2 = −A·clip(ρ, 1−eps_low, 1+eps_high),  l = max(pg1, pg2)

      With ``dual_clip_c = c`` (Ye et al. 2020): ``l = min(l, −c·A)`` where ``A < 0``.
    * ``decoupled_ppo`` — decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy
      optimization"), as used by AReaL (Fu et al. 2025). Requires ``prox_logp`` (log-probs of the
      proximal policy π_prox, usually recomputed by the trainer with the pre-update weights)::

          r = π_θ/π_prox,  v = sg(min(π_prox/μ, is_cap)),  l = v · max(−A·r, −A·clip(r, 1−eps_low, 1+eps_high))

      (dual clip applies to the inner term as above). This is also PPO + TIS of Yao et al. 2025.
    * ``tis`` — truncated importance sampling REINFORCE (Yao et al. 2025, "Your Efficient RL
      Framework Secretly Brings You Off-Policy RL Training"): ``l = −sg(min(ρ, is_cap)) · A · logp``.
    * ``cispo`` — MiniMax-M1 2025 (Clipped IS-weight Policy Optimisation):
      ``l = −sg(clip(ρ, 1−cispo_eps_low, 1+cispo_eps_high)) · A · logp`` (default: no lower bound,
      upper bound 5).
    * ``reinforce`` — on-policy REINFORCE (Williams 1992): ``l = −A · logp`` (ρ only in metrics).

    With ``ρ = 1`` and ``age = 0`` the gradients of ``ppo_clip``, ``tis`` and ``reinforce`` w.r.t.
    ``logp`` coincide (``−A`` per token before aggregation); the loss *values* differ.

    Pipeline and conventions:
        1. ``behaviour_logp``, ``prox_logp``, ``advantages`` and ``age`` are treated as data
           (detached). Masked positions of every input are replaced by 0 via ``torch.where``, so
           ``nan``/``±inf`` there never reach the loss or the gradient.
        2. Log-ratios are clamped to ``[−20, 20]`` before ``exp`` (gradients through the clamp are
           zero beyond it), so losses and gradients are finite for any finite log-probs.
        3. Optional divergence filter (``max_behaviour_divergence = δ``): with
           ``d = |logp − behaviour_logp|`` (detached), tokens with ``d > δ`` are dropped
           (``divergence_level="token"``) or whole sequences whose masked mean of ``d`` exceeds ``δ``
           (``"sequence"``).
        4. ``l ← w · l``; ``age`` is ``[B, T]`` (per token) or ``[B]`` (per sequence); ``None`` = 0.
        5. Aggregation over the remaining tokens with ``cfg.agg`` (see :func:`aggregate_loss`;
           an all-zero mask gives loss 0 with zero gradient).

    Shapes, errors: :func:`_check_policy_inputs`; metrics: :func:`_policy_metrics`.
    """
    advantages = _check_policy_inputs(logp, behaviour_logp, advantages, mask, cfg, prox_logp, age)
    m = _as_mask(mask, logp.shape)
    lp_full = _float(logp)
    dtype = lp_full.dtype
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    lp = torch.where(m, lp_full, zero)
    mu = torch.where(m, behaviour_logp.detach().to(dtype), zero)
    adv = torch.where(m, advantages.detach().to(dtype), zero)

    log_rho = (lp - mu).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho)

    age_t = _token_age(age, lp, m)
    w = staleness_weight(age_t, cfg.staleness_gamma).to(dtype)

    keep = policy_loss_mask(lp, mu, m, cfg)  # the divergence filter

    # The kind's per-token loss (one function per kind, see _KIND_TERMS), then the staleness weight.
    t = _KIND_TERMS[cfg.kind](_KindInputs(lp, mu, prox_logp, adv, rho, m, cfg))
    tok = w * t.tok
    loss = aggregate_loss(tok, keep, cfg.agg, cfg.max_tokens)

    with torch.no_grad():
        items = _policy_metrics(loss, t, lp, mu, rho, m, keep, w, age_t)
    return loss, _to_metrics(items)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped value loss (Schulman et al. 2017; OpenAI baselines ``ppo2``).

    Formula (per token, then masked token-mean over the batch)::

        v_clip = old_values + clip(values − old_values, −clip_eps, +clip_eps)
        l      = ½ · max( (values − R)², (v_clip − R)² )

    With ``clip_eps=None`` the loss is the plain ``½ (values − R)²``.

    Conventions: ``old_values`` and ``returns`` are detached; masked entries removed with
    ``torch.where``; empty mask → loss 0.

    Shapes: all ``[B, T]``. Returns ``(loss, metrics)`` with ``loss/value``, ``value/clip_frac``
    (fraction of valid tokens where the clipped term is strictly larger, verl's ``vf_clipfrac``),
    ``value/pred_mean`` and ``value/return_mean``.

    Raises:
        ValueError: shape mismatch or ``clip_eps <= 0``.
    """
    _check_ndim("values", values, 2)
    _check_same_shape("values", values, old_values=old_values, returns=returns, mask=mask)
    if clip_eps is not None and not clip_eps > 0:
        raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
    m = _as_mask(mask, values.shape)
    v = _float(values)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    v = torch.where(m, v, zero)
    v_old = torch.where(m, old_values.detach().to(v.dtype), zero)
    ret = torch.where(m, returns.detach().to(v.dtype), zero)
    l1 = (v - ret) ** 2
    if clip_eps is None:
        tok = 0.5 * l1
        clipped = torch.zeros_like(m)
    else:
        v_clip = v_old + (v - v_old).clamp(-clip_eps, clip_eps)
        l2 = (v_clip - ret) ** 2
        tok = 0.5 * torch.maximum(l1, l2)
        clipped = l2 > l1
    loss = aggregate_loss(tok, m, "token_mean")
    with torch.no_grad():
        items = {
            "loss/value": loss.detach(),
            "value/clip_frac": masked_mean(clipped, m),
            "value/pred_mean": masked_mean(v.detach(), m),
            "value/return_mean": masked_mean(ret, m),
        }
    return loss, _to_metrics(items)


def kl_penalty_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    kind: KLKind,
    agg: AggMode,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-to-reference penalty added to the loss (GRPO, Shao et al. 2024, uses ``k3``).

    Formula: ``L = coef · agg_t( k(logp_t, ref_logp_t) )`` with ``k`` one of the Schulman 2020
    estimators of :func:`asyncrl.algo.kl_estimate` (tokens sampled from π_θ, ``ref_logp`` detached)
    and ``agg`` as in :func:`aggregate_loss`.

    Shapes: ``[B, T]`` inputs. Returns ``(loss, metrics)`` with ``loss/kl`` (= ``L``),
    ``kl/ref_<kind>`` (the unscaled aggregated estimate) and ``kl/coef``.

    Raises:
        ValueError: unknown ``kind``/``agg``, shape mismatch, or negative ``coef``.
    """
    if not coef >= 0:
        raise ValueError(f"coef must be >= 0, got {coef}")
    _check_ndim("logp", logp, 2)
    per_tok = kl_estimate(logp, ref_logp.detach(), kind, mask)
    kl_val = aggregate_loss(per_tok, mask, agg, max_tokens)
    loss = coef * kl_val
    items = {
        "loss/kl": loss.detach(),
        f"kl/ref_{kind}": kl_val.detach(),
        "kl/coef": kl_val.new_tensor(float(coef)),
    }
    return loss, _to_metrics(items)


def entropy_loss(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    agg: AggMode,
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Entropy bonus expressed as a loss (Mnih et al. 2016 / PPO, Schulman et al. 2017).

    Formula: ``L = −coef · agg_t(H_t)`` with per-token entropies ``H`` (e.g. from
    :func:`asyncrl.policy.scoring.token_logprobs_and_entropy`), so minimising ``L`` maximises entropy for ``coef > 0``.

    Shapes: ``entropy``, ``mask``: ``[B, T]``. Returns ``(loss, metrics)`` with ``loss/entropy``
    and ``entropy/mean`` (masked token mean of ``H``, independent of ``agg``).

    Raises:
        ValueError: unknown ``agg`` or shape mismatch.
    """
    _check_ndim("entropy", entropy, 2)
    h = _float(entropy)
    agg_h = aggregate_loss(h, mask, agg, max_tokens)
    loss = -coef * agg_h
    with torch.no_grad():
        items = {"loss/entropy": loss.detach(), "entropy/mean": masked_mean(h.detach(), mask)}
    return loss, _to_metrics(items)
