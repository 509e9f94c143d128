"""Tests for the pure algorithm core ``asyncrl.algo``.

Layout:
    1. slow, obviously-correct python-loop references
    2. hand-computed cases (numbers worked out in comments)
    3. vectorised implementation vs. reference on random data (fixed seeds, masks with gaps)
    4. property tests (hypothesis)
    5. error messages
    6. purity of the package (subprocess with other asyncrl modules made unimportable)
"""

from __future__ import annotations

import ast
import importlib
import math
import os
import statistics
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pydantic
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import asyncrl.algo as algo
from asyncrl.algo import (
    PolicyLossConfig,
    aggregate_loss,
    approx_kl,
    batch_mean_baseline,
    entropy_loss,
    gae,
    group_advantages,
    kl_estimate,
    kl_mean,
    kl_penalty_loss,
    masked_mean,
    policy_loss,
    staleness_weight,
    turn_level_gae,
    value_loss,
)

F64 = torch.float64
KINDS = ["ppo_clip", "decoupled_ppo", "tis", "cispo", "reinforce"]
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
LN = math.log


def t64(x: Any) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# =============================================================================================
# 1. Python-loop references
# =============================================================================================


def ref_gae(
    rewards: list[list[float]], values: list[list[float]], mask: list[list[int]], gamma: float, lam: float
) -> tuple[list[list[float]], list[list[float]]]:
    """Delete masked positions, run textbook GAE on what is left, scatter back (0 elsewhere)."""
    advs, rets = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        idx = [t for t, m in enumerate(m_row) if m]
        adv = [0.0] * len(r_row)
        ret = [0.0] * len(r_row)
        next_v, last = 0.0, 0.0
        for t in reversed(idx):
            delta = r_row[t] + gamma * next_v - v_row[t]
            last = delta + gamma * lam * last
            adv[t] = last
            ret[t] = last + v_row[t]
            next_v = v_row[t]
        advs.append(adv)
        rets.append(ret)
    return advs, rets


def ref_group(rewards: list[float], ids: list[int], mode: str, eps: float) -> list[float]:
    groups: dict[int, list[int]] = defaultdict(list)
    for i, g in enumerate(ids):
        groups[g].append(i)
    out = [0.0] * len(rewards)
    for idx in groups.values():
        vals = [rewards[i] for i in idx]
        if len(idx) == 1 or max(vals) == min(vals):
            continue
        mean = sum(vals) / len(vals)
        for i in idx:
            if mode == "grpo":
                out[i] = (rewards[i] - mean) / (statistics.stdev(vals) + eps)
            elif mode == "dr_grpo":
                out[i] = rewards[i] - mean
            else:
                others = [rewards[j] for j in idx if j != i]
                out[i] = rewards[i] - sum(others) / len(others)
    return out


def ref_kl(logp: float, ref: float, kind: str) -> float:
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    return math.exp(ref - logp) - (ref - logp) - 1.0


Grid = list[list[float]]


def ref_value_loss(
    v: Grid, v_old: Grid, ret: Grid, mask: list[list[int]], clip_eps: float
) -> tuple[float, Grid, float]:
    total, n, n_clip = 0.0, 0, 0
    grads = [[0.0] * len(v[0]) for _ in v]
    per_tok = []
    for b in range(len(v)):
        for t in range(len(v[0])):
            if not mask[b][t]:
                continue
            l1 = (v[b][t] - ret[b][t]) ** 2
            vc = v_old[b][t] + min(max(v[b][t] - v_old[b][t], -clip_eps), clip_eps)
            l2 = (vc - ret[b][t]) ** 2
            if l2 > l1:
                per_tok.append((b, t, 0.5 * l2, 0.0))
                n_clip += 1
            else:
                per_tok.append((b, t, 0.5 * l1, v[b][t] - ret[b][t]))
            n += 1
    for b, t, loss_bt, g in per_tok:
        total += loss_bt / n
        grads[b][t] = g / n
    return total, grads, n_clip / n


def ref_policy_loss(
    logp: Grid,
    blogp: Grid,
    adv: Grid,
    mask: list[list[int]],
    cfg: PolicyLossConfig,
    prox: Grid | None = None,
    age: list[Any] | None = None,
) -> tuple[float, Grid, dict[str, float]]:
    """Per-token python loop; returns (loss, d loss / d logp, metrics subset)."""
    n_b, n_t = len(logp), len(logp[0])

    def clamp(x: float) -> float:
        return min(max(x, -20.0), 20.0)

    tok_l = [[0.0] * n_t for _ in range(n_b)]
    tok_g = [[0.0] * n_t for _ in range(n_b)]
    clipped = [[False] * n_t for _ in range(n_b)]
    rhos, ws = [], []

    def ppo(ratio: float, a: float) -> tuple[float, float, bool]:
        lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
        pg1, pg2 = -a * ratio, -a * min(max(ratio, lo), hi)
        loss_v, grad_v = (pg1, -a * ratio) if pg1 >= pg2 else (pg2, 0.0)
        if cfg.dual_clip_c is not None and a < 0 and -cfg.dual_clip_c * a < loss_v:
            loss_v, grad_v = -cfg.dual_clip_c * a, 0.0
        return loss_v, grad_v, not (lo <= ratio <= hi)

    for b in range(n_b):
        for t in range(n_t):
            if not mask[b][t]:
                continue
            a = adv[b][t]
            rho = math.exp(clamp(logp[b][t] - blogp[b][t]))
            rhos.append(rho)
            a_bt = 0.0 if age is None else (age[b][t] if isinstance(age[b], list) else age[b])
            w = cfg.staleness_gamma**a_bt
            ws.append(w)
            if cfg.kind == "ppo_clip":
                lv, gv, c = ppo(rho, a)
            elif cfg.kind == "decoupled_ppo":
                assert prox is not None
                r = math.exp(clamp(logp[b][t] - prox[b][t]))
                v = min(math.exp(clamp(prox[b][t] - blogp[b][t])), cfg.is_cap)
                lv, gv, c = ppo(r, a)
                lv, gv = v * lv, v * gv
            elif cfg.kind == "tis":
                v = min(rho, cfg.is_cap)
                lv, gv, c = -v * a * logp[b][t], -v * a, rho > cfg.is_cap
            elif cfg.kind == "cispo":
                lo, hi = 1 - cfg.cispo_eps_low, 1 + cfg.cispo_eps_high
                v = min(max(rho, lo), hi)
                lv, gv, c = -v * a * logp[b][t], -v * a, not (lo <= rho <= hi)
            else:
                lv, gv, c = -a * logp[b][t], -a, False
            tok_l[b][t], tok_g[b][t], clipped[b][t] = w * lv, w * gv, c

    keep = [[bool(mask[b][t]) for t in range(n_t)] for b in range(n_b)]
    if cfg.max_behaviour_divergence is not None:
        d = cfg.max_behaviour_divergence
        for b in range(n_b):
            devs = [abs(logp[b][t] - blogp[b][t]) for t in range(n_t) if mask[b][t]]
            for t in range(n_t):
                if cfg.divergence_level == "token":
                    keep[b][t] = keep[b][t] and abs(logp[b][t] - blogp[b][t]) <= d
                else:
                    keep[b][t] = keep[b][t] and sum(devs) / len(devs) <= d

    coef = [[0.0] * n_t for _ in range(n_b)]
    n_keep = sum(sum(row) for row in keep)
    for b in range(n_b):
        n_row = sum(keep[b])
        n_rows_nonempty = sum(1 for row in keep if any(row))
        for t in range(n_t):
            if not keep[b][t]:
                continue
            if cfg.agg == "token_mean":
                coef[b][t] = 1.0 / n_keep
            elif cfg.agg == "seq_mean_token_mean":
                coef[b][t] = 1.0 / (n_row * n_rows_nonempty)
            else:
                coef[b][t] = 1.0 / (n_b * (cfg.max_tokens or n_t))
    loss = sum(coef[b][t] * tok_l[b][t] for b in range(n_b) for t in range(n_t))
    grad = [[coef[b][t] * tok_g[b][t] for t in range(n_t)] for b in range(n_b)]
    n_valid = sum(sum(1 for m in row if m) for row in mask)
    kept_clipped = [clipped[b][t] for b in range(n_b) for t in range(n_t) if keep[b][t]]
    metrics = {
        "loss/policy": loss,
        "policy/clip_frac": sum(kept_clipped) / max(len(kept_clipped), 1),
        "policy/ratio_mean": sum(rhos) / len(rhos),
        "policy/staleness_weight_mean": sum(ws) / len(ws),
        "policy/masked_frac": (n_valid - n_keep) / n_valid,
        "kl/behaviour_k3": sum(r - 1 - math.log(r) for r in rhos) / len(rhos),
    }
    return loss, grad, metrics


