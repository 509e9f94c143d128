"""Tree credit (``asyncrl.algo.tree``): loop references, hand-valued trees and the edge cases."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch

from asyncrl.algo import group_advantages, spread_chains, tree_advantages, tree_values


def _loop_values(parent: list[int], r: list[float], w: list[float]) -> list[float]:
    """Obviously-correct twin: walk every subtree by recursion; no evidence → parent's value."""
    kids: dict[int, list[int]] = {i: [] for i in range(len(parent))}
    for i, p in enumerate(parent):
        if p >= 0:
            kids[p].append(i)

    def leaves(n: int) -> list[int]:
        out = [n] if w[n] > 0 else []
        for c in kids[n]:
            out += leaves(c)
        return out

    v = [0.0] * len(parent)
    for n in range(len(parent)):
        ls = leaves(n)
        mass = sum(w[i] for i in ls)
        if mass > 0:
            v[n] = sum(w[i] * r[i] for i in ls) / mass
        elif parent[n] >= 0:
            v[n] = v[parent[n]]
    return v


def _loop_advantages(parent: list[int], r: list[float], w: list[float], mode: str, eps: float):
    v = _loop_values(parent, r, w)

    def root(n: int) -> int:
        while parent[n] >= 0:
            n = parent[n]
        return n

    seg, out = [0.0] * len(parent), [0.0] * len(parent)
    for t in {root(i) for i in range(len(parent))}:
        members = [i for i in range(len(parent)) if root(i) == t]
        leaf_r = [r[i] for i in members if w[i] > 0]
        n = len(leaf_r)
        if n < 2 or max(leaf_r) == min(leaf_r):
            continue
        mean = sum(leaf_r) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in leaf_r) / (n - 1))
        s = {"grpo": 1 / (std + eps), "dr_grpo": 1.0, "rloo": n / (n - 1)}[mode]
        for i in members:
            if parent[i] >= 0:
                seg[i] = s * (v[i] - v[parent[i]])
            if w[i] > 0:
                out[i] = s * (r[i] - v[t])
    return seg, out, v


def _random_forest(rng: random.Random, n: int) -> tuple[list[int], list[float], list[float]]:
    parent = [-1]
    for i in range(1, n):
        parent.append(-1 if rng.random() < 0.1 else rng.randrange(i))
    has_kid = {p for p in parent if p >= 0}
    r = [float(rng.choice([0.0, 1.0, 0.5])) for _ in range(n)]
    w = [1.0 if i not in has_kid and rng.random() < 0.9 else 0.0 for i in range(n)]
    return parent, r, w


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo", "rloo"])
def test_matches_the_loop_reference_on_random_forests(mode: str) -> None:
    rng = random.Random(7)
    for _ in range(30):
        parent, r, w = _random_forest(rng, rng.randrange(1, 25))
        seg, out, v, _ = tree_advantages(torch.tensor(parent), torch.tensor(r), torch.tensor(w), mode)
        ref_seg, ref_out, ref_v = _loop_advantages(parent, r, w, mode, 1e-6)
        torch.testing.assert_close(v, torch.tensor(ref_v))
        torch.testing.assert_close(seg, torch.tensor(ref_seg))
        torch.testing.assert_close(out, torch.tensor(ref_out))


def test_a_hand_valued_tree() -> None:
    # root 0 ─ turn → 1 ─┬─ 2 ─┬─ 4 (R=1)      V(4)=1, V(5)=0 → V(2)=1/2
    #                    │     └─ 5 (R=0)
    #                    └─ 3 ─┬─ 6 (R=1)      V(6)=V(7)=1 → V(3)=1
    #                          └─ 7 (R=1)      V(1)=V(0)=3/4
    parent = torch.tensor([-1, 0, 1, 1, 2, 2, 3, 3])
    r = torch.tensor([0, 0, 0, 0, 1, 0, 1, 1.0])
    w = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1.0])
    seg, out, v, m = tree_advantages(parent, r, w, "dr_grpo")
    torch.testing.assert_close(v, torch.tensor([0.75, 0.75, 0.5, 1, 1, 0, 1, 1]))
    # the first turn changed nothing (a singleton branch); turn 1→2 lost a quarter, 1→3 won one
    torch.testing.assert_close(seg, torch.tensor([0, 0, -0.25, 0.25, 0.5, -0.5, 0, 0]))
    torch.testing.assert_close(out, torch.tensor([0, 0, 0, 0, 0.25, -0.75, 0.25, 0.25]))
    assert m["tree/count"] == 1.0 and m["tree/leaves_mean"] == 4.0
    assert m["tree/informative_frac"] == pytest.approx(4 / 7)


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo", "rloo"])
def test_segments_telescope_to_the_group_relative_outcome(mode: str) -> None:
    rng = random.Random(3)
    for _ in range(20):
        parent, r, w = _random_forest(rng, 20)
        p = torch.tensor(parent)
        seg, out, _, _ = tree_advantages(p, torch.tensor(r), torch.tensor(w), mode)
        for leaf in (i for i in range(20) if w[i] > 0):
            path, n = 0.0, leaf
            while n >= 0:
                path += float(seg[n])
                n = parent[n]
            assert path == pytest.approx(float(out[leaf]), abs=1e-5)


