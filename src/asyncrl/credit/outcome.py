"""Outcome and process credit: a trajectory's rewards become per-token advantages.

``outcome``: every model token of trajectory ``i`` gets the group-relative advantage of its
final reward, ``A_i`` from :func:`asyncrl.algo.group_advantages` (or the batch mean baseline).
An episode that is several samples (``model.multi_turn: per_turn``, a gateway session of
non-extending calls) enters its group's statistics once; each of its samples gets its ``A``.

``process``: segment ``k`` (model turn ``k`` and the observation it caused) additionally gets
``α · G_k`` where ``G_k = Σ_{j≥k} γ^{j−k} p_j`` is the reward-to-go of the environment's rule
rewards ``p_j`` (each clipped to [-1, 1]), centred by the batch mean over segments; ``α`` is
``credit.process_weight``. Tokens of the same model turn share the turn's advantage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncrl.algo import batch_mean_baseline, group_advantages
from asyncrl.config import CreditConfig
from asyncrl.records import Group, members


def sequence_advantages(groups: Sequence[Group], cfg: CreditConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """One outcome advantage per sample ``[B]`` (the groups' members, in order)."""
    batch = members(groups)
    rewards = torch.tensor([t.final_reward for t in batch], dtype=torch.float32)
    if cfg.baseline == "batch_mean":
        adv = batch_mean_baseline(rewards)
        return adv, {
            "adv/outcome_mean": float(adv.mean()),
            "adv/outcome_std": float(adv.std()) if len(adv) > 1 else 0.0,
        }
    # an episode of several samples (per-turn / per-call) counts once in its group's baseline;
    # each of its samples gets the episode's advantage
    heads = [(g, t) for g, group in enumerate(groups) for t in group.episode_heads()]
    episode = {t.episode: e for e, (_, t) in enumerate(heads)}
    ep_rewards = torch.tensor([t.final_reward for _, t in heads], dtype=torch.float32)
    group_of = torch.tensor([g for g, _ in heads], dtype=torch.long)
    ep_adv, metrics = group_advantages(ep_rewards, group_of, cfg.baseline)
    return ep_adv[torch.tensor([episode[t.episode] for t in batch], dtype=torch.long)], metrics


def token_advantages(
    groups: Sequence[Group], T: int, cfg: CreditConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token advantages ``[B, T]`` of the groups' members (right padded; zero off model tokens)."""
    seq_adv, metrics = sequence_advantages(groups, cfg)
    batch = members(groups)
    out = torch.zeros(len(batch), T)
    process: list[list[tuple[int, int, float]]] = []
    for i, traj in enumerate(batch):
        pos, spans = 0, []
        for turn in traj.turns:
            n = len(turn.token_ids)
            if turn.role == "model":
                out[i, pos : pos + n] = seq_adv[i]
                spans.append((pos, pos + n, max(-1.0, min(1.0, turn.process_reward))))
            pos += n
        process.append(spans)
    if cfg.strategy == "process" and cfg.process_weight > 0:
        extra, centre = process_to_go([[p for *_, p in spans] for spans in process], cfg)
        for spans, row_extra, row in zip(process, extra, out, strict=True):
            for (a, b, _), g in zip(spans, row_extra, strict=True):
                row[a:b] += g
        metrics["adv/process_mean_to_go"] = centre
    return out, metrics


def reward_to_go(rewards: list[float], gamma: float) -> list[float]:
    """``G_k = Σ_{j≥k} γ^{j−k} r_j``."""
    acc, out = 0.0, []
    for r in reversed(rewards):
        acc = r + gamma * acc
        out.append(acc)
    return out[::-1]


def process_to_go(rewards: list[list[float]], cfg: CreditConfig) -> tuple[list[list[float]], float]:
    """``α (G_k − Ḡ)`` of every segment (``rewards``: the process rewards ``p_k`` per trajectory): the
    process reward-to-go centred by its batch mean ``Ḡ`` over segments; and ``Ḡ``."""
    to_go = [reward_to_go(seq, cfg.gamma) for seq in rewards]
    flat = [x for seq in to_go for x in seq]
    centre = sum(flat) / len(flat) if flat else 0.0
    return [[cfg.process_weight * (g - centre) for g in seq] for seq in to_go], centre