# =============================================================================================
# random data with masked gaps in the middle
# =============================================================================================


def gapped_mask(gen: torch.Generator, b: int, t: int) -> torch.Tensor:
    """Random 0/1 mask; row 0 has an interior gap, row 1 is a multi-turn pattern, others random."""
    m = (torch.rand(b, t, generator=gen) > 0.35).to(torch.int64)
    m[0] = 1
    m[0, 2:4] = 0  # gap in the middle of row 0
    if b > 1:
        m[1] = torch.tensor([1 if (k // 2) % 2 == 0 else 0 for k in range(t)])  # 1 1 0 0 1 1 0 0 ...
    m[:, 0] = 1  # every row has at least one valid token
    return m


def random_batch(seed: int, b: int = 5, t: int = 11) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=gen, dtype=F64) * 3.0 - 0.05
    blogp = logp + 0.4 * torch.randn(b, t, generator=gen, dtype=F64)
    prox = logp + 0.3 * torch.randn(b, t, generator=gen, dtype=F64)
    return {
        "logp": logp,
        "blogp": blogp,
        "prox": prox,
        "adv": torch.randn(b, t, generator=gen, dtype=F64),
        "mask": gapped_mask(gen, b, t),
        "age_tok": torch.randint(0, 4, (b, t), generator=gen),
        "age_seq": torch.randint(0, 4, (b,), generator=gen),
        "rewards": torch.randn(b, t, generator=gen, dtype=F64),
        "values": torch.randn(b, t, generator=gen, dtype=F64),
    }


# =============================================================================================
# 2. Hand-computed cases
# =============================================================================================


def test_gae_hand_computed_with_mask_gap() -> None:
    # Row 0: mask [1,0,1], gamma=0.9, lam=0.8. Position 1 is a tool token with junk reward/value.
    #   t=2: delta = 1 + 0.9*0 - 0.5 = 0.5;          A2 = 0.5;                    R2 = 1.0
    #   t=1: skipped (V_next stays 0.5, lastgaelam stays 0.5)
    #   t=0: delta = 0 + 0.9*0.5 - 0.5 = -0.05;      A0 = -0.05 + 0.72*0.5 = 0.31; R0 = 0.81
    rewards = t64([[0.0, 7.0, 1.0]])
    values = t64([[0.5, 100.0, 0.5]])
    adv, ret = gae(rewards, values, torch.tensor([[1, 0, 1]]), 0.9, 0.8)
    assert_close(adv, t64([[0.31, 0.0, 0.5]]))
    assert_close(ret, t64([[0.81, 0.0, 1.0]]))


def test_gae_hand_computed_unmasked() -> None:
    # rewards [1,0,2], values [0.2,0.4,0.6], gamma=lam=0.5 (gamma*lam = 0.25)
    #   t=2: delta = 2 - 0.6 = 1.4;                  A = 1.4
    #   t=1: delta = 0 + 0.5*0.6 - 0.4 = -0.1;       A = -0.1 + 0.25*1.4 = 0.25
    #   t=0: delta = 1 + 0.5*0.4 - 0.2 = 1.0;        A = 1.0 + 0.25*0.25 = 1.0625
    #   returns = A + V = [1.2625, 0.65, 2.0]
    adv, ret = gae(
        t64([[1.0, 0.0, 2.0]]), t64([[0.2, 0.4, 0.6]]), torch.ones(1, 3, dtype=torch.bool), 0.5, 0.5
    )
    assert_close(adv, t64([[1.0625, 0.25, 1.4]]))
    assert_close(ret, t64([[1.2625, 0.65, 2.0]]))


def test_gae_all_masked_row_and_empty_length() -> None:
    adv, ret = gae(t64([[1.0, 2.0]]), t64([[3.0, 4.0]]), torch.zeros(1, 2), 0.9, 0.9)
    assert torch.equal(adv, torch.zeros(1, 2, dtype=F64)) and torch.equal(ret, torch.zeros(1, 2, dtype=F64))
    adv, ret = gae(torch.zeros(2, 0), torch.zeros(2, 0), torch.zeros(2, 0), 0.9, 0.9)
    assert adv.shape == (2, 0) and ret.shape == (2, 0)


def test_turn_level_gae_hand_computed() -> None:
    # 3 turn slots, the last one is padding. gamma=1, lam=0.5.
    #   k=2: padding, skipped
    #   k=1: delta = 1 + 1*0 - 0.8 = 0.2;   A1 = 0.2;                R1 = 1.0
    #   k=0: delta = 0 + 1*0.8 - 0.5 = 0.3; A0 = 0.3 + 0.5*0.2 = 0.4; R0 = 0.9
    adv, ret = turn_level_gae(
        t64([[0.0, 1.0, 0.0]]), t64([[0.5, 0.8, 9.0]]), torch.tensor([[1, 1, 0]]), 1.0, 0.5
    )
    assert_close(adv, t64([[0.4, 0.2, 0.0]]))
    assert_close(ret, t64([[0.9, 1.0, 0.0]]))


def test_group_advantages_hand_computed_all_modes() -> None:
    # group 0: [1,0,1,0] mean 0.5, unbiased std = sqrt(4*0.25/3) = sqrt(1/3)
    # group 1: [0.5]            singleton -> 0
    # group 7: [2,2,2]          constant  -> 0
    # group 3: [0.1,0.1,0.1]    constant with inexact float mean -> must still be exactly 0
    rewards = t64([1.0, 0.0, 1.0, 0.0, 0.5, 2.0, 2.0, 2.0, 0.1, 0.1, 0.1])
    ids = torch.tensor([0, 0, 0, 0, 1, 7, 7, 7, 3, 3, 3])
    z = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # = 0.8660239...
    adv, metrics = group_advantages(rewards, ids, "grpo")
    assert_close(adv, t64([z, -z, z, -z] + [0.0] * 7))
    assert torch.equal(adv[4:], torch.zeros(7, dtype=F64))  # exactly zero, not merely small
    # Dr.GRPO: r - mean
    adv, _ = group_advantages(rewards, ids, "dr_grpo")
    assert_close(adv, t64([0.5, -0.5, 0.5, -0.5] + [0.0] * 7))
    # RLOO: 1 - mean(0,1,0) = 2/3 ; 0 - mean(1,1,0) = -2/3
    adv, _ = group_advantages(rewards, ids, "rloo")
    assert_close(adv, t64([2 / 3, -2 / 3, 2 / 3, -2 / 3] + [0.0] * 7))
    assert torch.equal(adv[4:], torch.zeros(7, dtype=F64))
    assert metrics["group/count"] == 4.0
    assert metrics["group/frac_singleton"] == 0.25
    assert metrics["group/frac_constant"] == 0.75  # singleton + two constant groups
    assert_close(metrics["group/size_mean"], 11 / 4)


def test_group_advantages_eps_and_empty() -> None:
    # eps goes on the std: (1 - 0.5) / (std([1,0]) + 0.5) with std([1,0]) = sqrt(0.5)
    adv, _ = group_advantages(t64([1.0, 0.0]), torch.tensor([5, 5]), "grpo", eps=0.5)
    assert_close(adv, t64([0.5 / (math.sqrt(0.5) + 0.5), -0.5 / (math.sqrt(0.5) + 0.5)]))
    adv, metrics = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), "rloo")
    assert adv.shape == (0,) and metrics["group/count"] == 0.0


def test_batch_mean_hand_computed() -> None:
    assert_close(batch_mean_baseline(t64([1.0, 2.0, 6.0])), t64([-2.0, -1.0, 3.0]))


def test_masked_mean_hand_computed() -> None:
    x = t64([[1.0, float("inf"), 3.0], [float("nan"), 2.0, 6.0]])
    m = torch.tensor([[1, 0, 1], [0, 1, 1]])
    assert_close(masked_mean(x, m), t64(3.0))  # (1+3+2+6)/4
    assert_close(masked_mean(x, m, dim=1), t64([2.0, 4.0]))
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0


def ppo_cfg(**kw: Any) -> PolicyLossConfig:
    return PolicyLossConfig(**kw)


