"""Only the passes the loss needs: the proximal pass when read, the LM head at loss positions, and
the prefix-shared (token-trie) forward — each checked against the full computation."""

from __future__ import annotations

import unittest.mock
from typing import Any

import pytest
import torch

from asyncrl.policy.packing import build_prefix_tree, prefix_microbatches, trie_counts
from asyncrl.policy.scoring import token_logprobs_and_entropy
from asyncrl.records import SamplingParams, Task, Trajectory, Turn, groups_of
from test_engine import right_padded
from test_memory import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rows() -> list[list[int]]:
    """Rows sharing prefixes at several depths: a group (one prompt, four continuations, one of
    them a prefix of another and two identical), a row sharing only the first tokens, a loner."""
    g = torch.Generator().manual_seed(7)

    def ids(k: int) -> list[int]:
        return torch.randint(10, 90, (k,), generator=g).tolist()

    prompt, cont = ids(14), ids(6)
    return [
        prompt + cont,
        prompt + cont[:3],
        prompt + ids(9),
        prompt + ids(9),
        prompt + cont,
        prompt[:5] + ids(7),
        ids(11),
    ]


# ---- the token trie --------------------------------------------------------------------------------
def test_trie_nodes_are_the_distinct_prefixes() -> None:
    rows = _rows()
    ids, attn = right_padded(rows)
    tree = build_prefix_tree(ids, attn.bool())
    prefixes = {tuple(r[: t + 1]) for r in rows for t in range(len(r))}
    assert tree.size == len(prefixes) == trie_counts(ids, attn.sum(1))[0]
    for b, r in enumerate(rows):  # loop reference: node(b, t) stands for r[: t + 1]
        for t in range(len(r)):
            n = int(tree.node[b, t])
            assert int(tree.ids[n]) == r[t] and int(tree.positions[n]) == t
            ancestors = {int(tree.node[b, s]) for s in range(t + 1)}
            assert set(torch.nonzero(tree.allowed[n]).flatten().tolist()) == ancestors
        assert (tree.node[b, len(r) :] == -1).all()
    same = [b for b, r in enumerate(rows) if r == rows[0]]
    assert len(same) == 2 and torch.equal(tree.node[same[0]], tree.node[same[1]])


def test_prefix_microbatches_keep_sharing_rows_together_within_the_budget() -> None:
    rows = _rows()
    ids, attn = right_padded(rows)
    lengths = attn.sum(1)
    for budget in (0, 11, 30, 60, 1000):
        parts = prefix_microbatches(ids, lengths, budget)
        assert sorted(torch.cat(parts).tolist()) == list(range(len(rows)))
        for p in parts:
            size = trie_counts(ids[p], lengths[p])[0]
            assert budget == 0 or size <= budget or len(p) == 1
    # with room for the group, the group's five rows share one micro-batch
    group = {0, 1, 2, 3, 4}
    assert any(group <= set(p.tolist()) for p in prefix_microbatches(ids, lengths, 60))


def test_tries_are_used_only_where_they_cost_less() -> None:
    from asyncrl.policy.packing import LayerShape, shared_microbatches

    ids, attn = right_padded(_rows()[:5])  # one group: 14 shared tokens, short continuations
    lengths = attn.sum(1)
    nodes = trie_counts(ids, lengths)[0]
    wide = LayerShape(params=3_500_000, width=576)  # SmolLM2's layer: the linear layers dominate
    parts = shared_microbatches(ids, lengths, 0, wide)
    assert parts is not None and nodes < 0.5 * int(lengths.sum())
    # the trie's attention computes each row's new nodes against its path: fewer pairs than the padded
    # rows, so even a layer whose attention dominates gains where rows share
    ids, attn = right_padded(_rows())
    nodes, pairs = trie_counts(ids, attn.sum(1))
    assert pairs < int((attn.sum(1) ** 2).sum())
    assert shared_microbatches(ids, attn.sum(1), 0, LayerShape(params=10, width=4096)) is not None
    assert shared_microbatches(ids, attn.sum(1), 0, wide) is not None
    # rows that share nothing: the trie is the padded rows, and no gain pays for building it
    ids, attn = right_padded([[i + 1, *r[1:]] for i, r in enumerate(_rows())])
    assert trie_counts(ids, attn.sum(1)) == (int(attn.sum()), int((attn.sum(1) ** 2).sum()))
    assert shared_microbatches(ids, attn.sum(1), 0, wide) is None