@pytest.mark.parametrize("mode", ["grpo", "dr_grpo", "rloo"])
def test_a_flat_group_is_grpo(mode: str) -> None:
    # a root with n leaf children is a flat group: out == group_advantages, seg(leaf) == out(leaf)
    r = torch.tensor([0.0, 1, 0, 0, 1, 1])
    parent = torch.tensor([-1, 0, 0, 0, 0, 0])
    w = torch.tensor([0.0, 1, 1, 1, 1, 1])
    seg, out, _, _ = tree_advantages(parent, r, w, mode)
    ref, _ = group_advantages(r[1:], torch.zeros(5, dtype=torch.long), mode)
    torch.testing.assert_close(out[1:], ref)
    torch.testing.assert_close(seg[1:], ref)


def test_degenerate_trees_get_zero_credit() -> None:
    # all-equal outcomes, a single leaf and a tree with no weighted leaf: nothing to learn from
    parent = torch.tensor([-1, 0, 0, -1, 3, -1, 5, 5])
    r = torch.tensor([0, 1, 1, 0, 1, 0, 1, 0.0])
    w = torch.tensor([0, 1, 1, 0, 1, 0, 0, 0.0])
    seg, out, v, _ = tree_advantages(parent, r, w, "grpo")
    assert torch.count_nonzero(seg) == 0 and torch.count_nonzero(out) == 0
    assert v[5] == 0 and v[6] == 0  # no evidence anywhere in that tree


def test_a_left_out_leaf_inherits_its_parents_value() -> None:
    # leaf 3 (truncated, weight 0) carries no evidence: its segment gets exactly 0
    parent = torch.tensor([-1, 0, 0, 0])
    r = torch.tensor([0.0, 1, 0, 0])
    w = torch.tensor([0.0, 1, 1, 0])
    seg, out, v, _ = tree_advantages(parent, r, w, "dr_grpo")
    assert v[3] == v[0] == 0.5
    assert seg[3] == 0 and out[3] == 0


def test_bad_trees_are_refused() -> None:
    with pytest.raises(ValueError, match="topological"):
        tree_values(torch.tensor([-1, 2, 0]), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="integer"):
        tree_values(torch.tensor([-1.0, 0.0]), torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="shape"):
        tree_values(torch.tensor([-1, 0]), torch.zeros(3), torch.ones(2))
    with pytest.raises(ValueError, match="allowed values"):
        tree_advantages(torch.tensor([-1]), torch.zeros(1), torch.ones(1), "ppo")  # type: ignore[arg-type]


def _loop_spread(parent: list[int], seg: list[float], w: list[float]) -> list[float]:
    kids = [sum(1 for p in parent if p == i) for i in range(len(parent))]

    def passing(i: int) -> bool:
        return parent[i] >= 0 and w[i] <= 0 and kids[i] == 1

    top = list(range(len(parent)))
    for i in range(len(parent)):  # topological: a parent's top is final
        if parent[i] >= 0 and passing(parent[i]):
            top[i] = top[parent[i]]
    out = [0.0] * len(parent)
    for i in range(len(parent)):
        if parent[i] >= 0:
            out[i] = seg[top[i]] / sum(1 for j in range(len(parent)) if parent[j] >= 0 and top[j] == top[i])
    return out


def test_spread_chains_matches_the_loop_reference_and_keeps_path_sums() -> None:
    rng = random.Random(11)
    for _ in range(30):
        parent, r, w = _random_forest(rng, rng.randrange(1, 25))
        p, wt = torch.tensor(parent), torch.tensor(w)
        seg, out, _, _ = tree_advantages(p, torch.tensor(r), wt, "grpo")
        spread = spread_chains(p, seg, wt)
        torch.testing.assert_close(spread, torch.tensor(_loop_spread(parent, seg.tolist(), w)))
        for leaf in (i for i in range(len(parent)) if w[i] > 0):
            total, n = 0.0, leaf
            while n >= 0:
                total += float(spread[n])
                n = parent[n]
            assert total == pytest.approx(float(out[leaf]), abs=1e-5)