def test_ppo_clip_hand_computed_both_bounds() -> None:
    # eps_low = 0.2, eps_high = 0.28 (defaults). Tokens (rho, A):
    #  1. (1.5, +1): pg1=-1.5, pg2=-1.28 -> -1.28 (upper clip active, grad 0)
    #  2. (0.5, -1): pg1= 0.5, pg2= 0.8  ->  0.8  (lower clip active, grad 0)
    #  3. (0.5, +1): pg1=-0.5, pg2=-0.8  -> -0.5  (outside region but not active, grad -A*rho = -0.5)
    #  4. (1.1, +2): pg1=pg2=-2.2        -> -2.2  (inside, grad -2.2)
    # token_mean = (-1.28 + 0.8 - 0.5 - 2.2)/4 = -0.795; grads /4 = [0, 0, -0.125, -0.55]
    blogp = t64([[-1.0, -1.0, -1.0, -1.0]])
    logp = (blogp + t64([[LN(1.5), LN(0.5), LN(0.5), LN(1.1)]])).requires_grad_()
    adv = t64([[1.0, -1.0, 1.0, 2.0]])
    loss, m = policy_loss(logp, blogp, adv, torch.ones(1, 4), ppo_cfg())
    assert_close(loss, t64(-0.795))
    assert_close(grad_of(loss, logp), t64([[0.0, 0.0, -0.125, -0.55]]))
    assert m["policy/clip_frac"] == 0.75  # tokens 1,2,3 outside [0.8, 1.28]
    assert m["policy/clip_frac_active"] == 0.5  # tokens 1,2
    assert_close(m["policy/ratio_mean"], (1.5 + 0.5 + 0.5 + 1.1) / 4)
    assert_close(m["policy/ratio_max"], 1.5)
    assert_close(m["policy/ratio_min"], 0.5)
    assert_close(m["loss/policy"], -0.795)


def test_ppo_dual_clip_hand_computed() -> None:
    # c = 3. Tokens (rho, A):
    #  1. (5, -1): pg1=5, pg2=1.28 -> max 5 -> min(5, -c*A=3) = 3 (dual clip, grad 0)
    #  2. (2, -1): pg1=2, pg2=1.28 -> 2 -> min(2, 3) = 2 (grad -A*rho = 2)
    #  3. (5, +1): A>0, dual clip inactive: max(-5, -1.28) = -1.28 (grad 0)
    # mean = (3 + 2 - 1.28)/3 = 1.24; grads /3 = [0, 2/3, 0]
    blogp = t64([[-2.0, -2.0, -2.0]])
    logp = (blogp + t64([[LN(5.0), LN(2.0), LN(5.0)]])).requires_grad_()
    loss, m = policy_loss(logp, blogp, t64([[-1.0, -1.0, 1.0]]), torch.ones(1, 3), ppo_cfg(dual_clip_c=3.0))
    assert_close(loss, t64(1.24))
    assert_close(grad_of(loss, logp), t64([[0.0, 2 / 3, 0.0]]))
    assert_close(m["policy/dual_clip_frac"], 1 / 3)
    # Without dual clip token 1 would contribute 5: (5 + 2 - 1.28)/3
    loss_nd, _ = policy_loss(logp, blogp, t64([[-1.0, -1.0, 1.0]]), torch.ones(1, 3), ppo_cfg())
    assert_close(loss_nd, t64((5 + 2 - 1.28) / 3))


def test_decoupled_ppo_hand_computed() -> None:
    # token 1: mu=0.2, prox=0.4, theta=0.6, A=+1: IS = 0.4/0.2 = 2 (< cap 5), r = 1.5 -> clipped 1.28
    #          l = 2 * (-1.28) = -2.56, grad 0
    # token 2: mu=0.1, prox=0.8, theta=0.8, A=-0.5: IS = 8 -> capped at 5, r = 1
    #          l = 5 * (0.5 * 1) = 2.5, grad = 5 * (-A * r) = 2.5
    # mean = (-2.56 + 2.5)/2 = -0.03; grads /2 = [0, 1.25]; ratio pi_theta/mu = [3, 8] -> mean 5.5
    blogp = t64([[LN(0.2), LN(0.1)]])
    prox = t64([[LN(0.4), LN(0.8)]])
    logp = t64([[LN(0.6), LN(0.8)]]).requires_grad_()
    cfg = ppo_cfg(kind="decoupled_ppo")
    loss, m = policy_loss(logp, blogp, t64([[1.0, -0.5]]), torch.ones(1, 2), cfg, prox_logp=prox)
    assert_close(loss, t64(-0.03))
    assert_close(grad_of(loss, logp), t64([[0.0, 1.25]]))
    assert_close(m["policy/ratio_mean"], 5.5)
    assert_close(m["policy/is_weight_mean"], (2 + 5) / 2)
    assert m["policy/clip_frac"] == 0.5
    assert "kl/prox_k3" in m


def test_tis_hand_computed_cap() -> None:
    # rho = [0.5, 3, 10], cap 5 -> weights [0.5, 3, 5]; A = [1, 1, -1]; logp = [-1, -2, -0.5]
    # l = -w*A*logp = [0.5, 6, -2.5] -> mean 4/3 ; grad = -w*A/3 = [-1/6, -1, 5/3]
    logp = t64([[-1.0, -2.0, -0.5]]).requires_grad_()
    blogp = logp.detach() - t64([[LN(0.5), LN(3.0), LN(10.0)]])
    loss, m = policy_loss(logp, blogp, t64([[1.0, 1.0, -1.0]]), torch.ones(1, 3), ppo_cfg(kind="tis"))
    assert_close(loss, t64(4 / 3))
    assert_close(grad_of(loss, logp), t64([[-1 / 6, -1.0, 5 / 3]]))
    assert_close(m["policy/clip_frac"], 1 / 3)
    assert_close(m["policy/is_weight_mean"], (0.5 + 3 + 5) / 3)


def test_cispo_hand_computed() -> None:
    # cispo_eps_low=0.5, cispo_eps_high=1.0 -> weight clipped to [0.5, 2]
    # rho = [0.25, 1.5, 4] -> w = [0.5, 1.5, 2]; A = 1; logp = -1 -> l = -w*A*logp = w
    # mean = 4/3; grad = -w/3 = [-1/6, -1/2, -2/3]
    logp = t64([[-1.0, -1.0, -1.0]]).requires_grad_()
    blogp = logp.detach() - t64([[LN(0.25), LN(1.5), LN(4.0)]])
    cfg = ppo_cfg(kind="cispo", cispo_eps_low=0.5, cispo_eps_high=1.0)
    loss, m = policy_loss(logp, blogp, t64([[1.0, 1.0, 1.0]]), torch.ones(1, 3), cfg)
    assert_close(loss, t64(4 / 3))
    assert_close(grad_of(loss, logp), t64([[-1 / 6, -0.5, -2 / 3]]))
    assert_close(m["policy/clip_frac"], 2 / 3)
    # defaults (no lower bound, upper bound 5): rho = [0.25, 10] -> w = [0.25, 5]
    logp2 = t64([[-1.0, -1.0]]).requires_grad_()
    blogp2 = logp2.detach() - t64([[LN(0.25), LN(10.0)]])
    loss2, _ = policy_loss(logp2, blogp2, t64([[1.0, 1.0]]), torch.ones(1, 2), ppo_cfg(kind="cispo"))
    assert_close(loss2, t64((0.25 + 5.0) / 2))


