"""Memory-lean training: chunked log-probs, token-budget micro-batches, gradient checkpointing.

Each lean path is checked against the plain one (full logits, one pass, no checkpointing) with
``torch.testing.assert_close``: log-probs, entropies, gradients, and the weights after a step.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from asyncrl.policy.model import can_chunk_logits, token_logprobs_and_entropy

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
