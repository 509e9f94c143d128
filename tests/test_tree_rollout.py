"""Tree groups (``asyncrl.rollout.tree``): branch points, replay, shared turns and budgets."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import torch

from asyncrl.config import EnvConfig, TreeConfig, load_config
from asyncrl.credit.assign import CreditAssigner
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.envs import make_env
from asyncrl.records import Task, Trajectory, Turn, groups_of
from asyncrl.rollout.episode import run_episode
from asyncrl.rollout.tree import branch_points, choose_points, grow_tree
from helpers import calc_task
from test_episode import TEMPLATE, ScriptedEngine, settings

_ids = itertools.count(100)


def synthetic_leaf(turns: int = 3, surprisal: dict[int, float] | None = None) -> Any:
    """A leaf runner that replays the prefix and samples fresh turns: turn k's tokens are new ids
    and its log-probs are −surprisal[k] (default 1)."""
    calls: list[int] = []

    async def run(prefix: list[Turn]) -> Trajectory:
        calls.append(len(prefix))
        out = [Turn(role="env", token_ids=[1, 2])]
        for k in range(turns):
            if k < len(prefix):
                ids = list(prefix[k].token_ids)
                lp = [0.0] * len(ids)
            else:
                ids = [next(_ids)]
                lp = [-(surprisal or {}).get(k, 1.0)]
            out += [
                Turn(role="model", token_ids=ids, logprobs=lp, version=3),
                Turn(role="tool", token_ids=[9]),
            ]
        reward = float(out[1].token_ids[0] % 2)
        return Trajectory(
            id=f"t{next(_ids)}",
            task=Task(id="x", task_type="t"),
            turns=out,
            final_reward=reward,
            group_id="g",
        )

    return run, calls


def grow(
    cfg: TreeConfig, run: Any, group_size: int = 8, max_leaves: int = 16
) -> tuple[list[Trajectory], Any]:
    return asyncio.run(grow_tree(run, cfg, group_size, max_leaves))


def test_every_turn_branches_shallowest_first_and_keeps_the_leaf_budget() -> None:
    run, calls = synthetic_leaf(turns=3)
    leaves, stats = grow(TreeConfig(enabled=True, roots=2, branch=2, points="every_turn"), run)
    assert len(leaves) == 8 and stats.roots == 2
    # round 1: 2 roots × 2 states (after turns 1, 2) = 4 points, shallowest (k=1) first
    assert calls[:2] == [0, 0] and calls[2:4] == [1, 1]
    keys = [p.key for t in leaves for p in branch_points(t) if p.k == 1]
    assert len(set(keys)) < len(keys)  # branches pass through their parents' states
    assert stats.replayed_turns == sum(calls) and stats.replay_diverged == 0


def test_replayed_turns_are_shared_context_with_their_original_logprobs() -> None:
    run, _ = synthetic_leaf(turns=3, surprisal={0: 2.0})
    leaves, _ = grow(
        TreeConfig(enabled=True, roots=1, branch=3, points="first_k", first_k=1), run, group_size=3
    )
    root, kids = leaves[0], leaves[1:]
    for kid in kids:
        first = kid.turns[1]
        assert first.shared and first.logprobs == root.turns[1].logprobs == [-2.0]
        assert first.version == 3 and kid.reward_components["tree_replayed_turns"] == 1
        assert kid.loss_mask()[2] == 0 and sum(kid.loss_mask()) == 2  # two fresh turns trained
        assert kid.num_model_tokens() == 2 and kid.model_versions() == [3, 3]
    assert sum(root.loss_mask()) == 3


def test_entropy_picks_the_most_surprising_next_turn_and_first_k_bounds_depth() -> None:
    run, _ = synthetic_leaf(turns=4, surprisal={2: 5.0})
    leaves, _ = grow(TreeConfig(enabled=True, roots=1), run, group_size=1)
    (p,) = choose_points(leaves, TreeConfig(points="entropy"), set(), 1)
    assert p.k == 2 and p.score == pytest.approx(5.0)  # the state before the surprising turn 3
    assert {q.k for q in choose_points(leaves, TreeConfig(points="first_k", first_k=1), set(), 9)} == {1}
    assert choose_points(leaves, TreeConfig(points="every_turn"), {p.key}, 9)[0].k == 1


def test_single_turn_episodes_cannot_branch_so_the_tree_adds_fresh_roots() -> None:
    run, calls = synthetic_leaf(turns=1)
    leaves, stats = grow(TreeConfig(enabled=True, roots=2), run, group_size=5)
    assert len(leaves) == 5 and calls == [0] * 5 and stats.roots == 5 and stats.branch_points == 0


def test_a_token_budget_matches_flat_generated_tokens_and_sizes_the_group() -> None:
    run, _ = synthetic_leaf(turns=4)
    leaves, _ = grow(TreeConfig(enabled=True, roots=2, budget="tokens"), run, group_size=4, max_leaves=8)
    generated = sum(t.num_model_tokens() for t in leaves)
    assert generated >= 4 * 4 and len(leaves) > 4  # branches are cheaper than fresh episodes
    assert len(leaves) <= 8  # the group carries its members whatever their number: nothing to stamp on them


def test_a_tree_of_real_episodes_replays_exactly_and_gets_tree_credit() -> None:
    texts = itertools.cycle(["<tool>calc(3*4)</tool>", "<answer>12</answer>", "<answer>7</answer>"])

    class Cycling(ScriptedEngine):
        def generate(self, prompts: list[list[int]], sampling: Any) -> Any:
            self.texts = [next(texts) for _ in prompts]
            return super().generate(prompts, sampling)

    async def go() -> tuple[list[Trajectory], Any]:
        batcher = TurnBatcher(Cycling([]), max_batch=64, max_wait_s=0.02)
        task = calc_task()

        async def leaf(prefix: list[Turn]) -> Trajectory:
            ids = [t.token_ids for t in prefix]
            (traj,) = await run_episode(
                task, make_env(EnvConfig(), 0), batcher, TEMPLATE, settings(), "g", ids
            )
            return traj

        try:
            return await grow_tree(leaf, TreeConfig(enabled=True, roots=2, points="every_turn"), 6, 6)
        finally:
            batcher.close()

    leaves, stats = asyncio.run(go())
    assert len(leaves) == 6 and stats.replay_diverged == 0 and stats.replayed_turns > 0
    assert any(t.turns[1].shared for t in leaves)
    cfg = load_config(None, ["credit.strategy=tree", "credit.process_weight=0"])
    a = CreditAssigner.__new__(CreditAssigner)
    a.cfg, a.value, a.last_groups, a._old_values = cfg.credit, None, [], None
    T = max(len(t.token_ids()) for t in leaves)
    ids = torch.zeros(len(leaves), T, dtype=torch.long)
    mask = torch.zeros(len(leaves), T)
    for i, t in enumerate(leaves):
        ids[i, : len(t.token_ids())] = torch.tensor(t.token_ids())
        mask[i, : len(t.token_ids())] = torch.tensor(t.loss_mask(), dtype=torch.float32)
    adv, m = a.advantages(groups_of(leaves), ids, (ids > 0).long(), mask)
    assert m["tree/branch_nodes"] >= 1 and m["tree/count"] == 1
    assert (adv[mask == 0] == 0).all()


def test_tree_groups_are_refused_for_agent_programs() -> None:
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout\.tree"):
        load_config("configs/agent.yaml", ["rollout.tree.enabled=true"])


def test_branch_points_are_the_nodes_tree_credit_finds() -> None:
    """The rollout and the credit key a state by one helper: every branch point a leaf offers is a
    node of the credit's tree (before the leaf's own last segment), with the same key."""
    from asyncrl.credit.tree import TreeIndex

    run, _ = synthetic_leaf(turns=3)
    leaves, _ = grow(TreeConfig(enabled=True, roots=2, points="every_turn"), run, group_size=6)
    index = TreeIndex()
    for t in leaves:
        spans = [(s, s, e, 0.0) for s, e in t.segments()]
        path = index.add(0, t, spans)
        points = branch_points(t)
        assert [index.ids[p.key] for p in points] == path[: len(points)]
