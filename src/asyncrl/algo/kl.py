"""KL estimators, KL-coefficient controllers, entropy and trust-region diagnostics.

Conventions shared by this module:

* ``logp`` is the log-probability of the *sampled* token under the distribution the sample was
  drawn from (for a KL penalty: the current policy π_θ), ``ref_logp`` under the other one.
* Log-ratios that enter an ``exp`` are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]``
  (``±20``) so that every estimate and gradient stays finite for extreme log-probabilities.
* Masks are ``bool`` or ``{0, 1}``; masked positions are removed with ``torch.where`` so that
  ``nan``/``inf`` stored there are harmless.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from .advantages import _as_mask, _check_same_shape, _float, masked_mean

__all__ = [
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "AdaptiveKLController",
    "FixedKLController",
    "KLKind",
    "approx_kl",
    "clip_fraction",
    "entropy_from_logits",
    "kl_estimate",
    "kl_mean",
]

KLKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")
LOG_RATIO_CLAMP = 20.0
"""Bound applied to log-ratios before exponentiation (``exp(20) ≈ 4.9e8``)."""


def kl_estimate(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    kind: KLKind,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token Monte-Carlo estimators of ``KL(π ‖ π_ref)`` for tokens sampled from ``π``.

    Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html).
    With ``log r = ref_logp − logp`` (``r = π_ref/π``, samples ``x ~ π``):

    * ``"k1"``: ``−log r = logp − ref_logp`` — unbiased, high variance, can be negative.
    * ``"k2"``: ``½ (log r)² = ½ (logp − ref_logp)²`` — biased, low variance, always ``≥ 0``.
    * ``"k3"``: ``(r − 1) − log r = exp(ref_logp − logp) − (ref_logp − logp) − 1`` — unbiased,
      low variance, always ``≥ 0`` (the GRPO KL penalty; verl ``low_var_kl`` before its clamp).

    Conventions: for ``k3`` the log-ratio is clamped to ``[−20, 20]`` before ``exp`` (gradient is
    zero beyond the clamp). If ``mask`` is given, masked positions are exactly ``0`` (and have zero
    gradient). Autograd-transparent in both arguments.

    Shapes: ``logp``, ``ref_logp`` (and ``mask``): any identical shape, usually ``[B, T]``.
    Returns the per-token estimate with the same shape (dtype at least float32).

    Raises:
        ValueError: unknown ``kind`` or shape mismatch.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator kind {kind!r}; allowed values: {', '.join(KL_KINDS)}")
    _check_same_shape("logp", logp, ref_logp=ref_logp)
    lp = _float(logp)
    ref = _float(ref_logp)
    m: torch.Tensor | None = None
    if mask is not None:
        m = _as_mask(mask, logp.shape)
        zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
        lp = torch.where(m, lp, zero)
        ref = torch.where(m, ref.to(lp.dtype), zero)
    diff = lp - ref
    if kind == "k1":
        out = diff
    elif kind == "k2":
        out = 0.5 * diff**2
    else:
        log_r = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        out = torch.exp(log_r) - log_r - 1.0
    if m is not None:
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def kl_mean(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind, mask: torch.Tensor) -> torch.Tensor:
    """Masked token-mean of :func:`kl_estimate`: ``Σ_t m_t k(t) / Σ_t m_t`` (``0`` if no valid token).

    Conventions and the estimators' definitions (Schulman 2020) are those of :func:`kl_estimate`.
    Shapes: ``[B, T]`` inputs; returns a 0-d tensor (autograd-transparent).
    """
    return masked_mean(kl_estimate(logp, ref_logp, kind, mask), mask)


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Approximate ``KL(π_old ‖ π_θ)`` on tokens sampled from ``π_old`` (for ``target_kl`` early stop).

    Formula (k3 of Schulman 2020, with ``log ρ = logp − old_logp`` clamped to ``[−20, 20]``)::

        approx_kl = masked_mean( exp(log ρ) − 1 − log ρ )

    This is the ``approx_kl`` of OpenAI Spinning Up / Stable-Baselines3 PPO used to stop the
    epoch loop when it exceeds ``1.5 · target_kl``; it equals ``kl_estimate(old_logp, logp, "k3")``.

    Shapes: ``logp``, ``old_logp``, ``mask``: ``[B, T]``. Returns a detached 0-d tensor
    (``0`` when the mask is empty).
    """
    with torch.no_grad():
        return kl_mean(old_logp.detach(), logp.detach(), "k3", mask)