def test_reinforce_and_agg_modes_hand_computed() -> None:
    # reinforce with logp = -1 everywhere -> per-token loss = A (rho is irrelevant)
    # A = [[1,2,3],[4,x,x],[x,x,x]] with mask [[1,1,1],[1,0,0],[0,0,0]]
    #   token_mean              = (1+2+3+4)/4 = 2.5
    #   seq_mean_token_mean     = mean(row means 2, 4; empty row excluded) = 3
    #   seq_mean_token_sum_norm = (6 + 4 + 0) / (B=3 * T=3) = 10/9 ; with max_tokens=5: 10/15
    logp = torch.full((3, 3), -1.0, dtype=F64, requires_grad=True)
    blogp = torch.full((3, 3), -7.0, dtype=F64)
    adv = t64([[1.0, 2.0, 3.0], [4.0, 50.0, 50.0], [60.0, 60.0, 60.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    expected = {"token_mean": 2.5, "seq_mean_token_mean": 3.0, "seq_mean_token_sum_norm": 10 / 9}
    for agg, val in expected.items():
        loss, _ = policy_loss(logp, blogp, adv, mask, ppo_cfg(kind="reinforce", agg=agg))
        assert_close(loss, t64(val))
    loss, _ = policy_loss(
        logp, blogp, adv, mask, ppo_cfg(kind="reinforce", agg="seq_mean_token_sum_norm", max_tokens=5)
    )
    assert_close(loss, t64(10 / 15))
    # the per-token gradient weights for seq_mean_token_mean: row0 1/(3*2), row1 1/(1*2)
    loss, _ = policy_loss(logp, blogp, adv, mask, ppo_cfg(kind="reinforce", agg="seq_mean_token_mean"))
    g = grad_of(loss, logp)
    assert_close(g, t64([[-1 / 6, -2 / 6, -3 / 6], [-4 / 2, 0, 0], [0, 0, 0]]))
    # aggregate_loss directly
    assert_close(
        aggregate_loss(t64([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1, 1], [1, 0]]), "token_mean"), t64(2.0)
    )


def test_per_sequence_advantages_broadcast() -> None:
    logp = torch.full((2, 2), -1.0, dtype=F64, requires_grad=True)
    l1, _ = policy_loss(logp, logp.detach(), t64([1.0, 3.0]), torch.ones(2, 2), ppo_cfg(kind="reinforce"))
    l2, _ = policy_loss(
        logp, logp.detach(), t64([[1.0, 1.0], [3.0, 3.0]]), torch.ones(2, 2), ppo_cfg(kind="reinforce")
    )
    assert_close(l1, l2)
    assert_close(l1, t64(2.0))


def test_staleness_hand_computed() -> None:
    # gamma 0.5, per-sequence ages [0, 2] -> w = [1, 0.25]; reinforce, logp=-1, A=1 -> l = w
    # token_mean over 4 tokens = (1+1+0.25+0.25)/4 = 0.625
    logp = torch.full((2, 2), -1.0, dtype=F64, requires_grad=True)
    cfg = ppo_cfg(kind="reinforce", staleness_gamma=0.5)
    loss, m = policy_loss(
        logp, logp.detach(), torch.ones(2, 2, dtype=F64), torch.ones(2, 2), cfg, age=torch.tensor([0, 2])
    )
    assert_close(loss, t64(0.625))
    assert_close(m["policy/staleness_weight_mean"], 0.625)
    assert_close(m["policy/age_mean"], 1.0)
    assert_close(staleness_weight(torch.tensor([0, 1, 3]), 0.5), torch.tensor([1.0, 0.5, 0.125]))


def test_divergence_filter_hand_computed() -> None:
    # |logp - mu| = [0.1, 0.7, 0.3] in row 0 and [0.1, 0.2, 0.3] in row 1
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    blogp = t64([[-1.1, -1.7, -1.3], [-1.1, -1.2, -1.3]])
    adv = t64([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    # token level, delta=0.5: only (0,1) dropped; reinforce l = A -> (1+3+1+1+1)/5 = 1.4
    cfg = ppo_cfg(kind="reinforce", max_behaviour_divergence=0.5)
    loss, m = policy_loss(logp, blogp, adv, torch.ones(2, 3), cfg)
    assert_close(loss, t64(1.4))
    assert_close(m["policy/masked_frac"], 1 / 6)
    assert m["policy/tokens"] == 5.0
    # sequence level, delta=0.3: row means 0.3667 (dropped) and 0.2 (kept) -> loss = mean(1,1,1) = 1
    cfg = ppo_cfg(kind="reinforce", max_behaviour_divergence=0.3, divergence_level="sequence")
    loss, m = policy_loss(logp, blogp, adv, torch.ones(2, 3), cfg)
    assert_close(loss, t64(1.0))
    assert_close(m["policy/masked_frac"], 0.5)
    assert_close(grad_of(loss, logp)[0], torch.zeros(3, dtype=F64))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agg", AGGS)
def test_all_zero_mask_gives_zero_loss_and_finite_grad(kind: str, agg: str) -> None:
    logp = t64([[-1.0, float("nan")], [float("-inf"), -2.0]]).requires_grad_()
    blogp = t64([[float("inf"), -1.0], [-1.0, float("nan")]])
    loss, m = policy_loss(
        logp,
        blogp,
        t64([[1.0, float("nan")], [2.0, 3.0]]),
        torch.zeros(2, 2),
        ppo_cfg(kind=kind, agg=agg),
        prox_logp=blogp,
    )
    assert loss.item() == 0.0
    assert torch.equal(grad_of(loss, logp), torch.zeros(2, 2, dtype=F64))
    assert all(math.isfinite(v) for v in m.values())
    assert m["policy/tokens"] == 0.0 and m["policy/staleness_weight_mean"] == 1.0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), float("-inf")])
def test_nan_inf_at_masked_positions_do_not_leak(kind: str, junk: float) -> None:
    d = random_batch(3, b=3, t=6)
    mask = d["mask"].bool()
    bad = torch.tensor(junk, dtype=F64)
    logp = torch.where(mask, d["logp"], bad).requires_grad_()
    blogp = torch.where(mask, d["blogp"], bad)
    prox = torch.where(mask, d["prox"], bad)
    adv = torch.where(mask, d["adv"], bad)
    age = torch.where(mask, d["age_tok"].to(F64), bad)
    cfg = ppo_cfg(kind=kind, staleness_gamma=0.9, max_behaviour_divergence=0.6, dual_clip_c=2.0)
    loss, m = policy_loss(logp, blogp, adv, mask, cfg, prox_logp=prox, age=age)
    clean = d["logp"].clone().requires_grad_()
    loss_clean, m_clean = policy_loss(
        clean, d["blogp"], d["adv"], mask, cfg, prox_logp=d["prox"], age=d["age_tok"]
    )
    assert_close(loss, loss_clean)
    assert_close(grad_of(loss, logp), grad_of(loss_clean, clean))
    assert m == pytest.approx(m_clean)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_logprob_corners_are_finite(kind: str, dtype: torch.dtype) -> None:
    # every sign combination of (logp - behaviour_logp) = +-100 and A = +-5, in low precision
    logp = torch.tensor([[50.0, -50.0, 50.0, -50.0]], dtype=dtype, requires_grad=True)
    blogp = torch.tensor([[-50.0, 50.0, -50.0, 50.0]], dtype=dtype)
    adv = torch.tensor([[5.0, 5.0, -5.0, -5.0]], dtype=dtype)
    for prox in (blogp, logp.detach(), -blogp):
        loss, m = policy_loss(logp, blogp, adv, torch.ones(1, 4), ppo_cfg(kind=kind), prox_logp=prox)
        assert torch.isfinite(loss)
        assert torch.isfinite(grad_of(loss, logp)).all()
        assert all(math.isfinite(v) for v in m.values())


def test_kl_estimators_hand_computed() -> None:
    # logp = ln 0.5, ref = ln 0.25:
    #   k1 = ln 2 = 0.693147; k2 = 0.5 * ln(2)^2 = 0.240227; k3 = 0.5 - (-ln 2) - 1 = ln 2 - 0.5 = 0.193147
    logp, ref = t64([[LN(0.5), 0.0]]), t64([[LN(0.25), 5.0]])
    mask = torch.tensor([[1, 0]])
    assert_close(kl_estimate(logp, ref, "k1", mask), t64([[LN(2), 0.0]]))
    assert_close(kl_estimate(logp, ref, "k2", mask), t64([[0.5 * LN(2) ** 2, 0.0]]))
    assert_close(kl_estimate(logp, ref, "k3", mask), t64([[LN(2) - 0.5, 0.0]]))
    assert_close(kl_estimate(logp, ref, "k1"), t64([[LN(2), -5.0]]))  # no mask: every position
    assert_close(kl_mean(logp, ref, "k3", mask), t64(LN(2) - 0.5))
    # approx_kl: log rho = logp - old = ln 2 -> (2 - 1) - ln 2 = 0.306853
    assert_close(approx_kl(logp, ref, mask), t64(1 - LN(2)))


def test_kl_penalty_and_entropy_losses_hand_computed() -> None:
    logp = t64([[LN(0.5), LN(0.5)]]).requires_grad_()
    loss, m = kl_penalty_loss(
        logp, t64([[LN(0.25), 3.0]]), torch.tensor([[1, 0]]), coef=0.1, kind="k3", agg="token_mean"
    )
    assert_close(loss, t64(0.1 * (LN(2) - 0.5)))  # 0.0193147
    assert_close(m["kl/ref_k3"], LN(2) - 0.5)
    assert_close(m["kl/coef"], 0.1)
    # entropies [[1,2],[3,9]], mask [[1,1],[1,0]] -> mean 2 -> loss -0.01*2
    loss, m = entropy_loss(
        t64([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1, 1], [1, 0]]), coef=0.01, agg="token_mean"
    )
    assert_close(loss, t64(-0.02))
    assert_close(m["entropy/mean"], 2.0)


