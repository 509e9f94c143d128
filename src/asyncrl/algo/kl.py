"""KL estimators and trust-region diagnostics.

Conventions shared by this module:

* ``logp`` is the log-probability of the *sampled* token under the distribution the sample was
  drawn from (for a KL penalty: the current policy π_θ), ``ref_logp`` under the other one.
* Log-ratios that enter an ``exp`` are clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]``
  (``±20``) so that every estimate and gradient stays finite for extreme log-probabilities.
* Masks are ``bool`` or ``{0, 1}``; masked positions are removed with ``torch.where`` so that
  ``nan``/``inf`` stored there are harmless.
"""

from __future__ import annotations

from typing import Literal

import torch

from .advantages import _as_mask, _check_same_shape, _float, masked_mean

__all__ = [
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "KLKind",
    "approx_kl",
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