def clip_fraction(ratio: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float) -> torch.Tensor:
    """Fraction of valid tokens whose ratio lies outside the trust region ``[1 − eps_low, 1 + eps_high]``.

    Formula: ``masked_mean( 1[ρ < 1 − eps_low] + 1[ρ > 1 + eps_high] )``. This is the
    sign-agnostic PPO ``clipfrac`` diagnostic of OpenAI baselines / SB3 (Schulman et al. 2017),
    with asymmetric bounds for DAPO clip-higher. Boundary values count as inside.

    Shapes: ``ratio``, ``mask``: ``[B, T]``. Returns a detached 0-d tensor in ``ratio``'s float dtype
    (``0`` for an empty mask).
    """
    _check_same_shape("ratio", ratio, mask=mask)
    with torch.no_grad():
        r = _float(ratio.detach())
        outside = (r < 1.0 - eps_low) | (r > 1.0 + eps_high)
        return masked_mean(outside.to(r.dtype), mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` along the last axis.

    Formula: ``H = −Σ_v p_v log p_v`` with ``log p = logits − logsumexp(logits)`` (computed via
    ``log_softmax``, numerically stable for any finite scale of logits).

    Conventions: vocabulary entries with logit ``−inf`` (masked vocabulary) have ``p = 0`` and
    contribute exactly ``0`` to the value and the gradient (no ``0·(−inf) = nan``). Each row needs
    at least one finite logit. Autograd-transparent; the result has the logits' float dtype (at
    least float32). Memory is ``O(B·T·V)``: chunk over ``T`` for very large vocabularies.
    Reference: the policy entropy monitored / used as a bonus in A3C (Mnih et al. 2016) and PPO
    (Schulman et al. 2017).

    Shapes: ``logits`` ``[B, T, V]`` (any ``[..., V]``). Returns ``[B, T]`` (``[...]``).
    """
    if logits.dim() < 1:
        raise ValueError("logits must have at least one dimension (the vocabulary axis)")
    z = _float(logits)
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    safe_logp = torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(p * safe_logp).sum(dim=-1)


class AdaptiveKLController:
    """Adaptive KL-penalty coefficient of Ziegler et al. 2019 ("Fine-Tuning Language Models from
    Human Preferences").

    Update rule (``update(current_kl, n_steps)``)::

        e     = clip(current_kl / target − 1, −0.2, 0.2)
        mult  = 1 + e · n_steps / horizon
        value ← value · mult

    so the coefficient grows when the measured KL exceeds ``target`` and shrinks otherwise, at a
    rate of at most 20 % per ``horizon`` steps. As in the paper, ``mult`` is not floored: keep
    ``n_steps < 5 · horizon`` per call so that it stays positive.

    Args:
        init_coef: initial coefficient (``>= 0``).
        target: target KL per sample/token, in the same unit as ``current_kl`` (``> 0``).
        horizon: number of steps over which the proportional correction acts (``> 0``).
    """

    def __init__(self, init_coef: float, target: float, horizon: float) -> None:
        if not (math.isfinite(init_coef) and init_coef >= 0):
            raise ValueError(f"init_coef must be finite and >= 0, got {init_coef}")
        if not (math.isfinite(target) and target > 0):
            raise ValueError(f"target must be finite and > 0, got {target}")
        if not (math.isfinite(horizon) and horizon > 0):
            raise ValueError(f"horizon must be finite and > 0, got {horizon}")
        self.value: float = float(init_coef)
        self.target: float = float(target)
        self.horizon: float = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Apply one Ziegler et al. 2019 update with the measured ``current_kl`` over ``n_steps``."""
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        kl = float(current_kl)
        if not math.isfinite(kl):
            raise ValueError(f"current_kl must be finite, got {kl}")
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        mult = 1.0 + proportional_error * n_steps / self.horizon
        self.value *= mult


class FixedKLController:
    """Constant KL-penalty coefficient (Ziegler et al. 2019's non-adaptive baseline).

    ``value`` never changes; ``update`` exists for interface parity with
    :class:`AdaptiveKLController` and ignores its arguments.
    """

    def __init__(self, coef: float) -> None:
        if not (math.isfinite(coef) and coef >= 0):
            raise ValueError(f"coef must be finite and >= 0, got {coef}")
        self.value: float = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (the coefficient is fixed)."""
        del current_kl, n_steps
