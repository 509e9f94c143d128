"""Generalised advantage estimation (per token and per turn) with multi-turn masking.

Multi-turn agent trajectories interleave model tokens (trainable, ``mask = 1``) with tool /
environment tokens (``mask = 0``). Following verl's multi-turn GAE convention, masked positions
are *skipped*: the backward recursion runs over the valid positions only, as if the masked
positions had been deleted from the sequence. Their rewards and values never influence any
advantage, and the outputs at masked positions are ``0``.

All outputs are computed under ``torch.no_grad`` (they are regression targets / advantages).
"""

from __future__ import annotations

import torch

from .advantages import _as_mask, _check_ndim, _check_same_shape, _float

__all__ = ["gae", "turn_level_gae"]


def _check_unit_interval(name: str, v: float) -> None:
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v}")


def _masked_gae_scan(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Backward GAE recursion over the valid positions of each row (inputs already validated)."""
    batch, length = rewards.shape
    zero = torch.zeros(batch, dtype=rewards.dtype, device=rewards.device)
    next_value = zero
    last_gae = zero
    out: list[torch.Tensor] = []
    for t in range(length - 1, -1, -1):
        m_t = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + (gamma * lam) * last_gae
        # where (not multiply): nan/inf stored at masked positions can never leak.
        last_gae = torch.where(m_t, gae_t, last_gae)
        next_value = torch.where(m_t, values[:, t], next_value)
        out.append(torch.where(m_t, last_gae, zero))
    out.reverse()
    if not out:
        return torch.zeros_like(rewards)
    return torch.stack(out, dim=1)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation with masked (skipped) positions.

    Reproduces GAE(γ, λ) of Schulman et al. 2016 ("High-Dimensional Continuous Control Using
    Generalized Advantage Estimation"), with verl's multi-turn mask convention.

    For each row, let ``t_1 < t_2 < … < t_n`` be the positions with ``mask != 0`` and
    ``next(t_k) = t_{k+1}`` (``V(next(t_n)) := 0``: the value after the last valid position is 0,
    i.e. the trajectory terminates; there is no bootstrap). Then::

        δ_t  = r_t + γ · V(next(t)) − V(t)
        A_t  = δ_t + γλ · A_{next(t)}          (A after the last valid position is 0)
        R_t  = A_t + V(t)                       (λ-return, the value target)

    Conventions:
        * Masked positions (tool/env tokens) are skipped: the running ``V_next`` and
          ``lastgaelam`` carry over them unchanged, so their rewards and values never affect
          any advantage (even ``nan``/``inf`` there is harmless). Put a turn's reward on one of
          its *valid* tokens (usually the last model token); rewards on masked tokens are dropped.
        * ``advantages`` and ``returns`` are ``0`` at masked positions.
        * Outputs are detached (computed under ``torch.no_grad``), dtype at least float32.

    Shapes: ``rewards``, ``values``, ``mask``: ``[B, T]``. Returns ``(advantages, returns)``,
    both ``[B, T]``. ``gamma`` and ``lam`` must lie in ``[0, 1]``.
    """
    _check_ndim("rewards", rewards, 2)
    _check_same_shape("rewards", rewards, values=values, mask=mask)
    _check_unit_interval("gamma", gamma)
    _check_unit_interval("lam", lam)
    m = _as_mask(mask, rewards.shape)
    with torch.no_grad():
        dtype = torch.promote_types(_float(rewards).dtype, _float(values).dtype)
        r = rewards.detach().to(dtype)
        v = values.detach().to(dtype)
        adv = _masked_gae_scan(r, v, m, gamma, lam)
        ret = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, ret


def turn_level_gae(
    turn_rewards: torch.Tensor,
    turn_values: torch.Tensor,
    turn_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over agent *turns* instead of tokens (turn-level credit assignment).

    Each trajectory is treated as an MDP whose actions are whole turns: ``turn_rewards[b, k]`` is
    the reward received after turn ``k``, ``turn_values[b, k]`` the critic's value of the state
    before turn ``k``. The recursion, conventions and outputs are exactly those of :func:`gae`
    (Schulman et al. 2016) with the turn axis in place of the token axis::

        δ_k = r_k + γ V_{next(k)} − V_k,   A_k = δ_k + γλ A_{next(k)},   R_k = A_k + V_k

    ``turn_mask = 0`` marks padding turns (trajectories with fewer than ``K`` turns) or turns
    excluded from training; they are skipped, and their outputs are ``0``. This is the
    high-level (utterance) critic of hierarchical agent RL such as ArCHer (Zhou et al. 2024) and
    the turn-level GAE of RAGEN-style multi-turn trainers.

    Shapes: ``turn_rewards``, ``turn_values``, ``turn_mask``: ``[B, K]``. Returns
    ``(advantages [B, K], returns [B, K])``, detached.
    """
    _check_ndim("turn_rewards", turn_rewards, 2)
    _check_same_shape("turn_rewards", turn_rewards, turn_values=turn_values, turn_mask=turn_mask)
    return gae(turn_rewards, turn_values, turn_mask, gamma, lam)