def test_value_loss_hand_computed() -> None:
    # token 1: v=1, v_old=0.5, R=2, eps=0.2: (1-2)^2 = 1; v_clip = 0.7 -> (0.7-2)^2 = 1.69 -> 0.5*1.69 = 0.845
    # token 2: v=2, v_old=2,   R=1: both 1 -> 0.5
    # mean = 0.6725; clip_frac = 1/2; grads: token1 0 (clipped branch, constant), token2 (v-R)/2 = 0.5
    v = t64([[1.0, 2.0, 50.0]]).requires_grad_()
    loss, m = value_loss(v, t64([[0.5, 2.0, 0.0]]), t64([[2.0, 1.0, 0.0]]), torch.tensor([[1, 1, 0]]), 0.2)
    assert_close(loss, t64(0.6725))
    assert_close(grad_of(loss, v), t64([[0.0, 0.5, 0.0]]))
    assert m["value/clip_frac"] == 0.5 and m["loss/value"] == pytest.approx(0.6725)
    loss_nc, _ = value_loss(
        v, t64([[0.5, 2.0, 0.0]]), t64([[2.0, 1.0, 0.0]]), torch.tensor([[1, 1, 0]]), None
    )
    assert_close(loss_nc, t64(0.5))  # 0.5 * (1 + 1) / 2


def test_metrics_are_namespaced_python_floats() -> None:
    d = random_batch(0)
    expected_keys = {
        "loss/policy",
        "policy/clip_frac",
        "policy/clip_frac_active",
        "policy/dual_clip_frac",
        "policy/ratio_mean",
        "policy/ratio_max",
        "policy/ratio_min",
        "policy/is_weight_mean",
        "kl/behaviour_k3",
        "policy/staleness_weight_mean",
        "policy/age_mean",
        "policy/masked_frac",
        "policy/tokens",
    }
    for kind in KINDS:
        logp = d["logp"].clone().requires_grad_()
        _, m = policy_loss(logp, d["blogp"], d["adv"], d["mask"], ppo_cfg(kind=kind), prox_logp=d["prox"])
        assert expected_keys <= set(m)
        for k, v in m.items():
            assert type(v) is float and "/" in k
    _, vm = value_loss(d["values"], d["values"], d["rewards"], d["mask"], 0.2)
    _, gm = group_advantages(d["rewards"][:, 0], torch.tensor([0, 0, 1, 1, 1]), "grpo")
    for mm in (vm, gm):
        assert all(type(v) is float and "/" in k for k, v in mm.items())