# ---- trie attention: each row's new nodes against its own path ----------------------------------------
def _dense_tree_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Loop reference: node i's output from the scores of its ancestors and itself alone."""
    heads, rep = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(heads):
        for i in range(q.shape[2]):
            cols = torch.nonzero(allowed[i]).flatten()
            s = (q[0, h, i] @ k[0, h // rep, cols].T) * q.shape[-1] ** -0.5
            out[0, h, i] = torch.softmax(s, -1) @ v[0, h // rep, cols]
    return out


def test_trie_attention_equals_the_dense_tree_mask_with_its_gradients() -> None:
    from asyncrl.policy.trie_attention import trie_attention, trie_plan

    rows = _rows()  # duplicate rows (own no node), a prefix of a row, a row sharing nothing
    ids, attn = right_padded(rows)
    tree = build_prefix_tree(ids, attn.bool())
    plan = trie_plan(tree.paths)
    n = tree.size
    assert sum(s[1] for s in plan.spans) == n and plan.pairs < n * n
    ordered, lengths = _sorted(ids, attn)  # the cost model counts what runs, in its row order
    assert (
        trie_plan(build_prefix_tree(ordered, lengths[:, None] > torch.arange(ids.shape[1])).paths).pairs
        == (trie_counts(ordered, lengths)[1])
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 8, generator=gen, requires_grad=True) for h in (4, 2, 2))  # grouped
    out = trie_attention(q, k, v, plan, 8**-0.5)
    ref = _dense_tree_attention(q, k, v, tree.allowed)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    w = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_trie_plan_refuses_nodes_out_of_creation_order() -> None:
    from asyncrl.policy.trie_attention import trie_plan

    assert trie_plan([[0, 1, 2], [0, 3], [0, 1, 4]]).spans == ((0, 3, 0, 3), (3, 1, 3, 2), (4, 1, 5, 3))
    with pytest.raises(ValueError, match="numbered next"):
        trie_plan([[0, 1, 2], [0, 4]])


def _sorted(ids: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows in lexicographic order (the order :func:`trie_counts` walks)."""
    order = sorted(range(len(ids)), key=lambda b: ids[b][attn[b].bool()].tolist())
    return ids[order], attn.sum(1)[order]


# ---- scores and gradients: trie vs padded vs a loop over unpadded rows -------------------------------
def _scores_and_grads(
    model: Any, rows: list[list[int]], positions: torch.Tensor, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    ids, attn = right_padded(rows)
    temps = torch.linspace(0.7, 1.3, len(rows))
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs_and_entropy(model, ids, attn, temps, positions=positions, **kw)
    assert ent is not None
    weights = torch.linspace(-1.0, 1.0, lp.numel()).reshape(lp.shape)  # rows weigh differently
    ((lp * weights).sum() + 0.1 * ent.sum()).backward()  # type: ignore[no-untyped-call]
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return lp.detach(), ent.detach(), grads


def _loop_reference(model: Any, rows: list[list[int]], positions: torch.Tensor) -> torch.Tensor:
    """Each row alone, unpadded, full logits: the obviously-correct log-probs."""
    temps = torch.linspace(0.7, 1.3, len(rows))
    out = torch.zeros(positions.shape)
    with torch.no_grad():
        for b, r in enumerate(rows):
            logits = model(torch.tensor([r])).logits[0, :-1] / temps[b]
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r[1:])[:, None]).squeeze(-1)
            out[b, 1 : len(r)] = torch.where(positions[b, 1 : len(r)], lp, torch.zeros(()))
    return out


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trie_forward_equals_padded_forward(checkpointing: bool) -> None:
    model = tiny_model("qwen2", tied=True)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    rows = _rows()
    ids, attn = right_padded(rows)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[:, 12:] = True  # the loss positions: continuations, and a few prompt tokens
    positions[5, 3:] = True
    ref = _loop_reference(model, rows, positions)
    lp_pad, ent_pad, g_pad = _scores_and_grads(model, rows, positions, chunk_tokens=5)
    lp_tree, ent_tree, g_tree = _scores_and_grads(model, rows, positions, chunk_tokens=5, share_prefixes=True)
    torch.testing.assert_close(lp_pad, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_tree, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_tree, ent_pad, atol=1e-5, rtol=0)
    assert len(g_tree) == len(g_pad) > 0
    for a, b in zip(g_tree, g_pad, strict=True):  # a shared node's gradient sums its rows' parts
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert ((lp_tree != 0) == (positions & attn.bool() & (torch.arange(ids.shape[1]) > 0))).all()


def test_lm_head_runs_at_loss_positions_only() -> None:
    model = tiny_model("llama", tied=False)
    rows = _rows()
    ids, attn = right_padded(rows)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[:, 15:] = True
    seen: list[int] = []
    linear = torch.nn.functional.linear

    def head_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if w is model.lm_head.weight:  # the module's forward and the fused head both come here
            seen.append(int(x.shape[0]))
        return linear(x, w, b)

    with unittest.mock.patch("torch.nn.functional.linear", head_rows):
        for share in (False, True):
            seen.clear()
            with torch.no_grad():
                token_logprobs_and_entropy(
                    model, ids, attn, 1.0, chunk_tokens=4, positions=positions, share_prefixes=share
                )
            assert sum(seen) == int((positions & attn.bool())[:, 1:].sum())


@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_head_scores_and_gradients_equal_autograd_through_full_logits(with_entropy: bool) -> None:
    """The fused head (its own backward, chunks of 5) against autograd through the plain path's full
    logits: log-probs, entropies and every gradient, the tied head/embedding weight included."""
    from asyncrl.policy import scoring

    model = tiny_model("qwen2", tied=True)
    assert scoring._fusable(model.lm_head)
    rows = _rows()
    ids, attn = right_padded(rows)
    temps = torch.linspace(0.6, 1.4, len(rows))
    gen = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(ids.shape, generator=gen), torch.randn(ids.shape, generator=gen)
    out = []
    for chunk in (5, 0):
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs_and_entropy(
            model, ids, attn, temps, with_entropy=with_entropy, chunk_tokens=chunk
        )
        loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if ent is not None else 0.0)
        loss.backward()  # type: ignore[no-untyped-call]
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out.append((lp.detach(), ent, grads))
    (lp_f, ent_f, g_f), (lp_p, ent_p, g_p) = out
    torch.testing.assert_close(lp_f, lp_p, atol=1e-6, rtol=0)
    if with_entropy:
        assert ent_f is not None and ent_p is not None
        torch.testing.assert_close(ent_f.detach(), ent_p.detach(), atol=1e-5, rtol=0)
    assert g_f.keys() == g_p.keys() and "model.embed_tokens.weight" in g_p  # the tied head weight
    for n in g_p:
        torch.testing.assert_close(g_f[n], g_p[n], rtol=1e-4, atol=1e-6, msg=n)


def test_trie_gradients_equal_padded_on_smollm2_lora() -> None:
    """The real model with its LoRA adapters: a group of four over one prompt, trie vs padded."""
    from asyncrl.config import LoraConfig, ModelConfig
    from asyncrl.policy import Policy
    from models_util import smollm2_dir

    cfg = ModelConfig(path=str(smollm2_dir()), lora=LoraConfig(rank=4, alpha=8))
    policy = Policy.load(cfg.path or "", cfg=cfg)
    torch.manual_seed(0)
    for n, p in policy.model.named_parameters():  # lora_B starts at 0: give the adapter a gradient path
        if "lora_B" in n:
            p.data.normal_(0, 0.02)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(100, 20000, (40,), generator=g).tolist()
    rows = [prompt + torch.randint(100, 20000, (6,), generator=g).tolist() for _ in range(4)]
    ids, _ = right_padded(rows)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[:, 40:] = True
    lp_pad, _, g_pad = _scores_and_grads(policy.model, rows, positions, chunk_tokens=16)
    lp_tree, _, g_tree = _scores_and_grads(
        policy.model, rows, positions, chunk_tokens=16, share_prefixes=True
    )
    torch.testing.assert_close(lp_tree, lp_pad, atol=2e-4, rtol=0)
    assert len(g_tree) == len(g_pad) > 0  # the adapters alone
    for a, b in zip(g_tree, g_pad, strict=True):
        assert float((a - b).norm()) <= 1e-3 * float(b.norm()) + 1e-7


# ---- the learner ------------------------------------------------------------------------------------
def _group_trajectories(groups: int, seed: int) -> list[Trajectory]:
    """Groups of four over one prompt, multi-turn (a tool result between two model turns)."""
    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(10, 90, (k,), generator=g).tolist()

    out: list[Trajectory] = []
    for gi in range(groups):
        prompt = ids(20)
        for k in range(4):
            turns = [Turn(role="env", token_ids=list(prompt))]
            for _ in range(1 + k % 2):
                n = int(torch.randint(2, 7, (1,), generator=g))
                lp = (-torch.rand(n, generator=g) * 3 - 0.2).tolist()
                turns += [Turn(role="model", token_ids=ids(n), logprobs=lp, version=0)]
                turns += [Turn(role="tool", token_ids=ids(2))]
            out.append(
                Trajectory(
                    id=f"t{gi}-{k}",
                    task=Task(id=f"g{gi}", task_type="calc"),
                    turns=turns,
                    final_reward=float(torch.rand(1, generator=g)),
                    group_id=f"g{gi}",
                    sampling=SamplingParams(temperature=[1.0, 0.7][k % 2]),
                )
            )
    return out


def _learner(extra: list[str]) -> Any:
    from asyncrl.config import load_config
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner
    from test_memory import _learner_args

    cfg = load_config(None, _learner_args(extra))
    return Learner(cfg, Policy.build(cfg.model))


def _step(extra: list[str]) -> tuple[list[torch.Tensor], dict[str, float], Any]:
    learner = _learner(extra)
    torch.manual_seed(0)
    m = learner.step(groups_of(_group_trajectories(2, seed=1)), version=0)
    grads = [p.grad.clone() for p in learner.model.parameters() if p.grad is not None]
    return grads, m, learner


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["algo.policy_loss.kind=decoupled_ppo", "algo.entropy_coef=0.01"],
        [
            "algo.policy_loss.kind=decoupled_ppo",
            "trainer.minibatches=2",
            "trainer.epochs=2",
            "trainer.target_kl=5",
        ],
    ],
    ids=["ppo_clip", "decoupled+entropy", "decoupled_2x2+target_kl"],
)
def test_lean_step_equals_full_step(extra: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """All three savings on (shared prefixes, loss positions, proximal pass only when read) against
    the full computation (padded rows, every position, a proximal pass of every row)."""
    import asyncrl.trainer.learner as learner_mod

    lean = ["trainer.max_tokens_per_microbatch=64", "trainer.logits_chunk_tokens=7", *extra]
    g, m, learner = _step(lean)
    assert learner._parts(_collated(learner), torch.arange(8))[0].shared  # the trie layout was used

    def full_proximal(self: Any, b: Any, first: torch.Tensor) -> torch.Tensor | None:
        return self._logprobs(self.parallel.scorer, b) if self.needs_prox else None

    monkeypatch.setattr(learner_mod.Learner, "_proximal", full_proximal)
    g_ref, m_ref, _ = _step(["trainer.share_prefixes=false", "trainer.logits_chunk_tokens=0", *extra])
    for a, b in zip(g, g_ref, strict=True):
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-8
    for key in ("loss/policy", "train/grad_norm", "policy/tokens", "entropy/mean", "policy/is_weight_mean"):
        assert m[key] == pytest.approx(m_ref[key], rel=1e-4, abs=1e-6), key
    assert ("train/approx_kl" in m) == ("trainer.target_kl=5" in extra) == ("train/approx_kl" in m_ref)


def _collated(learner: Any) -> Any:
    from asyncrl.trainer.learner import collate

    return collate(_group_trajectories(2, seed=1), learner.policy.tokenizer.pad_token_id)


@pytest.mark.parametrize(
    ("extra", "proximal_rows"),
    [
        ([], 0),  # ppo_clip reads the behaviour log-probs only
        (["trainer.target_kl=0.5"], 0),  # one epoch: the check would have nothing left to stop
        (["algo.policy_loss.kind=decoupled_ppo"], 0),  # one minibatch: its own pass fills them in
        (["algo.policy_loss.kind=decoupled_ppo", "trainer.minibatches=2"], 4),  # the other minibatch
        (["trainer.target_kl=0.5", "trainer.epochs=2"], 0),  # one minibatch: filled in, then checked
        (["trainer.target_kl=0.5", "trainer.epochs=2", "trainer.minibatches=2"], 4),
    ],
)
def test_no_grad_passes_only_when_read(
    extra: list[str], proximal_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncrl.trainer.learner as learner_mod
    import asyncrl.trainer.parallel as parallel_mod

    real = learner_mod.token_logprobs_and_entropy
    no_grad_rows: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            no_grad_rows.append(int(args[1].shape[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(learner_mod, "token_logprobs_and_entropy", counting)  # the reference's scorer
    monkeypatch.setattr(parallel_mod, "token_logprobs_and_entropy", counting)  # the policy's
    learner = _learner(extra)
    torch.manual_seed(0)
    m = learner.step(groups_of(_group_trajectories(2, seed=1)), version=0)
    kl_checks = 8 if "trainer.epochs=2" in extra else 0  # one pass over every row after epoch 0
    assert sum(no_grad_rows) == proximal_rows + kl_checks
    assert ("train/approx_kl" in m) == (kl_checks > 0)
    assert ("kl/prox_k3" in m) == ("algo.policy_loss.kind=decoupled_ppo" in extra)


def test_sft_loss_with_shared_prefixes_equalsright_padded() -> None:
    from asyncrl.jobs.warm_start import sft_loss

    model = tiny_model("llama", tied=True)
    batch = [(r, [0] * 12 + [1] * (len(r) - 12)) for r in _rows()[:5]]
    losses, grads = [], []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        loss = sft_loss(model, batch, pad_id=0, chunk_tokens=4, share_prefixes=share)
        loss.backward()  # type: ignore[no-untyped-call]
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(losses[1], losses[0])
    for a, b in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ---- threads ----------------------------------------------------------------------------------------
def test_a_role_that_computes_alone_gets_the_solo_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.bootstrap import pinned_threads, torch_threads, usable_cores
    from asyncrl.config import load_config

    def cfg(*extra: str) -> Any:
        return load_config(None, ["launcher.torch_threads=1", *extra])

    assert torch_threads(cfg(), "trainer") == 1  # async: the trainer shares the cores with rollout
    assert torch_threads(cfg("control.mode=one_step_off"), "trainer") == 1
    assert torch_threads(cfg("control.mode=sync"), "rollout") == 1
    assert torch_threads(cfg("control.mode=sync", "launcher.solo_threads=3"), "trainer") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the environment's say on a shared machine
    assert torch_threads(cfg("control.mode=sync"), "trainer") == usable_cores() == 5
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert torch_threads(cfg("control.mode=sync"), "trainer") == usable_cores() >= 1
    assert torch_threads(cfg("launcher.solo_threads=2"), "warm_start") == 2
    # the job's own held-out evaluations (before the roles start, after they stop) compute alone; the
    # periodic evaluator role shares the cores
    assert torch_threads(cfg("launcher.solo_threads=2"), "evaluation") == 2
    assert torch_threads(cfg("launcher.solo_threads=2"), "evaluator") == 1
    before = torch.get_num_threads()
    with pinned_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
