"""Memory-lean training: chunked log-probs, token-budget micro-batches, gradient checkpointing.

Each lean path is checked against the plain one (full logits, one pass, no checkpointing) with
``torch.testing.assert_close``: log-probs, entropies, gradients, and the weights after a step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from asyncrl.policy.scoring import can_chunk_logits, token_logprobs_and_entropy
from asyncrl.records import Trajectory, groups_of

VOCAB = 97


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_model(family: str, tied: bool, attn: str = "sdpa") -> PreTrainedModel:
    """A 2-layer model of ``family`` with tied or untied input/output embeddings."""
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "max_position_embeddings": 64,
        "tie_word_embeddings": tied,
    }
    torch.manual_seed(11)
    model: PreTrainedModel
    if family == "qwen2":
        qcfg = Qwen2Config(**common)
        qcfg._attn_implementation = attn
        model = Qwen2ForCausalLM(qcfg)
    else:
        lcfg = LlamaConfig(**common)
        lcfg._attn_implementation = attn
        model = LlamaForCausalLM(lcfg)
    torch.nn.Module.float(model)
    model.train()
    tied_now = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tied_now == tied
    return model


def padded_batch(padding: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    lengths = (7, 13, 1, 10, 2)
    width = max(lengths)
    ids = torch.full((len(lengths), width), -100, dtype=torch.long)  # odd pad id on purpose
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        sl = slice(0, n) if padding == "right" else slice(width - n, width)
        ids[i, sl] = torch.randint(0, VOCAB, (n,), generator=g)
        mask[i, sl] = 1
    return ids, mask


def _scores_and_grads(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, temps: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs_and_entropy(model, ids, mask, temps, chunk_tokens=chunk)
    assert ent is not None
    g = torch.Generator().manual_seed(9)
    w_lp, w_ent = torch.randn(lp.shape, generator=g), torch.randn(lp.shape, generator=g)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()  # type: ignore[no-untyped-call]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return lp.detach(), ent.detach(), grads


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("chunk", [3, 8, 1000])
def test_chunked_logprobs_entropy_and_grads_match_plain(
    family: str, tied: bool, padding: str, chunk: int
) -> None:
    model = tiny_model(family, tied)
    assert can_chunk_logits(model)
    ids, mask = padded_batch(padding)
    temps = torch.tensor([1.0, 0.7, 1.3, 0.5, 2.0])
    ref_lp, ref_ent, ref_grads = _scores_and_grads(model, ids, mask, temps, chunk=0)
    lp, ent, grads = _scores_and_grads(model, ids, mask, temps, chunk=chunk)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all() and (lp[:, 0] == 0).all()
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(model.parameters()))
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")  # type: ignore[misc]


def test_chunked_float_temperature_no_grad_and_no_entropy() -> None:
    model = tiny_model("qwen2", True)
    ids, mask = padded_batch("right")
    with torch.no_grad():
        ref, _ = token_logprobs_and_entropy(model, ids, mask, 0.8, with_entropy=False)
        lp, ent = token_logprobs_and_entropy(model, ids, mask, 0.8, with_entropy=False, chunk_tokens=4)
    assert ent is None and not lp.requires_grad
    torch.testing.assert_close(lp, ref)
    with pytest.raises(ValueError, match="temperature has 2 entries for a batch of 5"):
        token_logprobs_and_entropy(model, ids, mask, torch.ones(2), chunk_tokens=4)


def test_chunked_backward_keeps_no_full_logits() -> None:
    """The autograd graph of the chunked path holds no tensor with a [B, T, V]-sized vocabulary axis."""
    model = tiny_model("llama", False)
    ids, mask = torch.randint(0, VOCAB, (4, 16)), torch.ones(4, 16, dtype=torch.long)
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs_and_entropy(model, ids, mask, 1.0, chunk_tokens=8)
    big = [s for s in saved if s and s[-1] == VOCAB and s[0] != VOCAB]  # the head weight is [V, H]
    assert big == [], f"chunked forward saved vocabulary-sized activations: {big}"
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        token_logprobs_and_entropy(model, ids, mask, 1.0)
    assert any(s[-1] == VOCAB and s[0] != VOCAB for s in saved if s), "the plain path should (control)"


# ---- micro-batches: gradient accumulation inside one optimiser step ----------------------------
def test_microbatches_respect_the_budget_and_cover_every_row_once() -> None:
    from asyncrl.trainer.learner import microbatches

    lengths = torch.tensor([5, 30, 12, 12, 1, 40, 7])
    parts = microbatches(lengths, 40)
    rows = torch.cat(parts).tolist()
    assert sorted(rows) == list(range(7))
    for p in parts:
        assert len(p) == 1 or len(p) * int(lengths[p].max()) <= 40
    assert [p.tolist() for p in parts] == [[5], [1], [2, 3, 6], [0, 4]]  # longest first, stable
    assert [p.tolist() for p in microbatches(lengths, 0)] == [list(range(7))]
    assert [p.tolist() for p in microbatches(torch.tensor([50, 60]), 10)] == [[1], [0]]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_microbatch_weights_match_whole_batch_aggregate(agg: str) -> None:
    """Loop twin: Σ w_i · aggregate(l_i, m_i) equals aggregate(l, m) on the stacked batch."""
    from asyncrl.algo import aggregate_loss, microbatch_weights

    g = torch.Generator().manual_seed(2)
    loss = torch.randn(7, 9, generator=g)
    mask = (torch.rand(7, 9, generator=g) > 0.4).float()
    mask[3] = 0  # a row with no valid token
    splits = [[0, 1], [2], [3], [4, 5, 6]]
    widths = [9, 5, 9, 7]  # trimmed columns must hold no valid token
    for rows, w in zip(splits, widths, strict=True):
        mask[rows, w:] = 0
    whole = aggregate_loss(loss, mask, agg, max_tokens=9)  # type: ignore[arg-type]
    parts = [(loss[r, :w], mask[r, :w]) for r, w in zip(splits, widths, strict=True)]
    weights = microbatch_weights([m for _, m in parts], agg)  # type: ignore[arg-type]
    acc = sum(
        wt * aggregate_loss(lt, m, agg, max_tokens=9) for wt, (lt, m) in zip(weights, parts, strict=True)
    )  # type: ignore[arg-type]
    torch.testing.assert_close(acc, whole)
    assert microbatch_weights([torch.zeros(2, 3)], "token_mean") == [0.0]


def _trajectories(n: int, seed: int) -> list[Trajectory]:
    from asyncrl.records import SamplingParams, Task, Trajectory, Turn

    g = torch.Generator().manual_seed(seed)
    out: list[Trajectory] = []
    for i in range(n):

        def ids(k: int) -> list[int]:
            return torch.randint(10, 90, (k,), generator=g).tolist()

        turns = [Turn(role="env", token_ids=ids(int(torch.randint(2, 8, (1,), generator=g))))]
        for _ in range(1 + i % 2):
            k = int(torch.randint(2, 12, (1,), generator=g))
            lp = (-torch.rand(k, generator=g) * 4 - 0.2).tolist()  # behaviour ≠ current: ratios move and clip
            turns += [
                Turn(role="model", token_ids=ids(k), logprobs=lp, version=0),
                Turn(role="tool", token_ids=ids(2)),
            ]
        reward = float(torch.rand(1, generator=g))
        out.append(
            Trajectory(
                id=f"t{i}",
                task=Task(id=f"g{i // 4}", task_type="calc"),
                turns=turns,
                final_reward=reward,
                outcome="success" if reward > 0.5 else "failure",
                group_id=f"g{i // 4}",
                sampling=SamplingParams(temperature=[1.0, 0.7, 1.3][i % 3]),
            )
        )
    return out


def _learner_args(extra: list[str]) -> list[str]:
    return [
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=4",
        "model.num_kv_heads=2",
        "model.intermediate_size=48",
        "model.family=llama",
        "trainer.lr=0.01",
        "rollout.group_size=4",
        "trainer.batch_size=8",
        *extra,
    ]


def _trained(
    extra: list[str], steps: int = 2
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[dict[str, float]]]:
    """Weights and last gradients after ``steps`` learner steps from the same start."""
    from asyncrl.config import load_config
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner

    cfg = load_config(None, _learner_args(extra))
    policy = Policy.build(cfg.model)
    ref = None
    if cfg.algo.kl_coef > 0:
        ref = Policy.build(cfg.model.model_copy(update={"seed": cfg.model.seed + 1}))
    learner = Learner(cfg, policy, ref)
    assert bool(policy.model.is_activation_checkpointing) == cfg.trainer.gradient_checkpointing
    torch.manual_seed(0)  # minibatch shuffles
    metrics = [learner.step(groups_of(_trajectories(8, seed=s)), version=0) for s in range(steps)]
    params = [p.detach().clone() for p in policy.model.parameters()]
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in policy.model.parameters()]
    return params, grads, metrics


LEAN = ["trainer.max_tokens_per_microbatch=40", "trainer.logits_chunk_tokens=7"]
PLAIN = ["trainer.max_tokens_per_microbatch=0", "trainer.logits_chunk_tokens=0"]


@pytest.mark.parametrize(
    "extra",
    [
        ["algo.policy_loss.agg=token_mean"],
        ["algo.policy_loss.agg=seq_mean_token_mean", "algo.entropy_coef=0.01"],
        ["algo.policy_loss.agg=seq_mean_token_sum_norm", "algo.kl_coef=0.1"],
        ["algo.policy_loss.kind=decoupled_ppo", "algo.policy_loss.max_behaviour_divergence=2.0"],
        [
            "trainer.minibatches=2",
            "trainer.epochs=2",
            "algo.policy_loss.max_behaviour_divergence=1.5",
            "algo.policy_loss.divergence_level=sequence",
        ],
    ],
    ids=["token_mean", "seq_mean+entropy", "sum_norm+kl", "decoupled+token_filter", "2x2+seq_filter"],
)
def test_microbatched_step_equals_whole_batch_step(extra: list[str]) -> None:
    p_ref, g_ref, m_ref = _trained([*PLAIN, *extra])
    p, g, m = _trained([*LEAN, *extra])
    assert m[-1]["train/microbatches"] > m_ref[-1]["train/microbatches"]  # the budget did split
    assert m[-1]["train/skipped"] == 0 == m_ref[-1]["train/skipped"]
    for a, b in zip(g, g_ref, strict=True):
        # float32 sums in another order: an element where contributions cancel may differ by ~1e-6
        # absolute (0.1% of itself); a wrong normaliser or a lost micro-batch is off by a factor in
        # the whole tensor, far beyond 1e-4 of its norm
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-8
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    # The gradients are the real check: Adam is invariant to a uniform gradient scale, so equal
    # weights alone would not catch a wrong normaliser. Adam also divides by sqrt(v): where a
    # gradient is ~eps its float rounding moves a weight by a visible fraction of the step, so the
    # weights get an absolute tolerance of lr/200 (the steps themselves are ~lr = 0.01).
    for a, b in zip(p, p_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5)
    for key in ("loss/policy", "train/grad_norm", "policy/tokens", "policy/ratio_max", "entropy/mean"):
        assert m[-1][key] == pytest.approx(m_ref[-1][key], rel=1e-4, abs=1e-6), key


def test_gradient_checkpointing_same_numbers() -> None:
    p_ref, g_ref, _ = _trained(PLAIN, steps=1)
    p, g, _ = _trained([*PLAIN, "trainer.gradient_checkpointing=true"], steps=1)
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(p, p_ref, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]])
def test_chunked_matches_plain_with_lora(targets: list[str]) -> None:
    """A peft-wrapped policy (adapters on attention, or on the head itself) scores the same chunked."""
    from asyncrl.config import LoraConfig
    from asyncrl.policy.lora import apply_lora

    model = apply_lora(tiny_model("llama", False), LoraConfig(rank=4, alpha=8, target_modules=targets))
    with torch.no_grad():  # non-zero adapters, so they change the numbers
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    assert can_chunk_logits(model)
    ids, mask = padded_batch("right")
    temps = torch.tensor([1.0, 0.7, 1.3, 0.5, 2.0])
    ref_lp, ref_ent, ref_grads = _scores_and_grads(model, ids, mask, temps, chunk=0)
    lp, ent, grads = _scores_and_grads(model, ids, mask, temps, chunk=5)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    assert grads.keys() == ref_grads.keys() and all("lora_" in n for n in grads)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], msg=lambda m, n=name: f"{n}: {m}")  # type: ignore[misc]


def test_sft_loss_chunked_equals_the_cross_entropy_reference() -> None:
    """The warm start's loss from chunked log-probs is the masked mean cross-entropy of full logits
    (the loop reference), with the same gradients."""
    from asyncrl.jobs.warm_start import sft_loss

    g = torch.Generator().manual_seed(3)
    batch = []
    for n in (9, 14, 5):
        ids = torch.randint(1, VOCAB, (n,), generator=g).tolist()
        batch.append((ids, [0] * 3 + [1] * (n - 3)))  # a prompt, then model tokens
    model = tiny_model("llama", tied=True)
    chunked = sft_loss(model, batch, pad_id=0, chunk_tokens=4)
    (g_chunked,) = torch.autograd.grad(chunked, [model.lm_head.weight])
    total, count = torch.zeros(()), 0
    for ids, m in batch:  # per sequence, no padding: sum of -log softmax at the masked positions
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        for t in range(1, len(ids)):
            if m[t]:
                total = total - logp[t - 1, ids[t]]
                count += 1
    reference = total / count
    (g_ref,) = torch.autograd.grad(reference, [model.lm_head.weight])
    torch.testing.assert_close(chunked, reference, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_chunked, g_ref, rtol=1e-4, atol=1e-6)


_RETENTION = """
import sys, torch
from asyncrl.policy.memory import set_mmap_threshold
from asyncrl.telemetry.jsonl import memory
if sys.argv[1] != "0":
    assert set_mmap_threshold(int(sys.argv[1]))