# =============================================================================================
# 3. Vectorised vs. python-loop reference on random data
# =============================================================================================


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_turn_gae_match_reference(seed: int) -> None:
    d = random_batch(seed, b=6, t=13)
    gen = torch.Generator().manual_seed(100 + seed)
    gamma, lam = 0.5 + 0.5 * torch.rand(1, generator=gen).item(), torch.rand(1, generator=gen).item()
    r, v, m = d["rewards"].tolist(), d["values"].tolist(), d["mask"].tolist()
    adv, ret = gae(d["rewards"], d["values"], d["mask"], gamma, lam)
    ref_adv, ref_ret = ref_gae(r, v, m, gamma, lam)
    assert_close(adv, t64(ref_adv))
    assert_close(ret, t64(ref_ret))
    # turn level: treat the first 5 columns as K=5 turns
    ta, tr = turn_level_gae(d["rewards"][:, :5], d["values"][:, :5], d["mask"][:, :5], gamma, lam)
    ref_ta, ref_tr = ref_gae([x[:5] for x in r], [x[:5] for x in v], [x[:5] for x in m], gamma, lam)
    assert_close(ta, t64(ref_ta))
    assert_close(tr, t64(ref_tr))


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_group_advantages_match_reference(mode: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    sizes = [1, 2, 3, 4, 5, 8, 3, 1]
    ids = torch.cat([torch.full((n,), 10 * g + 3) for g, n in enumerate(sizes)])
    ids = ids[torch.randperm(len(ids), generator=gen)]  # interleaved, non-contiguous ids
    rewards = torch.randn(len(ids), generator=gen, dtype=F64)
    rewards[ids == 23] = 0.7  # a constant group of size 3
    rewards[ids == 33] = (torch.rand(4, generator=gen, dtype=F64) > 0.5).to(F64)  # binary rewards
    adv, _ = group_advantages(rewards, ids, mode)  # type: ignore[arg-type]
    assert_close(adv, t64(ref_group(rewards.tolist(), ids.tolist(), mode, 1e-6)))


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_matches_reference(kind: str) -> None:
    d = random_batch(7)
    out = kl_estimate(d["logp"], d["blogp"], kind, d["mask"])  # type: ignore[arg-type]
    ref = [
        [ref_kl(lp, rf, kind) if mk else 0.0 for lp, rf, mk in zip(a, b, c, strict=True)]
        for a, b, c in zip(d["logp"].tolist(), d["blogp"].tolist(), d["mask"].tolist(), strict=True)
    ]
    assert_close(out, t64(ref))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_loss_matches_reference(seed: int) -> None:
    d = random_batch(seed)
    gen = torch.Generator().manual_seed(seed)
    v = (d["values"] + 0.3 * torch.randn(d["values"].shape, generator=gen, dtype=F64)).requires_grad_()
    loss, m = value_loss(v, d["values"], d["rewards"], d["mask"], 0.2)
    ref_l, ref_g, ref_cf = ref_value_loss(
        v.tolist(), d["values"].tolist(), d["rewards"].tolist(), d["mask"].tolist(), 0.2
    )
    assert_close(loss, t64(ref_l))
    assert_close(grad_of(loss, v), t64(ref_g))
    assert_close(m["value/clip_frac"], ref_cf)


def _variants(d: dict[str, torch.Tensor]) -> list[tuple[dict[str, Any], torch.Tensor | None]]:
    """Config variants exercised for every (kind, agg): (config overrides, age)."""
    return [
        ({}, None),
        ({"dual_clip_c": 1.5, "eps_high": 0.2, "is_cap": 1.5}, None),
        ({"staleness_gamma": 0.8, "cispo_eps_low": 0.3, "cispo_eps_high": 0.5}, d["age_tok"]),
        ({"staleness_gamma": 0.6, "max_behaviour_divergence": 0.5}, d["age_seq"]),
        ({"max_behaviour_divergence": 0.25, "divergence_level": "sequence", "max_tokens": 20}, None),
    ]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_matches_reference(kind: str, agg: str) -> None:
    for seed in (0, 1):
        d = random_batch(seed)
        for overrides, age in _variants(d):
            cfg = PolicyLossConfig(kind=kind, agg=agg, **overrides)  # type: ignore[arg-type]
            logp = d["logp"].clone().requires_grad_()
            loss, m = policy_loss(logp, d["blogp"], d["adv"], d["mask"], cfg, prox_logp=d["prox"], age=age)
            age_l = None if age is None else age.tolist()
            ref_l, ref_g, ref_m = ref_policy_loss(
                d["logp"].tolist(),
                d["blogp"].tolist(),
                d["adv"].tolist(),
                d["mask"].tolist(),
                cfg,
                d["prox"].tolist(),
                age_l,
            )
            msg = f"kind={kind} agg={agg} seed={seed} overrides={overrides}"
            assert_close(loss, t64(ref_l), msg=msg)
            assert_close(grad_of(loss, logp), t64(ref_g), msg=msg)
            for k, v in ref_m.items():
                assert m[k] == pytest.approx(v, rel=1e-5, abs=1e-6), f"{k}: {msg}"


def test_reference_exercises_clipping_and_filtering() -> None:
    """Guard against a vacuous reference comparison: the random data must hit every branch."""
    d = random_batch(0)
    logp = d["logp"].clone().requires_grad_()
    _, m = policy_loss(logp, d["blogp"], d["adv"], d["mask"], ppo_cfg(dual_clip_c=1.5))
    assert 0.0 < m["policy/clip_frac_active"] < m["policy/clip_frac"] < 1.0
    assert m["policy/dual_clip_frac"] > 0.0
    _, m = policy_loss(logp, d["blogp"], d["adv"], d["mask"], ppo_cfg(max_behaviour_divergence=0.5))
    assert 0.0 < m["policy/masked_frac"] < 1.0
    _, m = policy_loss(
        logp,
        d["blogp"],
        d["adv"],
        d["mask"],
        ppo_cfg(max_behaviour_divergence=0.25, divergence_level="sequence"),
    )
    assert 0.0 < m["policy/masked_frac"] < 1.0
    _, m = policy_loss(logp, d["blogp"], d["adv"], d["mask"], ppo_cfg(kind="tis", is_cap=1.5))
    assert m["policy/clip_frac"] > 0.0


# =============================================================================================
# 4. Property tests
# =============================================================================================


@st.composite
def batches(
    draw: st.DrawFn, lo: float = -10.0, hi: float = 0.0, max_b: int = 3, max_t: int = 5
) -> dict[str, Any]:
    b = draw(st.integers(1, max_b))
    t = draw(st.integers(1, max_t))

    def grid(elem: st.SearchStrategy[Any]) -> list[list[Any]]:
        return draw(st.lists(st.lists(elem, min_size=t, max_size=t), min_size=b, max_size=b))

    floats = st.one_of(st.sampled_from([lo, hi]), st.floats(lo, hi, allow_nan=False, allow_infinity=False))
    return {
        "logp": grid(floats),
        "blogp": grid(floats),
        "prox": grid(floats),
        "adv": grid(st.floats(-10, 10, allow_nan=False, allow_infinity=False)),
        "mask": grid(st.booleans()),
        "age": grid(st.integers(0, 10)),
    }


PROPERTY = settings(max_examples=50, deadline=None)


@PROPERTY
@given(
    data=batches(),
    agg=st.sampled_from(AGGS),
    eps_low=st.floats(0.01, 0.9),
    eps_high=st.floats(0.01, 5.0),
    dual=st.one_of(st.none(), st.floats(1.01, 10.0)),
)
def test_prop_on_policy_gradients_coincide(
    data: dict[str, Any], agg: str, eps_low: float, eps_high: float, dual: float | None
) -> None:
    """rho = 1 and age = 0: ppo_clip, tis and reinforce give the same gradient w.r.t. logp."""
    grads = []
    for kind in ("ppo_clip", "tis", "reinforce"):
        cfg = PolicyLossConfig(kind=kind, agg=agg, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual)  # type: ignore[arg-type]
        logp = t64(data["logp"]).requires_grad_()
        loss, _ = policy_loss(
            logp,
            logp.detach(),
            t64(data["adv"]),
            torch.tensor(data["mask"]),
            cfg,
            age=torch.zeros(len(data["logp"])),
        )
        grads.append(grad_of(loss, logp))
    assert_close(grads[0], grads[2])
    assert_close(grads[1], grads[2])


@PROPERTY
@given(
    gamma=st.floats(0.05, 0.99),
    ages=st.lists(st.integers(0, 100), min_size=1, max_size=20, unique=True),
)
def test_prop_staleness_weights(gamma: float, ages: list[int]) -> None:
    ages = sorted(ages)
    w = staleness_weight(torch.tensor(ages, dtype=F64), gamma)
    if ages[0] == 0:
        assert w[0].item() == 1.0
    assert bool((w[1:] < w[:-1]).all())  # strictly decreasing in age
    assert bool((w > 0).all() and (w <= 1).all())
    assert torch.equal(staleness_weight(torch.tensor(ages), 1.0), torch.ones(len(ages)))
    assert staleness_weight(torch.zeros(3, dtype=torch.long), gamma).tolist() == [1.0, 1.0, 1.0]


@PROPERTY
@given(
    data=batches(lo=-5.0, hi=5.0, max_b=3, max_t=8),
    junk=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=48, max_size=48),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_prop_gae_ignores_masked_positions(
    data: dict[str, Any], junk: list[float], gamma: float, lam: float
) -> None:
    rewards, values = t64(data["logp"]), t64(data["prox"])
    mask = torch.tensor(data["mask"])
    n = rewards.numel()
    j1 = t64(junk[:n]).reshape(rewards.shape)
    j2 = t64(junk[24 : 24 + n]).reshape(rewards.shape)
    adv, ret = gae(rewards, values, mask, gamma, lam)
    adv2, ret2 = gae(torch.where(mask, rewards, j1), torch.where(mask, values, j2), mask, gamma, lam)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert torch.equal(adv[~mask], torch.zeros_like(adv[~mask]))


@PROPERTY
@given(
    data=batches(lo=-50.0, hi=50.0),
    kind=st.sampled_from(KINDS),
    agg=st.sampled_from(AGGS),
    dual=st.one_of(st.none(), st.just(3.0)),
    gamma=st.floats(0.1, 1.0),
    div=st.one_of(st.none(), st.floats(0.1, 100.0)),
    level=st.sampled_from(["token", "sequence"]),
    dtype=st.sampled_from([torch.float32, F64]),
)
def test_prop_losses_finite_for_extreme_logprobs(
    data: dict[str, Any],
    kind: str,
    agg: str,
    dual: float | None,
    gamma: float,
    div: float | None,
    level: str,
    dtype: torch.dtype,
) -> None:
    cfg = PolicyLossConfig(
        kind=kind,  # type: ignore[arg-type]
        agg=agg,  # type: ignore[arg-type]
        dual_clip_c=dual,
        staleness_gamma=gamma,
        max_behaviour_divergence=div,
        divergence_level=level,  # type: ignore[arg-type]
    )
    logp = torch.tensor(data["logp"], dtype=dtype, requires_grad=True)
    mask = torch.tensor(data["mask"])
    loss, m = policy_loss(
        logp,
        torch.tensor(data["blogp"], dtype=dtype),
        torch.tensor(data["adv"], dtype=dtype),
        mask,
        cfg,
        prox_logp=torch.tensor(data["prox"], dtype=dtype),
        age=torch.tensor(data["age"]),
    )
    assert torch.isfinite(loss)
    g = grad_of(loss, logp)
    assert torch.isfinite(g).all()
    assert all(math.isfinite(v) for v in m.values())
    lp, ref = torch.tensor(data["logp"], dtype=dtype), torch.tensor(data["blogp"], dtype=dtype)
    for k in ("k1", "k2", "k3"):
        assert torch.isfinite(kl_estimate(lp, ref, k, mask)).all()
    v = lp.clone().requires_grad_()
    vl, _ = value_loss(v, ref, torch.tensor(data["prox"], dtype=dtype), mask, 0.2)
    assert torch.isfinite(vl) and torch.isfinite(grad_of(vl, v)).all()


# =============================================================================================
# 5. Errors
# =============================================================================================


def test_unknown_modes_and_kinds_raise_value_error_naming_allowed_values() -> None:
    with pytest.raises(ValueError, match="grpo, dr_grpo, rloo"):
        group_advantages(t64([1.0]), torch.tensor([0]), "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(t64([0.0]), t64([0.0]), "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean, seq_mean_token_sum_norm"):
        aggregate_loss(t64([[1.0]]), torch.ones(1, 1), "sum")  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError):
        PolicyLossConfig(kind="grpo")  # type: ignore[arg-type]
    bogus = PolicyLossConfig.model_construct(kind="grpo")
    with pytest.raises(ValueError, match="ppo_clip, decoupled_ppo, tis, cispo, reinforce"):
        policy_loss(t64([[0.0]]), t64([[0.0]]), t64([[1.0]]), torch.ones(1, 1), bogus)


def test_decoupled_without_prox_raises() -> None:
    with pytest.raises(ValueError, match="prox_logp"):
        policy_loss(t64([[0.0]]), t64([[0.0]]), t64([[1.0]]), torch.ones(1, 1), ppo_cfg(kind="decoupled_ppo"))


def test_shape_mismatches_raise() -> None:
    x = torch.zeros(2, 3, dtype=F64)
    cfg = ppo_cfg()
    with pytest.raises(ValueError, match="mask"):
        policy_loss(x, x, x, torch.ones(2, 4), cfg)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(x, x, torch.zeros(3), torch.ones(2, 3), cfg)
    with pytest.raises(ValueError, match="behaviour_logp"):
        policy_loss(x, torch.zeros(3, 2), x, torch.ones(2, 3), cfg)
    with pytest.raises(ValueError, match="prox_logp"):
        policy_loss(x, x, x, torch.ones(2, 3), ppo_cfg(kind="decoupled_ppo"), prox_logp=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="age"):
        policy_loss(x, x, x, torch.ones(2, 3), cfg, age=torch.zeros(3))
    with pytest.raises(ValueError, match="age must be >= 0"):
        policy_loss(x, x, x, torch.ones(2, 3), cfg, age=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match="logp must be 2-D"):
        policy_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3), cfg)
    with pytest.raises(ValueError, match="values"):
        gae(x, torch.zeros(2, 2), torch.ones(2, 3), 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, torch.ones(2, 3), 1.5, 0.9)
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long), "grpo")
    with pytest.raises(ValueError, match="integer"):
        group_advantages(torch.zeros(3), torch.zeros(3), "grpo")
    with pytest.raises(ValueError, match="ref_logp"):
        kl_estimate(x, torch.zeros(3), "k1")
    with pytest.raises(ValueError, match="returns"):
        value_loss(x, x, torch.zeros(2), torch.ones(2, 3), 0.2)
    with pytest.raises(TypeError, match="PolicyLossConfig"):
        policy_loss(x, x, x, torch.ones(2, 3), {"kind": "ppo_clip"})  # type: ignore[arg-type]


