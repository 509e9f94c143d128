"""``bench/trainer_passes.py``'s own parts, tiny: the saved real batch reads back as written, and the
executed-FLOPs estimate follows the ladder (each variant runs less than the one before it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.records import encode, groups_of, members
from bench_util import load_bench
from test_learner_passes import _group_trajectories
from test_memory import _learner_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_saved_batch_reads_back_as_written(tmp_path: Path) -> None:
    tp = load_bench("trainer_passes")
    groups = groups_of(_group_trajectories(2, seed=1))
    saved = tp.SavedBatch(
        config="c.yaml",
        rollout_seed=0,
        warm_start_key="k",
        warm_start_heldout=0.25,
        created="now",
        groups=groups,
    )
    path = tmp_path / "batch.msgpack"
    path.write_bytes(encode(saved))
    back = tp.load_saved(path)
    assert [t.token_ids() for t in members(back.groups)] == [t.token_ids() for t in members(groups)]
    assert [t.loss_mask() for t in members(back.groups)] == [t.loss_mask() for t in members(groups)]
    assert [g.id for g in back.groups] == [g.id for g in groups]
    fig = tp.batch_figures(members(back.groups))
    assert fig["rows"] == 8 and fig["groups"] == 2 and fig["prompt_tokens"] == 8 * 20
    assert fig["batch_tokens"] == sum(len(t.token_ids()) for t in members(groups))


def _flops(tp: Any, name: str, extra: list[str]) -> float:
    from asyncrl.config import load_config
    from asyncrl.policy import Policy

    cls, overrides = tp.VARIANTS[name]
    cfg = load_config(None, _learner_args(["trainer.logits_chunk_tokens=7", *extra, *overrides]))
    learner = cls(cfg, Policy.build(cfg.model))
    return float(tp.executed_flops(learner, _group_trajectories(2, seed=1))["total"])


def test_executed_flops_follow_the_ladder() -> None:
    tp = load_bench("trainer_passes")
    f = {
        n: _flops(tp, n, ["trainer.max_tokens_per_microbatch=64"])
        for n in ("before", "no_prox", "loss_positions", "after")
    }
    assert f["before"] > f["no_prox"] > f["loss_positions"] > f["after"] > 0
    # the proximal pass is one forward: a third to a half of the gradient pass (forward + backward)
    # without checkpointing or chunked logits
    plain = ["trainer.logits_chunk_tokens=0", "trainer.max_tokens_per_microbatch=0"]
    before, no_prox = _flops(tp, "before", plain), _flops(tp, "no_prox", plain)
    assert no_prox / 3 < before - no_prox < no_prox / 2
    ckpt = _flops(tp, "no_prox", [*plain, "trainer.gradient_checkpointing=true"])
    assert no_prox < ckpt < before  # the recomputed forward has no head


def test_a_forked_variant_runs_with_its_allocator_setting(tmp_path: Path) -> None:
    """Each timed step runs in a child with the variant's mmap threshold; what it trains dies with it."""
    import yaml

    from asyncrl.config import load_config
    from asyncrl.policy import Policy

    tp = load_bench("trainer_passes")
    config = tmp_path / "tiny.yaml"
    nested: dict[str, Any] = {}
    for arg in _learner_args(
        ["trainer.max_tokens_per_microbatch=64", "launcher.malloc_mmap_threshold_kb=1024"]
    ):
        key, value = arg.split("=", 1)
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    config.write_text(yaml.safe_dump(nested))
    policy = Policy.build(load_config(config, []).model)
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    trajs = _group_trajectories(2, seed=1)
    lean, fast = (
        tp.run_forked("after", policy, trajs, config),
        tp.run_forked("after_no_mmap", policy, trajs, config),
    )
    assert lean["malloc_mmap_threshold_kb"] == 1024 and fast["malloc_mmap_threshold_kb"] == 0
    assert lean["loss_policy"] == pytest.approx(fast["loss_policy"], rel=1e-5)  # the same step
    assert all(
        torch.equal(v, policy.model.state_dict()[k]) for k, v in before.items()
    )  # the parent untouched


def test_the_kernel_patches_take_out_the_trie_attention_and_the_fused_head_and_agree() -> None:
    """``after_speed_dense_unfused`` runs the dense tree mask and the unfused head (restored after the
    block), the same step up to float rounding, and its estimate counts the dense mask's pairs."""
    import asyncrl.policy.trie_attention as ta
    from asyncrl.config import load_config
    from asyncrl.policy import Policy, scoring

    tp = load_bench("trainer_passes")
    head = torch.nn.Linear(2, 2, bias=False)
    with tp.patched("after_speed_dense_unfused"):
        assert ta.trie_attention is tp._dense and not scoring._fusable(head)
    assert ta.trie_attention is not tp._dense and scoring._fusable(head)
    trajs = _group_trajectories(2, seed=1)
    out = {}
    for name in ("after_speed", "after_speed_dense", "after_speed_unfused", "after_speed_dense_unfused"):
        cfg = load_config(None, _learner_args(["trainer.logits_chunk_tokens=7", *tp.VARIANTS[name][1]]))
        torch.manual_seed(0)
        policy = Policy.build(cfg.model)
        out[name] = tp.run_variant(name, policy, trajs, cfg, warmup=1)
        assert out[name]["microbatches"] >= 1
    ref = out["after_speed"]
    for name, r in out.items():
        assert r["loss_policy"] == pytest.approx(ref["loss_policy"], rel=1e-4, abs=1e-7), name
        assert r["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), name
    learner = tp.Learner(cfg, Policy.build(cfg.model))
    with tp.patched("after_speed_dense"):
        dense = tp.executed_flops(learner, trajs)["attention"]
    assert dense > tp.executed_flops(learner, trajs)["attention"] > 0  # the trie's plan counts fewer pairs