def test_a_flat_multi_turn_group_spreads_the_outcome_evenly() -> None:
    # two unbranched 3-turn episodes of one task: each turn gets out(ℓ) / 3
    parent = torch.tensor([-1, 0, 1, 2, 0, 4, 5])
    r = torch.tensor([0, 0, 0, 1, 0, 0, 0.0])
    w = torch.tensor([0, 0, 0, 1, 0, 0, 1.0])
    seg, _, _, _ = tree_advantages(parent, r, w, "dr_grpo")
    spread = spread_chains(parent, seg, w)
    torch.testing.assert_close(spread, torch.tensor([0, 0.5, 0.5, 0.5, -0.5, -0.5, -0.5]) / 3)


def test_a_weighted_node_ends_a_chain_whatever_its_weight() -> None:
    # root → 1 → 2 where node 1 is itself a weighted leaf (weight 0.5) with one child: not pass-through
    parent = torch.tensor([-1, 0, 1])
    spread = spread_chains(parent, torch.tensor([0.0, 0.3, 0.6]), torch.tensor([0.0, 0.5, 0.5]))
    torch.testing.assert_close(spread, torch.tensor([0.0, 0.3, 0.6]))


def _sample(tid: str, turns: list[tuple[list[int], list[int] | None, bool]], reward: float) -> Any:
    """A credit sample of group ``g``: model turns (ids, observation ids, shared) after prompt [1, 2];
    every segment's credit is its index (what ablation compares with)."""
    from asyncrl.credit.samples import CreditSample, SegmentCredit
    from asyncrl.records import Task, Trajectory, Turn

    out = [Turn(role="env", token_ids=[1, 2])]
    for ids, obs, shared in turns:
        out.append(Turn(role="model", token_ids=ids, logprobs=[-1.0] * len(ids), version=0, shared=shared))
        if obs:
            out.append(Turn(role="tool", token_ids=obs))
    traj = Trajectory(
        id=tid,
        task=Task(id="x", task_type="t"),
        turns=out,
        final_reward=reward,
        outcome="success" if reward else "failure",
        group_id="g",
    )
    segs = [SegmentCredit(start=s, end=e, process_reward=0.0, credit=0.0) for s, e in traj.segments()]
    return CreditSample(trajectory=traj, segments=segs, outcome_advantage=0.0)


def test_ablate_with_siblings_compares_each_branch_with_its_siblings(tmp_path: Any) -> None:
    """A: 10→20→30 wins; B replays A's first turn, then 40→50 loses; C: 60→70 loses. Root's children:
    A's first state (leaves A, B: 0.5) and C's (0); that state's children: A's (1) and B's (0)."""
    from asyncrl.config import dump_yaml, load_config
    from asyncrl.credit.samples import CreditGroup, CreditSampleFile, write_samples
    from asyncrl.errors import UserError
    from asyncrl.jobs.credit_ablate import ablate

    a = _sample("A", [([10], [11], False), ([20], [21], False), ([30], None, False)], 1.0)
    b = _sample("B", [([10], [11], True), ([40], [41], False), ([50], None, False)], 0.0)
    c = _sample("C", [([60], [61], False), ([70], None, False)], 0.0)
    for smp, credits in ((a, [0.4, 0.9, 0.0]), (b, [0.0, -0.9, 0.0]), (c, [-0.4, 0.0])):
        for seg, cr in zip(smp.segments, credits, strict=True):
            seg.credit = cr
    group = CreditGroup(id="g", samples=[a, b, c])
    write_samples(tmp_path, CreditSampleFile(step=1, strategy="tree", groups=[group], whole=True))
    cfg = load_config(None, ["rollout.tree.enabled=true", "credit.strategy=tree"])
    (tmp_path / "config.yaml").write_text(dump_yaml(cfg))
    rep = ablate(tmp_path, trajectories=3, siblings=True)
    got = {
        (r["trajectory"], r["segment"]): (r["p_after"], r["p_before"], r["contribution"]) for r in rep["rows"]
    }
    assert got == {
        ("A", 0): (0.5, 0.0, 0.5),  # A's first state (A, B below) vs C's
        ("A", 1): (1.0, 0.0, 1.0),  # A's second turn vs B's, from the same state
        ("B", 1): (0.0, 1.0, -1.0),
        ("C", 0): (0.0, 0.5, -0.5),
    }  # B's first turn is A's, replayed: judged once, in A
    assert rep["unbranched"] == 3 and rep["episodes"] == 0 and rep["spearman"] == pytest.approx(1.0)
    (tmp_path / "config.yaml").write_text(dump_yaml(load_config(None, ["credit.strategy=tree"])))
    with pytest.raises(UserError, match="needs tree groups"):
        ablate(tmp_path, siblings=True)
