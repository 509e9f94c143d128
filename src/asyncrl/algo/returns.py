"""Generalised advantage estimation and discounted returns with multi-turn masking.

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

__all__ = ["broadcast_turn_values", "discounted_returns", "gae", "turn_level_gae"]


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


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Masked reward-to-go (Monte-Carlo return).

    Formula (over the valid positions of each row, same skipping rule as :func:`gae`)::

        G_t = r_t + γ · G_{next(t)},     G after the last valid position = 0

    This equals :func:`gae` with ``V ≡ 0`` and ``λ = 1``. It is the return used by REINFORCE
    (Williams 1992) with per-token / per-turn rewards.

    Conventions: rewards at masked positions are ignored and the recursion carries ``G`` over
    them; the output is ``0`` at masked positions; detached; dtype at least float32.

    Shapes: ``rewards``, ``mask``: ``[B, T]``. Returns ``[B, T]``. ``gamma`` in ``[0, 1]``.
    """
    _check_ndim("rewards", rewards, 2)
    _check_same_shape("rewards", rewards, mask=mask)
    _check_unit_interval("gamma", gamma)
    m = _as_mask(mask, rewards.shape)
    with torch.no_grad():
        r = _float(rewards.detach())
        return _masked_gae_scan(r, torch.zeros_like(r), m, gamma, 1.0)


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
    excluded from training; they are skipped, and their outputs are ``0``. Use
    :func:`broadcast_turn_values` to spread the per-turn advantages onto tokens. This is the
    high-level (utterance) critic of hierarchical agent RL such as ArCHer (Zhou et al. 2024) and
    the turn-level GAE of RAGEN-style multi-turn trainers.

    Shapes: ``turn_rewards``, ``turn_values``, ``turn_mask``: ``[B, K]``. Returns
    ``(advantages [B, K], returns [B, K])``, detached.
    """
    _check_ndim("turn_rewards", turn_rewards, 2)
    _check_same_shape("turn_rewards", turn_rewards, turn_values=turn_values, turn_mask=turn_mask)
    return gae(turn_rewards, turn_values, turn_mask, gamma, lam)


def broadcast_turn_values(turn_values: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Spread per-turn quantities onto tokens: ``out[b, t] = turn_values[b, turn_index[b, t]]``.

    Conventions: ``turn_index[b, t] = -1`` marks tokens that belong to no model turn (prompt,
    tool/env output, padding); their output is ``0``. Any other index must lie in ``[0, K)``.
    Autograd-transparent (gradients flow to the selected ``turn_values`` entries). This is the
    turn-to-token broadcast of turn-level credit assignment (e.g. ArCHer, Zhou et al. 2024), where
    every token of a turn receives that turn's advantage.

    Shapes: ``turn_values`` ``[B, K]`` floating, ``turn_index`` ``[B, T]`` integer. Returns ``[B, T]``.

    Raises:
        ValueError: non-2-D inputs, batch mismatch, non-integer ``turn_index`` or indices
            outside ``[-1, K)``.
    """
    _check_ndim("turn_values", turn_values, 2)
    _check_ndim("turn_index", turn_index, 2)
    if turn_values.shape[0] != turn_index.shape[0]:
        raise ValueError(
            f"batch mismatch: turn_values has shape {tuple(turn_values.shape)}, "
            f"turn_index has shape {tuple(turn_index.shape)}"
        )
    if turn_index.dtype.is_floating_point or turn_index.dtype.is_complex or turn_index.dtype == torch.bool:
        raise ValueError(f"turn_index must be an integer tensor, got dtype {turn_index.dtype}")
    n_turns = turn_values.shape[1]
    if turn_index.numel() > 0:
        lo, hi = int(turn_index.min()), int(turn_index.max())
        if lo < -1 or hi >= n_turns:
            raise ValueError(f"turn_index values must lie in [-1, {n_turns}); got range [{lo}, {hi}]")
    idx = turn_index.long()
    valid = idx >= 0
    if n_turns == 0:
        return torch.zeros(idx.shape, dtype=_float(turn_values).dtype, device=turn_values.device)
    vals = _float(turn_values)
    gathered = torch.gather(vals, 1, idx.clamp_min(0))
    return torch.where(valid, gathered, torch.zeros((), dtype=vals.dtype, device=vals.device))