big = torch.empty(8 << 20, dtype=torch.uint8).fill_(1)
del big  # glibc now raises its mmap threshold to 8 MiB
base = memory().rss_mb
held, pin = [], []
for i in range(60):  # 240 MiB of 4 MiB tensors, every other one kept a little longer (fragments)
    held.append(torch.empty(4 << 20, dtype=torch.uint8).fill_(1))
    if i % 2:
        held.pop(0)
    pin.append(torch.empty(1000, dtype=torch.uint8))  # small live objects between them
held.clear()
print(memory().rss_mb - base)
"""


@pytest.mark.long  # glibc heap reuse makes the default-threshold side vary run to run: make test-long
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc mallopt")
def test_mmap_threshold_returns_freed_activations_to_the_os() -> None:
    """With glibc's dynamic threshold, freed 4 MiB tensors stay in the heap (RSS kept); with
    ``launcher.malloc_mmap_threshold_kb`` they get pages of their own and RSS comes back down."""
    import subprocess
    import sys

    def kept_mb(kb: int) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _RETENTION, str(kb)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return float(out.stdout.strip().splitlines()[-1])

    assert kept_mb(0) >= 3.5  # at least one 4 MiB block retained by the heap (4.0 MB: exactly one)
    assert kept_mb(1024) < 2


_PEAK_OF_SPAWNED = """
import multiprocessing as mp
from asyncrl.telemetry.jsonl import memory


def child(q):
    q.put(memory().peak_rss_mb)


if __name__ == "__main__":
    big = bytearray(400 << 20)  # the launcher's warm start: a 400 MB peak, then freed
    for i in range(0, len(big), 4096):
        big[i] = 1
    del big
    ctx = mp.get_context("spawn")  # how the local launcher starts every role
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print(memory().peak_rss_mb, q.get(timeout=60))
    p.join()
"""


@pytest.mark.serial  # a figure of memory (a 400 MB peak): alone, after the two-worker part
@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="/proc/self/status")
def test_a_spawned_role_reports_its_own_peak_not_its_launchers(tmp_path: Path) -> None:
    """Linux keeps ``ru_maxrss`` across fork + exec, so a role spawned after the launcher's warm start
    reported the launcher's peak as its own (every role of a cold ``make demo-real`` read 5.8 GB)."""
    import subprocess
    import sys

    script = tmp_path / "peak.py"
    script.write_text(_PEAK_OF_SPAWNED)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True, timeout=120
    )
    launcher, role = (float(x) for x in out.stdout.split())
    assert launcher >= 400 and role < 200, (launcher, role)
