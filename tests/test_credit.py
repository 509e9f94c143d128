"""Credit assignment: the segment maths (vs loop references), the strategies on hand-built
trajectories, the value model, and the samples / inspection files."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import msgspec
import pytest
import torch
from torch.testing import assert_close

from asyncrl.algo import (
    brier_score,
    roc_auc,
    spearman,
    turn_group_advantages,
    value_delta_credit,
)
from asyncrl.config import load_config
from asyncrl.credit.assign import CreditAssigner, segment_spans
from asyncrl.records import Task, Trajectory, Turn, groups_of

# ----------------------------------------------------------------------------------------- references


def ref_value_delta(vb, va, target, mask, eps, ratio):  # type: ignore[no-untyped-def]
    out = []
    for b in range(len(target)):
        ks = [k for k in range(len(mask[b])) if mask[b][k]]
        d = {k: va[b][k] - vb[b][k] for k in ks}
        s = sum(d.values())
        big = sum(abs(x) for x in d.values())
        row = [0.0] * len(mask[b])
        for k in ks:
            if abs(s) >= max(eps, ratio * big) and s * target[b] > 0:
                row[k] = target[b] * d[k] / s
            else:
                row[k] = target[b] / len(ks)
        out.append(row)
    return out


def ref_turn_group(ep, ret, states, mode, w):  # type: ignore[no-untyped-def]
    out = []
    for j in range(len(ep)):
        members = [i for i in range(len(ep)) if states[i] == states[j]]
        rs = [ret[i] for i in members]
        if len(members) == 1 or max(rs) == min(rs):
            a = 0.0
        else:
            mean = sum(rs) / len(rs)
            if mode == "grpo":
                std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))
                a = (ret[j] - mean) / (std + 1e-6)
            elif mode == "dr_grpo":
                a = ret[j] - mean
            else:
                a = ret[j] - (sum(rs) - ret[j]) / (len(rs) - 1)
        out.append(ep[j] + w * a)
    return out


# ----------------------------------------------------------------------------------------- algo


def test_value_delta_hand_computed_sums_to_target() -> None:
    # d = [0.1, 0.3, 0.2] → S = 0.6; target 1.2 → c = [0.2, 0.6, 0.4]
    vb = torch.tensor([[0.2, 0.3, 0.6]])
    va = torch.tensor([[0.3, 0.6, 0.8]])
    c, m = value_delta_credit(vb, va, torch.tensor([1.2]), torch.ones(1, 3), eps=0.05, min_ratio=0.25)
    assert_close(c, torch.tensor([[0.2, 0.6, 0.4]]))
    assert m["credit/guard_frac"] == 0.0


def test_value_delta_guards_fall_back_to_uniform() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    vb = torch.tensor([[0.5, 0.5, 9.0], [0.1, 0.9, 0.0], [0.2, 0.5, 0.0]])
    va = torch.tensor(
        [
            [0.5, 0.51, float("nan")],  # S = 0.01 < eps: near-zero guard (nan in padding is harmless)
            [0.9, 0.05, 0.1],  # d = [.8, -.85, .1], S = .05, Σ|d| = 1.75: cancelling guard
            [0.5, 0.9, 0.0],  # S = 0.7 > 0 but target < 0: sign guard
        ]
    )
    target = torch.tensor([1.0, 0.9, -0.6])
    c, m = value_delta_credit(vb, va, target, mask, eps=0.05, min_ratio=0.25)
    assert_close(c, torch.tensor([[0.5, 0.5, 0.0], [0.3, 0.3, 0.3], [-0.3, -0.3, 0.0]]))
    assert m["credit/guard_frac"] == 1.0


def test_value_delta_matches_loop_reference_and_sums_to_target() -> None:
    g = torch.Generator().manual_seed(0)
    B, K = 64, 6
    vb, va = torch.rand(B, K, generator=g), torch.rand(B, K, generator=g)
    mask = torch.rand(B, K, generator=g) > 0.3
    mask[0] = False  # a row without segments
    target = torch.randn(B, generator=g)
    c, _ = value_delta_credit(vb, va, target, mask, eps=0.05, min_ratio=0.25)
    ref = torch.tensor(ref_value_delta(vb.tolist(), va.tolist(), target.tolist(), mask.tolist(), 0.05, 0.25))
    assert_close(c, ref)
    has = mask.any(1)
    assert_close(c.sum(1)[has], target[has])
    assert (c[~mask] == 0).all()
    assert (c.abs() <= target.abs()[:, None] / 0.25 + 1e-5).all()  # the guard bounds every credit


def test_value_delta_edges_metrics_and_errors() -> None:
    one = torch.ones(1, 2)
    # |S| equal to eps is enough (>=): d = [0.125, 0.375], S = 0.5 = eps -> rescaled, not uniform
    c, _ = value_delta_credit(
        torch.zeros(1, 2), torch.tensor([[0.125, 0.375]]), torch.tensor([1.0]), one, 0.5, 0.0
    )
    assert_close(c, torch.tensor([[0.25, 0.75]]))
    # S = 0 with no guard margins (eps = min_ratio = 0): still uniform, never a division by zero
    c, _ = value_delta_credit(
        torch.zeros(1, 2), torch.tensor([[0.5, -0.5]]), torch.tensor([1.0]), one, 0.0, 0.0
    )
    assert_close(c, torch.tensor([[0.5, 0.5]]))
    # one segment under the sign guard gets the whole target; a row without segments is not counted
    vb, va = torch.tensor([[0.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.5, 0.0], [0.5, 0.0]])
    mask = torch.tensor([[1, 0], [0, 0]])
    c, m = value_delta_credit(vb, va, torch.tensor([-1.0, 1.0]), mask, 0.05, 0.25)
    assert_close(c, torch.tensor([[-1.0, 0.0], [0.0, 0.0]]))
    assert m == {"credit/guard_frac": 1.0, "credit/raw_sum_mean": 0.5}
    # nothing to distribute (target 0 everywhere): both metrics 0
    _, m = value_delta_credit(vb, va, torch.zeros(2), mask, 0.05, 0.25)
    assert m == {"credit/guard_frac": 0.0, "credit/raw_sum_mean": 0.0}
    row, x = torch.zeros(2), torch.zeros(2, 2)
    cases = [
        (r"^v_before must be 2-D", lambda: value_delta_credit(row, row, row, row, 0.1, 0.1)),
        (r"^v_after has .* but v_before", lambda: value_delta_credit(x, torch.zeros(1, 2), row, x, 0.1, 0.1)),
        (r"^seg_mask has .* but v_before", lambda: value_delta_credit(x, x, row, torch.ones(2, 1), 0.1, 0.1)),
        (r"^target must be 1-D", lambda: value_delta_credit(x, x, x, x, 0.1, 0.1)),
        (
            r"^target has 3 rows, v_before has 2",
            lambda: value_delta_credit(x, x, torch.zeros(3), x, 0.1, 0.1),
        ),
        (r"^eps and min_ratio must be >= 0", lambda: value_delta_credit(x, x, row, x, -0.1, 0.1)),
        (r"^eps and min_ratio must be >= 0", lambda: value_delta_credit(x, x, row, x, 0.1, -0.1)),
        (r"^episode_adv must be 1-D", lambda: turn_group_advantages(x, x, x.long(), "grpo")),
        (
            r"^step_returns has .* but episode_adv",
            lambda: turn_group_advantages(row, torch.zeros(3), row.long(), "grpo"),
        ),
        (
            r"^state_ids has .* but episode_adv",
            lambda: turn_group_advantages(row, row, torch.zeros(3).long(), "grpo"),
        ),
    ]
    for pattern, call in cases:
        with pytest.raises(ValueError, match=pattern):
            call()
            pytest.fail(f"no error for {pattern}")


def test_brier_and_spearman_small_inputs_and_errors() -> None:
    assert brier_score(torch.zeros(0), torch.zeros(0)) == 0.0
    assert brier_score(torch.tensor([0.25]), torch.tensor([1.0])) == 0.5625
    assert math.isnan(spearman(torch.tensor([1.0]), torch.tensor([2.0])))
    assert spearman(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 5.0])) == pytest.approx(1.0)
    row, x = torch.zeros(2), torch.zeros(2, 2)
    for pattern, call in [
        (r"^prob must be 1-D", lambda: brier_score(x, x)),
        (r"^label has .* but prob", lambda: brier_score(row, torch.zeros(3))),
        (r"^x must be 1-D", lambda: spearman(x, x)),
        (r"^y has .* but x", lambda: spearman(row, torch.zeros(3))),
    ]:
        with pytest.raises(ValueError, match=pattern):
            call()
            pytest.fail(f"no error for {pattern}")


def test_turn_group_default_weight_and_metric_names() -> None:
    # two steps share a state (returns 1, 0: Dr.GRPO step advantages ±0.5), one is alone
    out, m = turn_group_advantages(
        torch.tensor([0.25, 0.25, 1.0]), torch.tensor([1.0, 0.0, 3.0]), torch.tensor([7, 7, 8]), "dr_grpo"
    )
    assert_close(out, torch.tensor([0.75, -0.25, 1.0]))  # weight 1 by default
    assert m == {
        "credit/step_groups": 2.0,
        "credit/step_group_size_mean": 1.5,
        "credit/step_frac_singleton": 0.5,
        "credit/step_adv_std": pytest.approx(math.sqrt(1 / 6)),
    }


def test_turn_group_matches_loop_reference() -> None:
    g = torch.Generator().manual_seed(1)
    N = 40
    ep = torch.randn(N, generator=g)
    ret = torch.randint(0, 3, (N,), generator=g).float()
    states = torch.randint(0, 8, (N,), generator=g)
    for mode in ("grpo", "dr_grpo", "rloo"):
        out, m = turn_group_advantages(ep, ret, states, mode, weight=0.7)  # type: ignore[arg-type]
        ref = ref_turn_group(ep.tolist(), ret.tolist(), states.tolist(), mode, 0.7)
        assert_close(out, torch.tensor(ref), rtol=1e-5, atol=1e-5)
        assert m["credit/step_groups"] == len(set(states.tolist()))


def test_calibration_and_rank_metrics_match_references() -> None:
    g = torch.Generator().manual_seed(2)
    p = torch.rand(50, generator=g).round(decimals=1)  # ties on purpose
    y = (torch.rand(50, generator=g) < p).float()
    assert brier_score(p, y) == pytest.approx(
        sum((a - b) ** 2 for a, b in zip(p.tolist(), y.tolist(), strict=True)) / 50
    )
    pos = [a for a, b in zip(p.tolist(), y.tolist(), strict=True) if b]
    neg = [a for a, b in zip(p.tolist(), y.tolist(), strict=True) if not b]
    pairs = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    assert roc_auc(p, y) == pytest.approx(pairs / (len(pos) * len(neg)))
    assert math.isnan(roc_auc(p, torch.ones(50)))
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 20, 30, 40])) == pytest.approx(1.0)
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([4.0, 3, 2, 1])) == pytest.approx(-1.0)
    # ties: ranks x = [1, 2.5, 2.5, 4], y = [1, 2, 3, 4] → ρ = 4.5 / sqrt(4.5 · 5)
    assert spearman(torch.tensor([1.0, 2, 2, 3]), torch.tensor([1.0, 2, 3, 4])) == pytest.approx(
        4.5 / math.sqrt(4.5 * 5)
    )
    assert math.isnan(spearman(torch.ones(4), torch.arange(4.0)))


# ----------------------------------------------------------------------------------------- strategies


def make_traj(
    turns: list[tuple[list[int], list[int], float]], reward: float, group: str, prompt=(1, 2)
) -> Trajectory:  # type: ignore[no-untyped-def]
    """turns: (model tokens, observation tokens, process reward)."""
    out = [Turn(role="env", token_ids=list(prompt))]
    for model, obs, p in turns:
        out.append(
            Turn(role="model", token_ids=model, logprobs=[0.0] * len(model), version=0, process_reward=p)
        )
        if obs:
            out.append(Turn(role="tool", token_ids=obs))
    return Trajectory(
        id=f"{group}-{random.random()}",
        task=Task(id=group, task_type="t"),
        turns=out,
        final_reward=reward,
        outcome="success" if reward > 0 else "failure",
        group_id=group,
    )


def tensors(trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    T = max(len(t.token_ids()) for t in trajs)
    ids = torch.zeros(len(trajs), T, dtype=torch.long)
    attn = torch.zeros(len(trajs), T, dtype=torch.long)
    mask = torch.zeros(len(trajs), T)
    for i, t in enumerate(trajs):
        n = len(t.token_ids())
        ids[i, :n] = torch.tensor(t.token_ids())
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask(), dtype=torch.float32)
    return ids, attn, mask


class FixedValues:
    """Stands in for the value model: V at position t is ``table[i][t]`` (or a constant)."""

    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def predict(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        return self.values


def assigner(strategy: str, *extra: str) -> CreditAssigner:
    cfg = load_config(None, [f"credit.strategy={strategy}", "credit.process_weight=0", *extra])
    a = CreditAssigner.__new__(CreditAssigner)
    a.cfg, a.value, a.last_groups, a._old_values = cfg.credit, None, [], None
    return a


def batch_two_groups() -> list[Trajectory]:
    a1 = make_traj([([5, 6], [7], 0.1), ([8], [9, 9], 0.2), ([3], [], 0.0)], 1.0, "g1")
    a2 = make_traj([([5, 6], [7], 0.1), ([4, 4], [9], -0.1)], 0.0, "g1")
    b1 = make_traj([([6], [7], 0.0)], 1.0, "g2", prompt=(1, 3))
    b2 = make_traj([([6], [7], 0.0), ([6], [], 0.0)], 1.0, "g2", prompt=(1, 3))
    return [a1, a2, b1, b2]


def test_outcome_groups_by_group_id_and_masks_non_model_tokens() -> None:
    trajs = batch_two_groups()
    ids, attn, mask = tensors(trajs)
    adv, m = assigner("outcome", "credit.baseline=dr_grpo").advantages(groups_of(trajs), ids, attn, mask)
    # group g1 rewards (1, 0) → ±0.5; group g2 is constant → 0
    assert_close(adv[0][mask[0] > 0], torch.full((4,), 0.5))
    assert_close(adv[1][mask[1] > 0], torch.full((4,), -0.5))
    assert (adv[2:] == 0).all() and (adv[mask == 0] == 0).all()
    assert m["group/count"] == 2 and m["group/frac_constant"] == 0.5


def test_value_delta_segment_credits_sum_to_outcome_advantage() -> None:
    trajs = batch_two_groups()
    ids, attn, mask = tensors(trajs)
    a = assigner("value_delta", "credit.baseline=dr_grpo")
    T = ids.shape[1]
    values = torch.full((4, T), 0.5)
    # trajectory 0: segments start at 2, 5, 8; boundaries (last token before) 1, 4, 7 → V = 0.5, 0.7, 0.6
    values[0, 4], values[0, 7] = 0.7, 0.6  # terminal V(after last) = reward 1
    a.value = FixedValues(values)  # type: ignore[assignment]
    adv, m = a.advantages(groups_of(trajs), ids, attn, mask)
    assert (adv[mask == 0] == 0).all()
    spans = segment_spans(trajs[0])
    seg_adv = [float(adv[0, s]) for s, *_ in spans]
    # d = [0.2, -0.1, 0.4], S = 0.5, A = 0.5 → c = [0.2, -0.1, 0.4]; advantage = n·c = [0.6, -0.3, 1.2]
    assert seg_adv == pytest.approx([0.6, -0.3, 1.2], abs=1e-6)
    assert sum(seg_adv) / len(seg_adv) == pytest.approx(0.5)  # mean segment advantage = outcome advantage
    # the samples record V before/after (terminal = reward) and the credit
    rec = a.last_groups[0].samples[0].segments
    assert [r.v_after for r in rec][-1] == 1.0 and rec[1].v_before == pytest.approx(0.7)
    assert [r.credit for r in rec] == pytest.approx(seg_adv)
    # trajectory 1: S = 0 − 0.5 agrees with A = −0.5 (no guard); group g2 has A = 0 (nothing to distribute)
    assert m["credit/guard_frac"] == 0.0
    assert (adv[2:] == 0).all()


def test_value_delta_with_flat_values_reduces_to_outcome() -> None:
    trajs = batch_two_groups()
    ids, attn, mask = tensors(trajs)
    out = assigner("outcome", "credit.baseline=dr_grpo").advantages(groups_of(trajs), ids, attn, mask)[0]
    a = assigner("value_delta", "credit.baseline=dr_grpo")
    T = ids.shape[1]
    # V equals the reward everywhere: S = 0 → guard → uniform = outcome advantage on every token
    a.value = FixedValues(torch.tensor([t.final_reward for t in trajs])[:, None].expand(4, T))  # type: ignore[assignment]
    adv, m = a.advantages(groups_of(trajs), ids, attn, mask)
    assert_close(adv, out)
    assert m["credit/guard_frac"] == 1.0


def test_turn_group_groups_identical_states_within_a_task_group() -> None:
    trajs = batch_two_groups()
    ids, attn, mask = tensors(trajs)
    a = assigner("turn_group", "credit.baseline=dr_grpo", "credit.turn_group_weight=1.0")
    adv, m = a.advantages(groups_of(trajs), ids, attn, mask)
    # step states: g1 turn 1 (shared prompt) ×2, g1 turn 2 after the identical first turn ×2,
    # g1 a1 turn 3, g2 turn 1 ×2, g2 b2 turn 2 → 5 step groups
    assert m["credit/step_groups"] == 5
    # g1: episode adv ±0.5; step group returns (γ=1, α=0) = (1, 0) → ±0.5 added on turns 1 and 2
    s0 = segment_spans(trajs[0])
    s1 = segment_spans(trajs[1])
    assert [float(adv[0, s]) for s, *_ in s0] == pytest.approx([1.0, 1.0, 0.5])
    assert [float(adv[1, s]) for s, *_ in s1] == pytest.approx([-1.0, -1.0])
    assert (adv[2:] == 0).all()


def test_process_strategy_adds_centred_reward_to_go() -> None:
    trajs = batch_two_groups()[:2]
    ids, attn, mask = tensors(trajs)
    a = assigner("process", "credit.baseline=dr_grpo", "credit.process_weight=1.0")
    adv, _ = a.advantages(groups_of(trajs), ids, attn, mask)
    # to-go: a1 [0.3, 0.2, 0.0], a2 [0.0, -0.1]; centre = 0.4 / 5 = 0.08
    s0 = [float(adv[0, s]) for s, *_ in segment_spans(trajs[0])]
    assert s0 == pytest.approx([0.5 + 0.22, 0.5 + 0.12, 0.5 - 0.08])


def test_process_rewards_are_clamped_discounted_and_centred() -> None:
    # one group, equal outcomes (episode advantage 0): only the process term remains.
    # a: rewards 1.5, -1.5 clamp to 1, -1; γ = 0.5: to-go [0.5, -1]; b: [0.8]; centre 0.1
    a_t = make_traj([([5], [7], 1.5), ([6], [], -1.5)], 1.0, "g")
    b_t = make_traj([([5], [], 0.8)], 1.0, "g")
    ids, attn, mask = tensors([a_t, b_t])
    extra = ("credit.baseline=dr_grpo", "credit.gamma=0.5")
    adv, m = assigner("process", *extra, "credit.process_weight=1.0").advantages(
        groups_of([a_t, b_t]), ids, attn, mask
    )
    assert [float(adv[0, s]) for s, *_ in segment_spans(a_t)] == pytest.approx([0.4, -1.1])
    assert float(adv[1, 2]) == pytest.approx(0.7)
    assert m["adv/process_mean_to_go"] == pytest.approx(0.1)
    # no process term without weight, or for another strategy
    for strategy, w in (("process", "0"), ("outcome", "1.0")):
        adv, m = assigner(strategy, *extra, f"credit.process_weight={w}").advantages(
            groups_of([a_t, b_t]), ids, attn, mask
        )
        assert (adv == 0).all() and "adv/process_mean_to_go" not in m
    bare = [make_traj([], 1.0, "g")]
    ids, attn, mask = tensors(bare)
    _, m = assigner("process", "credit.process_weight=1.0").advantages(groups_of(bare), ids, attn, mask)
    assert m["adv/process_mean_to_go"] == 0.0


def test_turn_level_gae_uses_value_before_each_segment() -> None:
    trajs = batch_two_groups()[:1]
    ids, attn, mask = tensors(trajs)
    a = assigner("gae", "credit.gae_lambda=1.0")
    a.value = FixedValues(torch.full(ids.shape, 0.25))  # type: ignore[assignment]
    adv, m = a.advantages(groups_of(trajs), ids, attn, mask)
    # λ = γ = 1, no process rewards: A_k = R − V_k = 0.75 on every segment
    assert [float(adv[0, s]) for s, *_ in segment_spans(trajs[0])] == pytest.approx([0.75] * 3)
    assert "value/brier" in m and m["value/brier"] == pytest.approx(0.75**2)


def test_token_level_gae_rewards_last_token_and_skips_observations() -> None:
    trajs = batch_two_groups()[:1]
    ids, attn, mask = tensors(trajs)
    a = assigner("gae", "credit.gae_level=token", "credit.gae_lambda=1.0")
    a.value = FixedValues(torch.full(ids.shape, 0.25))  # type: ignore[assignment]
    adv, _ = a.advantages(groups_of(trajs), ids, attn, mask)
    # λ = γ = 1, V ≡ 0.25, reward 1 on the last model token: A_t = 1 − 0.25 on every model token
    assert_close(adv[0][mask[0] > 0], torch.full((4,), 0.75))
    assert (adv[0][mask[0] == 0] == 0).all()


def test_token_level_gae_adds_process_rewards_and_reads_the_value_before_each_token() -> None:
    # tokens [1, 2 | 5, 6 | 7 | 8]: segment 1 (process reward 0.5) ends at token 3, segment 2 (0.25)
    # at token 5, which also gets the final reward 1. λ = γ = 1: A_t = G_t − V(state before t).
    trajs = [make_traj([([5, 6], [7], 0.5), ([8], [], 0.25)], 1.0, "g")]
    ids, attn, mask = tensors(trajs)
    a = assigner("gae", "credit.gae_level=token", "credit.gae_lambda=1.0", "credit.process_weight=1.0")
    a.value = FixedValues(torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]]))  # type: ignore[assignment]
    adv, _ = a.advantages(groups_of(trajs), ids, attn, mask)
    # G = [1.75, 1.75, ·, 1.25] on tokens 2, 3, 5; V before them = values at 1, 2, 4
    assert_close(adv[0], torch.tensor([0.0, 0.0, 1.65, 1.55, 0.0, 0.85]))


def test_value_delta_adds_the_centred_process_reward_to_go() -> None:
    trajs = batch_two_groups()[:2]  # process rewards a1 [0.1, 0.2, 0.0], a2 [0.1, -0.1]
    ids, attn, mask = tensors(trajs)
    adv = {}
    for w in ("0", "1.0"):
        a = assigner("value_delta", "credit.baseline=dr_grpo", f"credit.process_weight={w}")
        a.value = FixedValues(torch.full(ids.shape, 0.5))  # type: ignore[assignment]
        adv[w], _ = a.advantages(groups_of(trajs), ids, attn, mask)
    # to-go a1 [0.3, 0.2, 0.0], a2 [0.0, -0.1]; centre 0.4 / 5 = 0.08
    extra = [float(adv["1.0"][0, s] - adv["0"][0, s]) for s, *_ in segment_spans(trajs[0])]
    assert extra == pytest.approx([0.22, 0.12, -0.08])
    extra = [float(adv["1.0"][1, s] - adv["0"][1, s]) for s, *_ in segment_spans(trajs[1])]
    assert extra == pytest.approx([-0.08, -0.18])
    # a batch without model turns: nothing to centre, no division by zero
    bare = [make_traj([], 1.0, "g")]
    ids, attn, mask = tensors(bare)
    a = assigner("value_delta", "credit.process_weight=1.0")
    a.value = FixedValues(torch.full(ids.shape, 0.5))  # type: ignore[assignment]
    out, _ = a.advantages(groups_of(bare), ids, attn, mask)
    assert (out == 0).all()


def test_value_calibration_reads_the_value_before_each_segment() -> None:
    # one-token prompts: segments start at tokens 1 and 3 (success) and 1 (failure)
    win = make_traj([([5], [7], 0.0), ([6], [], 0.0)], 1.0, "g", prompt=(1,))
    lose = make_traj([([5], [], 0.0)], 0.0, "g", prompt=(1,))
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])
    a = assigner("value_delta")
    m = a._calibration([win, lose], [segment_spans(win), segment_spans(lose)], values)
    # probabilities 0.1, 0.3 (labels 1) and 0.5 (label 0): the failure ranks above both successes
    assert m == {
        "value/brier": pytest.approx((0.81 + 0.49 + 0.25) / 3),
        "value/segments": 3.0,
        "value/auc": 0.0,
        "value/mean": pytest.approx(0.3),
    }
    m = a._calibration([win], [segment_spans(win)], values[:1])
    assert "value/auc" not in m  # a single class: AUC undefined, not reported


def test_tree_credit_of_an_empty_batch_is_empty() -> None:
    from asyncrl.credit.tree import tree_segment_advantages

    assert tree_segment_advantages([], [], "grpo") == ([], [], {})


def test_reward_to_go_hand_computed() -> None:
    from asyncrl.credit.assign import reward_to_go

    assert reward_to_go([1.0, 2.0, 3.0], 0.5) == [2.75, 3.5, 3.0]  # 1 + 0.5 * (2 + 0.5 * 3)
    assert reward_to_go([], 0.5) == []


def test_turn_level_gae_adds_process_rewards_and_reads_the_value_before_each_segment() -> None:
    # one-token prompt: segments start at tokens 1 and 3, process rewards 0.5 and 0.25, outcome 1
    trajs = [make_traj([([5], [7], 0.5), ([6], [], 0.25)], 1.0, "g", prompt=(1,))]
    ids, attn, mask = tensors(trajs)
    a = assigner("gae", "credit.gae_lambda=1.0", "credit.process_weight=1.0")
    a.value = FixedValues(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))  # type: ignore[assignment]
    adv, m = a.advantages(groups_of(trajs), ids, attn, mask)
    # rewards [0.5, 0.25 + 1]; λ = γ = 1: A_k = G_k − V(before k) = [1.75 − 0.1, 1.25 − 0.3]
    assert [float(adv[0, s]) for s, *_ in segment_spans(trajs[0])] == pytest.approx([1.65, 0.95])
    assert m["credit/gae_adv_mean"] == pytest.approx(1.3)
    bare = [make_traj([], 1.0, "g")]
    ids, attn, mask = tensors(bare)
    a.value = FixedValues(torch.full(ids.shape, 0.5))  # type: ignore[assignment]
    assert a.advantages(groups_of(bare), ids, attn, mask)[1]["credit/gae_adv_mean"] == 0.0


def test_tree_and_turn_group_take_process_credit_weights_and_the_batch_mean_baseline() -> None:
    trajs = batch_two_groups()[:2]
    ids, attn, mask = tensors(trajs)
    spans = [segment_spans(t) for t in trajs]

    def seg(strategy: str, *extra: str) -> list[list[float]]:
        adv, _ = assigner(strategy, *extra).advantages(groups_of(trajs), ids, attn, mask)
        return [[float(adv[i, s]) for s, *_ in sp] for i, sp in enumerate(spans)]

    # tree: the same centred process reward-to-go as value_delta is added to each segment
    plain, proc = (
        seg("tree", "credit.baseline=dr_grpo"),
        seg("tree", "credit.baseline=dr_grpo", "credit.process_weight=1.0"),
    )
    assert [b - a for a, b in zip(plain[0], proc[0], strict=True)] == pytest.approx([0.22, 0.12, -0.08])
    # `batch_mean` has no per-group form: tree and turn_group use Dr.GRPO's centring instead
    assert seg("tree", "credit.baseline=batch_mean") == plain
    assert seg("turn_group", "credit.baseline=batch_mean") == seg("turn_group", "credit.baseline=dr_grpo")
    assert seg("turn_group", "credit.baseline=grpo") != seg("turn_group", "credit.baseline=dr_grpo")
    # turn_group returns γ^(n−1−k)·R + α·(process to-go): γ = 0.5, α = 1, step weight 0.5.
    # g1 turn 1: a1 0.25·1 + 0.2 = 0.45, a2 0 + 0.05 → ±0.2; turn 2: a1 0.5 + 0.2, a2 −0.1 → ±0.4;
    # a1's turn 3 is alone (0). Episode advantages ±0.5.
    got = seg(
        "turn_group",
        "credit.baseline=dr_grpo",
        "credit.gamma=0.5",
        "credit.process_weight=1.0",
        "credit.turn_group_weight=0.5",
    )
    assert got[0] == pytest.approx([0.6, 0.7, 0.5]) and got[1] == pytest.approx([-0.6, -0.7])


class SpyValues(FixedValues):
    """A value model that records what it is asked to predict and train on."""

    def __init__(self, values: torch.Tensor) -> None:
        super().__init__(values)
        self.predicted: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.trained: list[tuple[torch.Tensor, ...]] = []

    def predict(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        self.predicted.append((ids, attn))
        return self.values.clone()

    def train(self, *args: torch.Tensor) -> dict[str, float]:
        self.trained.append(args)
        return {"value/loss": 0.0}


def test_value_training_targets_each_position_before_a_model_token() -> None:
    trajs = batch_two_groups()[:2]  # final rewards 1 and 0
    ids, attn, mask = tensors(trajs)
    a = assigner("value_delta")
    assert a.train_value(trajs, ids, attn, mask) == {}  # no value model: nothing to train
    spy = SpyValues(torch.full(ids.shape, 0.5))
    a.value = spy  # type: ignore[assignment]
    a.advantages(groups_of(trajs), ids, attn, mask)
    (seen,) = spy.predicted
    assert seen[0] is ids and seen[1] is attn
    assert a.train_value(trajs, ids, attn, mask) == {"value/loss": 0.0}
    (args,) = spy.trained
    t_ids, t_attn, vmask, targets, old = args
    assert t_ids is ids and t_attn is attn
    assert vmask[:, :-1].tolist() == mask[:, 1:].tolist() and (vmask[:, -1] == 0).all()
    assert targets.tolist() == [[1.0] * ids.shape[1], [0.0] * ids.shape[1]]
    assert len(spy.predicted) == 1 and torch.equal(
        old, torch.full(ids.shape, 0.5)
    )  # the values already predicted
    a._old_values = None  # a batch the assigner has not seen: predicted now
    a.train_value(trajs, ids, attn, mask)
    assert len(spy.predicted) == 2 and spy.predicted[1][0] is ids and spy.predicted[1][1] is attn


def test_assigner_starts_empty_and_samples_whole_groups_for_trees() -> None:
    def make(*extra: str) -> CreditAssigner:
        return CreditAssigner(load_config(None, list(extra)), None)  # type: ignore[arg-type]

    a = make("credit.strategy=outcome")
    assert a.value is None and a.last_groups == [] and a._tree_values == [] and a._old_values is None
    assert not a.whole_groups
    assert make("credit.strategy=tree").whole_groups
    assert make("credit.strategy=outcome", "rollout.tree.enabled=true").whole_groups


def test_credit_samples_are_drawn_whole_groups_or_plain(tmp_path: Path) -> None:
    from asyncrl.credit.samples import read_samples

    trajs = batch_two_groups()  # groups g1 and g2, two trajectories each
    ids, attn, mask = tensors(trajs)
    a = assigner("outcome", "credit.sample_every=1", "credit.sample_size=2")
    assert a.write_samples(tmp_path, 1, random.Random(0)) is None  # nothing assigned yet
    a.advantages(groups_of(trajs), ids, attn, mask)
    a.whole_groups = True
    assert a.write_samples(tmp_path, 1, random.Random(0)) is not None
    (f,) = [f for f in read_samples(tmp_path) if f.step == 1]
    assert f.whole and len(f.groups) == 1 and len(f.samples) == 2  # one whole group
    (g,) = f.groups
    assert [s.trajectory.group_id for s in g.samples] == [
        g.id,
        g.id,
    ]  # the file holds the group as it trained
    a.cfg.sample_size = 3  # one group is not enough: the second comes whole too
    a.write_samples(tmp_path, 2, random.Random(0))
    (f,) = [f for f in read_samples(tmp_path) if f.step == 2]
    assert sorted(g.id for g in f.groups) == ["g1", "g2"]
    assert all([s.trajectory.group_id for s in g.samples] == [g.id, g.id] for g in f.groups)
    a.whole_groups = False
    a.write_samples(tmp_path, 3, random.Random(0))
    (f,) = [f for f in read_samples(tmp_path) if f.step == 3]
    assert not f.whole and len(f.samples) == 3 and len({smp.trajectory.id for smp in f.samples}) == 3
    # drawn members stay in their own group, groups and members in batch order
    assert [g.id for g in f.groups] == ["g1", "g2"]
    assert all(s.trajectory.group_id == g.id for g in f.groups for s in g.samples)
    batch = [t.id for t in trajs]
    assert [batch.index(s.trajectory.id) for s in f.samples] == sorted(
        batch.index(s.trajectory.id) for s in f.samples
    )
    a.cfg.sample_every = 0
    assert a.write_samples(tmp_path, 4, random.Random(0)) is None


# ----------------------------------------------------------------------------------------- value model


@pytest.mark.parametrize("kind", ["head", "separate"])
def test_value_model_loss_falls_on_a_fixed_dataset(kind: str) -> None:
    from pydantic import TypeAdapter

    from asyncrl.config import ModelConfig, ValueModelConfig
    from asyncrl.credit.value import ValueModel
    from asyncrl.policy import Policy

    torch.manual_seed(0)
    policy = Policy.build(
        ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    )
    vcfg = TypeAdapter(ValueModelConfig).validate_python(
        {"kind": kind, "hidden_size": 32, "lr": 3e-3, "clip": None, "epochs": 1}
    )
    vm = ValueModel(vcfg, policy, "qwen2", 0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (32, 12), generator=g)
    label = (ids[:, 3] % 2).float()  # success is decided by the token at position 3
    attn = torch.ones_like(ids)
    vmask = torch.zeros(32, 12)
    vmask[:, 4:] = 1
    targets = label[:, None].expand(32, 12)
    first = last = None
    for _ in range(120):
        m = vm.train(ids, attn, vmask, targets, vm.predict(ids, attn))
        first = m["loss/value"] if first is None else first
        last = m["loss/value"]
    assert last is not None and first is not None
    assert last < 0.5 * first, (first, last)
    pred = vm.predict(ids, attn)[:, 6]
    assert roc_auc(pred, label) > 0.9
    # round trip through safetensors
    before = vm.predict(ids, attn)
    tensors_ = vm.state_tensors()
    vm2 = ValueModel(vcfg.model_copy(update={"lr": 1e-3, "clip": 0.2, "epochs": 2}), policy, "qwen2", seed=5)
    vm2.load_state_tensors(tensors_)
    assert_close(vm2.predict(ids, attn), before)


# ----------------------------------------------------------------------------------------- files


def test_samples_round_trip_and_clear_errors(tmp_path: Path) -> None:
    from asyncrl.credit.samples import CreditSampleFile, read_samples, write_samples
    from asyncrl.errors import UserError

    with pytest.raises(UserError, match="no credit samples"):
        read_samples(tmp_path)
    trajs = batch_two_groups()
    ids, attn, mask = tensors(trajs)
    a = assigner("outcome")
    a.advantages(groups_of(trajs), ids, attn, mask)
    write_samples(tmp_path, CreditSampleFile(step=3, strategy="outcome", groups=a.last_groups, whole=True))
    files = read_samples(tmp_path)
    assert files[0].step == 3 and files[0].samples[0].trajectory.token_ids() == trajs[0].token_ids()
    assert [g.id for g in files[0].groups] == ["g1", "g2"] and len(files[0].samples) == len(trajs)
    # a schema-1 file (members flat, before groups were kept whole) gets one line saying so
    old = {"step": 1, "strategy": "outcome", "samples": [], "schema_version": 1}
    (tmp_path / "credit" / "samples-00000001.msgpack").write_bytes(msgspec.msgpack.encode(old))
    with pytest.raises(UserError, match=r"has schema 1 and this asyncrl reads schema 2 \(groups whole\)"):
        read_samples(tmp_path)
    (tmp_path / "credit" / "samples-00000001.msgpack").write_bytes(b"\x93garbage")
    with pytest.raises(UserError, match="not readable"):
        read_samples(tmp_path)


def test_value_model_saved_with_checkpoints_and_restored_on_resume(tmp_path: Path) -> None:
    from asyncrl.policy import Policy

    cfg = load_config(
        None,
        [
            "credit.strategy=value_delta",
            "model.hidden_size=32",
            "model.num_layers=1",
            "model.num_heads=2",
            "model.num_kv_heads=1",
            "model.intermediate_size=64",
        ],
    )
    policy = Policy.build(cfg.model)
    a = CreditAssigner(cfg, policy)
    assert a.value is not None
    snapshots = {}
    for step in (1, 2, 3):
        with torch.no_grad():
            for p in a.value.head.parameters():
                p.add_(0.1)
        a.save_value(tmp_path, step, keep=2)
        snapshots[step] = {k: v.clone() for k, v in a.value.state_tensors().items()}
    names = sorted(p.name for p in (tmp_path / "credit" / "value").iterdir())
    assert names == ["step_00000002.safetensors", "step_00000003.safetensors"]
    b = CreditAssigner(cfg, policy)  # a restarted trainer resuming from the step-2 checkpoint
    assert b.value is not None
    b.load_value(tmp_path, 2)
    for k, v in b.value.state_tensors().items():
        assert_close(v, snapshots[2][k])
    assert CreditAssigner(load_config(None, ["credit.strategy=outcome"]), policy).value is None


def test_credit_fragment_reads_the_run_each_time(tmp_path: Path) -> None:
    """The report's credit view reflects the run as it is now (it was once cached per run directory)."""
    from asyncrl.errors import UserError
    from asyncrl.jobs.credit_inspect import credit_fragment

    assert "No credit samples" in credit_fragment(tmp_path)
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "samples-00000001.msgpack").write_bytes(b"not msgpack")
    with pytest.raises(UserError):
        credit_fragment(tmp_path)