def test_policy_loss_config_fields_documented_and_constrained() -> None:
    fields = PolicyLossConfig.model_fields
    assert all(f.description for f in fields.values()), [n for n, f in fields.items() if not f.description]
    cfg = PolicyLossConfig()
    assert (cfg.kind, cfg.eps_low, cfg.eps_high, cfg.agg, cfg.staleness_gamma) == (
        "ppo_clip",
        0.2,
        0.28,
        "token_mean",
        1.0,
    )
    bad: list[dict[str, Any]] = [
        {"eps_low": 1.0},
        {"eps_low": 0.0},
        {"eps_high": 10.5},
        {"dual_clip_c": 1.0},
        {"is_cap": 0.5},
        {"staleness_gamma": 0.0},
        {"staleness_gamma": 1.1},
        {"max_behaviour_divergence": 0.0},
        {"divergence_level": "batch"},
        {"agg": "sum"},
        {"max_tokens": 0},
        {"cispo_eps_low": 1.5},
        {"unknown_field": 1},
    ]
    for kw in bad:
        with pytest.raises(pydantic.ValidationError):
            PolicyLossConfig(**kw)


# =============================================================================================
# 5b. Tests written for surviving mutants (`make mutants`, docs/mutants.md)
# =============================================================================================


def test_error_messages_name_the_argument_at_fault() -> None:
    """A user reads which argument is wrong: each check names it (and the one it is compared with)."""
    x, row = torch.zeros(2, 3, dtype=F64), torch.zeros(3, dtype=F64)
    cases: list[tuple[str, Any]] = [
        (r"^rewards must be 1-D", lambda: group_advantages(x, torch.zeros(2, dtype=torch.long), "grpo")),
        (
            r"^group_ids must be 1-D",
            lambda: group_advantages(row, torch.zeros(1, 3, dtype=torch.long), "grpo"),
        ),
        (r"^turn_rewards must be 2-D", lambda: turn_level_gae(row, row, row, 1.0, 1.0)),
        (r"but turn_rewards has", lambda: turn_level_gae(x, row[None], torch.ones(2, 3), 1.0, 1.0)),
        (r"^turn_mask has .* but turn_rewards", lambda: turn_level_gae(x, x, torch.ones(1, 3), 1.0, 1.0)),
        (r"^values must be 2-D", lambda: value_loss(row, row, row, row, 0.2)),
        (r"^old_values has .* but values", lambda: value_loss(x, row[None], x, torch.ones(2, 3), 0.2)),
        (r"^mask has .* but values", lambda: value_loss(x, x, x, torch.ones(3, 2), 0.2)),
        (r"^logp must be 2-D", lambda: kl_penalty_loss(row, row, row, 0.1, "k1", "token_mean")),
        (r"^entropy must be 2-D", lambda: entropy_loss(row, row, 0.1, "token_mean")),
        (r"^masks\[1\] must be 2-D", lambda: algo.microbatch_weights([x, row], "token_mean")),
        (r"allowed values: token_mean, seq_mean", lambda: algo.microbatch_weights([x], "sum")),  # type: ignore[list-item,arg-type]
        (
            r"^eps must be >= 0",
            lambda: group_advantages(row, torch.zeros(3, dtype=torch.long), "grpo", eps=-1.0),
        ),
        (r"^clip_eps must be > 0 or None", lambda: value_loss(x, x, x, torch.ones(2, 3), 0.0)),
        (r"^coef must be >= 0", lambda: kl_penalty_loss(x, x, torch.ones(2, 3), -0.1, "k1", "token_mean")),
        (r"^rewards must be 2-D", lambda: gae(row, row, row, 0.9, 0.9)),
        (r"^values has .* but rewards", lambda: gae(x, row[None], torch.ones(2, 3), 0.9, 0.9)),
        (r"^mask has .* but rewards", lambda: gae(x, x, torch.ones(3, 2), 0.9, 0.9)),
        (r"^gamma must be in \[0, 1\]", lambda: gae(x, x, torch.ones(2, 3), 1.5, 0.9)),
        (r"^lam must be in \[0, 1\]", lambda: gae(x, x, torch.ones(2, 3), 0.9, 1.5)),
    ]
    for pattern, call in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
            pytest.fail(f"no error for {pattern}")


def test_boundary_values_are_accepted() -> None:
    """The documented bounds are inclusive where the docs say ``>=`` (zero is a valid setting)."""
    row = t64([1.0, 3.0])
    adv, _ = group_advantages(row, torch.zeros(2, dtype=torch.long), "grpo", eps=0.0)
    assert_close(adv, t64([-1 / math.sqrt(2), 1 / math.sqrt(2)]))  # unbiased std of [1, 3] is sqrt(2)
    loss, _ = kl_penalty_loss(t64([[0.0]]), t64([[1.0]]), torch.ones(1, 1), 0.0, "k1", "token_mean")
    assert loss.item() == 0.0


def test_microbatch_weights_make_micro_batch_losses_add_up() -> None:
    a = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]])  # 3 rows, 2 holding 3 tokens
    b = torch.tensor([[True, True, True, True, True]])  # 1 row of 5 tokens (bool)
    assert algo.microbatch_weights([a, b], "token_mean") == [3 / 8, 5 / 8]
    assert algo.microbatch_weights([a, b], "seq_mean_token_mean") == [2 / 3, 1 / 3]
    assert algo.microbatch_weights([a, b], "seq_mean_token_sum_norm") == [3 / 4, 1 / 4]
    assert algo.microbatch_weights([torch.ones(1, 1)], "token_mean") == [1.0]
    assert algo.microbatch_weights([torch.zeros(1, 2), torch.zeros(2, 2)], "token_mean") == [0.0, 0.0]
    # the defining property: the weighted micro-batch losses are the whole batch's loss
    loss = t64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [2.0, 4.0, 8.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0], [1, 1, 1]])
    for agg in AGGS:
        w = algo.microbatch_weights([mask[:3], mask[3:]], agg)  # type: ignore[arg-type]
        parts = [aggregate_loss(loss[:3], mask[:3], agg, 3), aggregate_loss(loss[3:], mask[3:], agg, 3)]  # type: ignore[arg-type]
        assert_close(w[0] * parts[0] + w[1] * parts[1], aggregate_loss(loss, mask, agg, 3))  # type: ignore[arg-type]


def test_value_loss_unclipped_metrics_and_dtypes() -> None:
    # clip_eps None: 0.5 * (v - R)^2, token mean over the mask: 0.5 * (4 + 1) / 2 = 1.25
    v = t64([[1.0, 2.0, 7.0]])
    loss, m = value_loss(v, t64([[0.0, 0.0, 0.0]]), t64([[3.0, 1.0, 0.0]]), torch.tensor([[1, 1, 0]]), None)
    assert_close(loss, t64(1.25))
    assert m == {
        "loss/value": pytest.approx(1.25),
        "value/clip_frac": 0.0,
        "value/pred_mean": pytest.approx(1.5),
        "value/return_mean": pytest.approx(2.0),
    }


def test_kl_and_entropy_losses_honour_max_tokens_mask_and_metric_names() -> None:
    # masked positions hold inf/nan: they must reach neither the value nor the gradient
    logp = t64([[LN(0.5), float("nan")]]).requires_grad_()
    ref = t64([[LN(0.25), float("inf")]])
    loss, m = kl_penalty_loss(logp, ref, torch.tensor([[1, 0]]), 0.1, "k3", "seq_mean_token_sum_norm", 4)
    assert_close(loss, t64(0.1 * (LN(2) - 0.5) / 4))  # k3 = 0.5 - 1 + ln 2, summed / (1 row * 4 tokens)
    assert torch.isfinite(grad_of(loss, logp)).all()  # k3's gradient is exp(ref - logp): nan if not masked
    assert set(m) == {"loss/kl", "kl/ref_k3", "kl/coef"}
    h = t64([[1.0, 2.0], [3.0, 9.0]])
    loss, m = entropy_loss(h, torch.tensor([[1, 1], [1, 0]]), 0.5, "seq_mean_token_sum_norm", 4)
    assert_close(loss, t64(-0.5 * 6 / (2 * 4)))
    assert m == {"loss/entropy": pytest.approx(-0.375), "entropy/mean": pytest.approx(2.0)}


