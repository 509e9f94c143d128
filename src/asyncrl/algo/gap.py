"""The train–inference log-prob gap: how far the trainer's log-probs are from the sampler's.

The sampler (the rollout engine) records ``μ``'s log-prob of every token it draws; the trainer scores
the same tokens with its own forward, ``π``. When both ran the same weights, the two should be the same
number; what separates them is the numerics (kernels, reduction order, batch shapes, dtype), and it
makes a nominally on-policy run off-policy by that much (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"). Which tokens are comparable (sampled by the weights the
trainer holds) is the caller's mask.

Conventions: masks are ``bool`` or ``{0, 1}``; masked positions never enter a figure (``nan``/``inf``
there are harmless); a row with no valid token is not a sequence. Everything is computed in float64,
detached (a k3 of float32 gaps near 1e-6 is ``δ²/2 ≈ 1e-12``, below float32's resolution of ``exp(δ) − 1``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .advantages import _as_mask, _check_same_shape
from .kl import kl_estimate

__all__ = [
    "GAP_EDGES",
    "GAP_SEQUENCE_NATS",
    "GapTerms",
    "gap_histogram",
    "gap_metrics",
    "gap_terms",
    "histogram_quantile",
]

GAP_SEQUENCE_NATS = 0.1
"""A sequence whose summed log-prob differs by more than this many nats counts as ``sequences_over``."""

GAP_EDGES = torch.logspace(-9, 1, 1001, dtype=torch.float64)
"""Upper bin edges of :func:`gap_histogram` beside the bin of exact zeros: 10⁻⁹ … 10 nats, 100 bins a
decade (each edge 10^0.01 ≈ 1.0233× the last: a quantile read from the histogram is its bin's upper edge,
at most 2.33 % above the true value when that is ≥ 10⁻⁹)."""


class GapTerms(NamedTuple):
    """The per-token and per-sequence terms of a batch (flat, in row-major order of the valid tokens)."""

    token_abs: torch.Tensor
    """``|log π − log μ|`` per valid token, ``[N]``."""
    token_k3: torch.Tensor
    """The k3 estimate of ``KL(μ ‖ π)`` per valid token, ``[N]``."""
    seq_abs: torch.Tensor
    """``|Σ_t (log π − log μ)|`` per row with at least one valid token, ``[S]``."""


def gap_terms(behaviour_logp: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> GapTerms:
    """Per-token and per-sequence gap terms of ``[B, T]`` log-probs on the tokens of ``mask``.

    With ``δ_t = log π(x_t) − log μ(x_t)`` (``logp`` the trainer's, ``behaviour_logp`` the sampler's, for
    tokens ``x_t ~ μ``): ``token_abs = |δ_t|``; ``token_k3 = exp(δ_t) − 1 − δ_t`` (Schulman 2020's k3, an
    unbiased estimate of ``KL(μ ‖ π)`` on samples of ``μ``; :func:`~asyncrl.algo.kl_estimate` with
    ``δ`` clamped to ``[−20, 20]`` inside the ``exp``); ``seq_abs = |Σ_t m_t δ_t|`` for every row with
    ``Σ_t m_t > 0`` (the gap of the sequence's log-likelihood, which is what a sequence-level ratio sees).
    """
    _check_same_shape("logp", logp, behaviour_logp=behaviour_logp)
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    m = _as_mask(mask, logp.shape)
    with torch.no_grad():
        lp, mu = logp.detach().double(), behaviour_logp.detach().double()
        delta = torch.where(m, lp - mu, torch.zeros((), dtype=lp.dtype, device=lp.device))
        k3 = kl_estimate(mu, lp, "k3", m)
        rows = m.any(1)
        seq = delta.sum(1)
        return GapTerms(delta[m].abs(), k3[m], seq[rows].abs())


def gap_metrics(terms: GapTerms, threshold: float = GAP_SEQUENCE_NATS) -> dict[str, float]:
    """The gap figures of ``terms``: ``tokens`` (valid tokens ``N``), ``mean`` (``Σ|δ|/N``), ``p99``
    (nearest rank: the ``⌈0.99 N⌉``-th smallest ``|δ|``), ``max``, ``sequences`` (``S``),
    ``sequences_over`` (rows with ``seq_abs > threshold``), ``sequences_over_share`` (their share of
    ``S``, 0 when ``S = 0``) and ``k3`` (the token mean of ``token_k3``). All 0 when ``N = 0``."""
    n, s = int(terms.token_abs.numel()), int(terms.seq_abs.numel())
    over = int((terms.seq_abs > threshold).sum()) if s else 0
    out = {"tokens": float(n), "sequences": float(s), "sequences_over": float(over)}
    out["sequences_over_share"] = over / s if s else 0.0
    if n == 0:
        return out | {"mean": 0.0, "p99": 0.0, "max": 0.0, "k3": 0.0}
    d = terms.token_abs.double()
    rank = math.ceil(0.99 * n)
    return out | {
        "mean": float(d.mean()),
        "p99": float(torch.sort(d).values[rank - 1]),
        "max": float(d.max()),
        "k3": float(terms.token_k3.double().mean()),
    }


def gap_histogram(token_abs: torch.Tensor) -> torch.Tensor:
    """Counts of ``token_abs`` (``≥ 0``) in ``len(GAP_EDGES) + 2`` bins, ``[len(GAP_EDGES) + 2]`` int64:
    bin 0 holds the exact zeros (sampler and trainer bitwise equal), bin ``i ≥ 1`` the values in
    ``(GAP_EDGES[i−2], GAP_EDGES[i−1]]`` (bin 1: ``(0, 10⁻⁹]``), the last bin those above ``10`` nats.
    Histograms add up: the histogram of a concatenation is the sum of the histograms."""
    x = token_abs.detach().double().reshape(-1).cpu()
    idx = torch.bucketize(x, GAP_EDGES, right=False) + 1  # (e[i-1], e[i]] -> i + 1
    idx = torch.where(x <= 0, torch.zeros_like(idx), idx)
    return torch.bincount(idx, minlength=len(GAP_EDGES) + 2)


def histogram_quantile(counts: torch.Tensor, q: float) -> float:
    """The ``q``-quantile (nearest rank, as :func:`gap_metrics`) read from a :func:`gap_histogram`: the
    upper edge of the bin that holds the ``⌈q N⌉``-th smallest value (0 for the zero bin, ``inf`` for the
    bin above 10 nats, 0 when ``N = 0``). It is ≥ the exact quantile and at most one bin width above."""
    n = int(counts.sum())
    if n == 0:
        return 0.0
    rank = max(1, math.ceil(q * n))
    b = int(torch.searchsorted(torch.cumsum(counts, 0), torch.tensor(rank, dtype=counts.dtype)))
    if b == 0:
        return 0.0
    return math.inf if b > len(GAP_EDGES) else float(GAP_EDGES[b - 1])