def test_tree_credit_on_an_unbranched_group_is_outcome_credit() -> None:
    trajs = [
        make_traj([([5], [7], 0.0), ([8], [9], 0.0), ([3], [], 0.0)], 1.0, "g"),
        make_traj([([6], [7], 0.0), ([4, 4], [], 0.0)], 0.0, "g"),
        make_traj([([4], [], 0.0)], 0.0, "g"),
        make_traj([([6], [7], 0.0)], 1.0, "h", prompt=(1, 3)),
        make_traj([([5], [7], 0.0)], 0.0, "h", prompt=(1, 3)),
    ]
    ids, attn, mask = tensors(trajs)
    for baseline in ("grpo", "dr_grpo", "rloo"):
        out = assigner("outcome", f"credit.baseline={baseline}").advantages(
            groups_of(trajs), ids, attn, mask
        )[0]
        tree, m = assigner("tree", f"credit.baseline={baseline}").advantages(
            groups_of(trajs), ids, attn, mask
        )
        assert_close(tree, out)
        assert m["tree/count"] == 2 and m["tree/branch_nodes"] == 0


def test_tree_credit_goes_to_the_segments_where_the_branches_diverge() -> None:
    trajs = batch_two_groups()  # g1: a1 and a2 share their first segment, then a1 succeeds
    ids, attn, mask = tensors(trajs)
    adv, m = assigner("tree", "credit.baseline=dr_grpo").advantages(groups_of(trajs), ids, attn, mask)
    # V(root) = V(shared node) = 0.5: the shared first turn changed nothing → 0. a1's unbranched
    # chain (turns 2-3) raised V by +0.5, shared evenly and scaled by L = 3; a2's turn 2 lowered it
    # by 0.5 (L = 2). Path totals equal outcome credit's (3 × 0.5 and 2 × −0.5).
    assert [float(adv[0, s]) for s, *_ in segment_spans(trajs[0])] == pytest.approx([0.0, 0.75, 0.75])
    assert [float(adv[1, s]) for s, *_ in segment_spans(trajs[1])] == pytest.approx([0.0, -1.0])
    assert (adv[2:] == 0).all() and (adv[mask == 0] == 0).all()  # g2 is constant
    assert m["tree/branch_nodes"] == 1