def test_group_metrics_use_population_std() -> None:
    rewards = t64([1.0, 0.0, 3.0])
    _, m = group_advantages(rewards, torch.tensor([0, 0, 1]), "dr_grpo")
    # dr_grpo advantages [0.5, -0.5, 0]: population std sqrt(1/6); rewards population std sqrt(14/9)
    assert m["adv/std"] == pytest.approx(math.sqrt(1 / 6))
    assert m["reward/std"] == pytest.approx(math.sqrt(14 / 9))
    assert m["group/count"] == 2.0


def test_clip_bounds_count_as_inside_for_every_kind() -> None:
    """Ratios exactly at a bound are inside (the docs' convention); exp(log v) == v for these v."""
    lp = t64([[LN(0.75), LN(1.5), LN(2.0)]])
    zero, adv, mask = torch.zeros(1, 3, dtype=F64), t64([[1.0, -1.0, 1.0]]), torch.tensor([[1, 1, 0]])
    for cfg, prox in [
        (ppo_cfg(eps_low=0.25, eps_high=0.5), None),
        (ppo_cfg(kind="decoupled_ppo", eps_low=0.25, eps_high=0.5), zero),
        (ppo_cfg(kind="cispo", cispo_eps_low=0.25, cispo_eps_high=0.5), None),
    ]:
        _, m = policy_loss(lp, zero, adv, mask, cfg, prox_logp=prox)
        assert m["policy/clip_frac"] == 0.0, cfg.kind
    _, m = policy_loss(lp, zero, adv, torch.tensor([[0, 0, 1]]), ppo_cfg(kind="tis", is_cap=2.0))
    assert m["policy/clip_frac"] == 0.0
    # the divergence filter keeps a token whose divergence equals the bound (token and sequence level)
    for level in ("token", "sequence"):
        cfg = ppo_cfg(max_behaviour_divergence=0.5, divergence_level=level)
        kept = algo.policy_loss_mask(t64([[0.5, -0.5]]), zero[:, :2], torch.ones(1, 2), cfg)
        assert kept.tolist() == [[True, True]], level


def test_dual_clip_only_where_the_advantage_is_negative_and_strictly_below() -> None:
    # c = 2: A = -1 at ratio 2 gives loss max(2, 1.5) = 2 = -c*A: not strictly below, not counted
    cfg = ppo_cfg(eps_low=0.25, eps_high=0.5, dual_clip_c=2.0)
    _, m = policy_loss(t64([[LN(2.0)]]), t64([[0.0]]), t64([[-1.0]]), torch.ones(1, 1), cfg)
    assert m["policy/dual_clip_frac"] == 0.0
    # A > 0 never dual-clips, even where -c*A lies below the PPO loss
    _, m = policy_loss(t64([[0.0]]), t64([[0.0]]), t64([[0.5]]), torch.ones(1, 1), cfg)
    assert m["policy/dual_clip_frac"] == 0.0


def test_ratio_metrics_with_a_single_valid_token() -> None:
    _, m = policy_loss(
        t64([[LN(1.5), 9.0]]), t64([[0.0, 0.0]]), t64([[1.0, 1.0]]), torch.tensor([[1, 0]]), ppo_cfg()
    )
    assert m["policy/ratio_max"] == pytest.approx(1.5) and m["policy/ratio_min"] == pytest.approx(1.5)


def test_kl_mean_gradient_ignores_masked_positions() -> None:
    logp = t64([[LN(0.5), float("nan")]]).requires_grad_()
    ref = t64([[LN(0.25), float("inf")]])
    for kind in ("k1", "k2", "k3"):
        out = kl_mean(logp, ref, kind, torch.tensor([[1, 0]]))  # type: ignore[arg-type]
        assert torch.isfinite(out) and torch.isfinite(grad_of(out, logp)).all(), kind


def test_batch_mean_baseline_of_one_reward_is_zero() -> None:
    assert torch.equal(batch_mean_baseline(t64([3.0])), t64([0.0]))


# =============================================================================================
# 6. Purity
# =============================================================================================

ALGO_DIR = Path(algo.__file__).parent
ALLOWED_IMPORT_ROOTS = {
    "torch",
    "typing",
    "math",
    "dataclasses",
    "collections",
    "pydantic",
    "__future__",
    "importlib",  # the package's lazy names (PEP 562 ``__getattr__``)
}


def test_algo_imports_only_allowed_modules() -> None:
    files = sorted(ALGO_DIR.glob("*.py"))
    assert {f.name for f in files} >= {
        "__init__.py",
        "returns.py",
        "advantages.py",
        "losses.py",
        "kl.py",
        "config.py",
    }
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:  # relative import inside asyncrl.algo
                    assert node.level == 1, f"{f.name}: relative import leaves asyncrl.algo"
                    continue
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert roots <= ALLOWED_IMPORT_ROOTS, (
                f"{f.name}:{node.lineno} imports {roots - ALLOWED_IMPORT_ROOTS}"
            )


PURITY_SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockOtherAsyncrl(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith("asyncrl.") and not (name == "asyncrl.algo" or name.startswith("asyncrl.algo.")):
                raise ImportError(f"blocked by purity test: {name}")
            return None

    sys.meta_path.insert(0, BlockOtherAsyncrl())

    try:  # the blocker itself must work, or this test proves nothing
        import asyncrl.trainer  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("blocker failed: asyncrl.trainer was importable")

    import torch
    import asyncrl.algo as algo

    adv, ret = algo.gae(torch.ones(1, 3), torch.zeros(1, 3), torch.tensor([[1, 0, 1]]), 1.0, 1.0)
    assert adv.tolist() == [[2.0, 0.0, 1.0]], adv
    g, _ = algo.group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), "rloo")
    assert g.tolist() == [1.0, -1.0], g
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, metrics = algo.policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), algo.PolicyLossConfig())
    loss.backward()
    assert isinstance(metrics["loss/policy"], float)
    others = sorted(m for m in sys.modules if m.startswith("asyncrl.") and not m.startswith("asyncrl.algo"))
    assert not others, others
    print("PURE-OK")
    """
)


def test_algo_importable_with_other_asyncrl_modules_blocked() -> None:
    src_root = ALGO_DIR.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src_root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", PURITY_SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "PURE-OK" in proc.stdout


def _type_checking_modules() -> list[str]:
    """The modules star-imported under ``if TYPE_CHECKING:`` in ``algo/__init__.py`` (what mypy reads)."""
    tree = ast.parse((ALGO_DIR / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    assert all(isinstance(n, ast.ImportFrom) and [a.name for a in n.names] == ["*"] for n in block.body)
    return [str(n.module) for n in block.body if isinstance(n, ast.ImportFrom)]


def _exporters() -> list[ModuleType]:
    """``algo.config`` (exported at once) and the lazily exported modules, in order."""
    return [importlib.import_module(f"asyncrl.algo.{m}") for m in ("config", *algo.MODULES)]


def test_mypy_reads_the_same_modules_the_package_exports_lazily() -> None:
    """Each name is listed once, in its module's ``__all__``; mypy reads it through the star imports."""
    assert _type_checking_modules() == list(algo.MODULES)
    exported = [n for mod in _exporters() for n in mod.__all__]
    assert algo.__all__ == exported
    assert len(exported) == len(set(exported)), "a name exported by two modules: one would hide the other"


def test_every_exported_name_resolves_to_its_module() -> None:
    for mod in _exporters():
        for name in mod.__all__:
            assert getattr(algo, name) is vars(mod)[name], name
    namespace: dict[str, object] = {}
    exec("from asyncrl.algo import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(algo.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        algo.nonexistent  # noqa: B018


def test_importing_the_package_does_not_import_torch() -> None:
    src_root = ALGO_DIR.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src_root), os.environ.get("PYTHONPATH", "")])}
    script = (
        "import asyncrl.algo, sys; assert 'torch' not in sys.modules, 'torch imported'\n"
        "from asyncrl.algo import PolicyLossConfig, config  # the eager names and a submodule\n"
        "assert not hasattr(asyncrl.algo, '__wrapped__') and not hasattr(asyncrl.algo, 'losses')  # probes\n"
        "import asyncrl.config; assert 'torch' not in sys.modules, 'torch imported'\n"
        "from asyncrl.algo import gae; assert gae.__module__ == 'asyncrl.algo.returns'\n"
        "for name in asyncrl.algo.__all__: getattr(asyncrl.algo, name)  # resolves in a fresh process too"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
