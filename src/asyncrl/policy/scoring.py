"""Scoring tokens: the one definition of "the log-probability the policy assigns to a token".

:func:`token_logprobs` (and :func:`token_logprobs_and_entropy`) is what the trainer optimises and what
the rollout engine's behaviour log-probs are checked against: the tempered softmax of the model's
logits, ``log p(x_t | x_<t) = z_t / T - logsumexp(z / T)``. With identical weights the two agree to
float32 rounding, so the importance ratio of on-policy data is exactly 1 up to that rounding.

The trainer's path scores only the loss positions from the decoder's final hidden states, a chunk of
positions at a time, with a fused log-softmax (:class:`_HeadScores`: two ``[chunk, V]`` buffers, the
logits recomputed in the backward); rows that share prefixes are forwarded once as a token trie
(:mod:`asyncrl.policy.packing`, :mod:`asyncrl.policy.trie_attention`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from asyncrl.policy.model import as_attention_bias, padded_attention_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from asyncrl.policy.packing import LayerShape

CHUNKABLE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
"""Architectures whose logits are exactly ``lm_head(decoder(x))``: no logit scaling or soft-capping,
so :func:`token_logprobs_and_entropy` may apply the head itself, chunk by chunk. Any other model
(or one without a plain output embedding) is scored the plain way, with full logits."""


def _scores(
    logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` and (optionally) entropy under ``softmax(logits)``, over the last dim."""
    # gather - logsumexp avoids materialising a second [..., V] tensor for log_softmax.
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lp, None
    logp = logits - lse.unsqueeze(-1)
    return lp, -(logp.exp() * logp).sum(-1)


def _plain_scores(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float | torch.Tensor,
    keep: torch.Tensor,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``[B, T-1]`` from the model's full logits ``[B, T-1, V]`` over the temperature (the reference path)."""
    mask4d, position_ids = padded_attention_inputs(attention_mask, model.config._attn_implementation)
    out = model(input_ids=input_ids, attention_mask=mask4d, position_ids=position_ids, use_cache=False)
    logits: torch.Tensor = out.logits[:, :-1].float()
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature.to(device=logits.device, dtype=logits.dtype).reshape(-1, 1, 1)
    elif temperature != 1.0:
        logits = logits / temperature
    zero = torch.zeros((), dtype=logits.dtype, device=logits.device)
    lp, ent = _scores(logits, input_ids[:, 1:], with_entropy)
    return torch.where(keep, lp, zero), (None if ent is None else torch.where(keep, ent, zero))


def _chunk_scores(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temp: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of ``N`` positions from their final hidden states ``[N, H]`` (one chunk's logits)."""
    logits = head(hidden).float() / temp.unsqueeze(-1)
    lp, ent = _scores(logits, targets, with_entropy)
    return lp, (ent if ent is not None else torch.zeros_like(lp))


def _fusable(head: torch.nn.Module) -> bool:
    """Whether :class:`_HeadScores` computes ``head``: a plain linear layer without bias."""
    return type(head) is torch.nn.Linear and head.bias is None


class _HeadScores(torch.autograd.Function):
    """Log-probs ``lp`` of ``targets`` and entropies ``H`` of ``N`` positions from their hidden states,
    in place on two ``[N, V]`` buffers (the unfused chunk allocates ~10: each elementwise op and its
    gradient), saving only the inputs: the backward recomputes the logits, like the checkpointed chunk.

    With ``z = h Wᵀ / T``, ``log p = z - logsumexp(z)``, ``lp = log p_t`` and ``H = -Σ p log p``:
    ``∂lp/∂z = onehot(t) - p`` and ``∂H/∂z = -p (log p + H)``, so with the outputs' gradients
    ``g_lp``, ``g_H``: ``g_z = p · (-g_H (log p + H) - g_lp) + onehot(t) · g_lp``; then
    ``g_h = (g_z / T) W`` and ``g_W = (g_z / T)ᵀ h``.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        temp: torch.Tensor,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.nn.functional.linear(hidden, weight).float().div_(temp.unsqueeze(-1))
        lse = torch.logsumexp(z, dim=-1)
        lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        if with_entropy:  # -Σ p log p as a batched dot product: no third [N, V] buffer
            logp = z.sub_(lse.unsqueeze(-1))
            ent = -(logp.exp().unsqueeze(-2) @ logp.unsqueeze(-1)).reshape(-1)
        else:
            ent = torch.zeros_like(lp)
        ctx.save_for_backward(hidden, weight, targets, temp, lse, ent)
        ctx.with_entropy = with_entropy
        return lp, ent

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g_lp: torch.Tensor, g_ent: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, targets, temp, lse, ent = ctx.saved_tensors
        z = torch.nn.functional.linear(hidden, weight).float()
        z.div_(temp.unsqueeze(-1)).sub_(lse.unsqueeze(-1))  # log p
        p = z.exp()
        if ctx.with_entropy:
            z.add_(ent.unsqueeze(-1)).mul_(-g_ent.unsqueeze(-1)).sub_(g_lp.unsqueeze(-1)).mul_(p)
        else:
            z = p.mul_(-g_lp.unsqueeze(-1))
        del p
        z.scatter_add_(-1, targets.unsqueeze(-1), g_lp.unsqueeze(-1))
        g = z.div_(temp.unsqueeze(-1)).to(weight.dtype)
        g_hidden = g @ weight if ctx.needs_input_grad[0] else None
        g_weight = g.T @ hidden if ctx.needs_input_grad[1] else None
        return g_hidden, g_weight, None, None, None


def _head_scores(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temp: torch.Tensor,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``[N]`` of ``N`` positions from their final hidden states ``[N, H]``, ``chunk_tokens`` at a time.

    A plain linear head (every architecture of :data:`CHUNKABLE_MODEL_TYPES` as built) runs the fused
    :class:`_HeadScores`; any other head, with autograd on, runs each chunk under non-reentrant
    :func:`torch.utils.checkpoint.checkpoint`. Either way the forward keeps only the chunk's hidden
    states, the backward recomputes that chunk's logits, so at most one ``[chunk_tokens, V]`` block of
    logits (and its gradient) is alive at a time.
    ``chunk_tokens = 0`` scores all ``N`` in one block.
    """
    grad = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    step = chunk_tokens if chunk_tokens > 0 else max(int(hidden.shape[0]), 1)
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, hidden.shape[0], step):
        args = (head, hidden[s : s + step], targets[s : s + step], temp[s : s + step])
        if _fusable(head):  # recomputes the chunk's logits in its own backward
            lp, ent = _HeadScores.apply(args[1], head.weight, *args[2:], with_entropy)  # type: ignore[no-untyped-call]
        elif grad:
            lp, ent = torch.utils.checkpoint.checkpoint(
                _chunk_scores, *args, with_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk_scores(*args, with_entropy)
        lps.append(lp)
        ents.append(ent)
    empty = hidden.new_zeros(0, dtype=torch.float32)
    lp_all = torch.cat(lps) if lps else empty
    return lp_all, ((torch.cat(ents) if ents else empty) if with_entropy else None)


def _kept_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    keep: torch.Tensor,
    share_prefixes: bool,
) -> torch.Tensor:
    """The decoder's final hidden states ``[N, H]`` that predict the ``N`` ``keep`` positions.

    From the padded batch, or (``share_prefixes``) from ONE forward of the rows' token trie
    (:mod:`asyncrl.policy.packing`): every shared prefix computed once, the hidden state predicting
    ``x[b, t+1]`` that of node ``node(b, t)`` (a shared node is read by each of its rows).
    """
    hf: Any = model  # get_decoder is untyped in transformers
    decoder: Any = hf.get_decoder()
    attn = model.config._attn_implementation
    if not share_prefixes:
        mask4d, position_ids = padded_attention_inputs(attention_mask, attn)
        out = decoder(input_ids=input_ids, attention_mask=mask4d, position_ids=position_ids, use_cache=False)
        hidden: torch.Tensor = out.last_hidden_state[:, :-1][keep]
        return hidden
    from asyncrl.policy.packing import build_prefix_tree
    from asyncrl.policy.trie_attention import trie_plan

    tree = build_prefix_tree(input_ids, attention_mask.to(torch.bool))
    ids, positions = tree.ids.unsqueeze(0), tree.positions.unsqueeze(0)
    if attn == "sdpa":  # each row's new nodes against its own path (asyncrl.policy.trie_attention)
        plan = trie_plan(tree.paths, input_ids.device)
        out = decoder(input_ids=ids, position_ids=positions, use_cache=False, trie=plan)
    else:  # the dense tree mask
        mask = as_attention_bias(tree.allowed[None, None], attn)
        out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    shared: torch.Tensor = out.last_hidden_state[0, tree.node[:, :-1][keep]]
    return shared


def _chunked_scores(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float | torch.Tensor,
    keep: torch.Tensor,
    with_entropy: bool,
    chunk_tokens: int,
    share_prefixes: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``[B, T-1]`` (0 off ``keep``) from the decoder's hidden states (:func:`_kept_hidden`):
    the LM head runs on the ``keep`` positions only (:func:`_head_scores`), so padding and positions
    outside the loss cost no head matmul. The temperature is one value per row, or a float for all."""
    hidden = _kept_hidden(model, input_ids, attention_mask, keep, share_prefixes)
    temp = torch.as_tensor(temperature, dtype=torch.float32, device=keep.device)
    temp = temp.reshape(-1, 1).expand(keep.shape)[keep]
    hf: Any = model  # get_output_embeddings is untyped in transformers
    lp, ent = _head_scores(
        hf.get_output_embeddings(), hidden, input_ids[:, 1:][keep], temp, with_entropy, chunk_tokens
    )
    zeros = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device)
    return zeros.masked_scatter(keep, lp), (None if ent is None else zeros.masked_scatter(keep, ent))


def can_chunk_logits(model: PreTrainedModel) -> bool:
    """Whether :func:`token_logprobs_and_entropy` can score ``model`` from hidden states in chunks."""
    hf: Any = model
    head = hf.get_output_embeddings()
    return (
        getattr(model.config, "model_type", None) in CHUNKABLE_MODEL_TYPES
        and isinstance(head, torch.nn.Module)
        and hasattr(model, "get_decoder")
    )


def decoder_layer_shape(model: PreTrainedModel) -> LayerShape:
    """The cost shape of ``model``'s decoder layers (:class:`~asyncrl.policy.packing.LayerShape`):
    the first layer's weights (adapters included) and its query width."""
    from asyncrl.policy.packing import LayerShape

    hf: Any = model
    layer: torch.nn.Module = hf.get_decoder().layers[0]
    cfg = model.config
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return LayerShape(sum(p.numel() for p in layer.parameters()), int(cfg.num_attention_heads * head))


def token_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    with_entropy: bool = True,
    chunk_tokens: int = 0,
    positions: torch.Tensor | None = None,
    share_prefixes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs and entropies ``[B, T]`` under ``softmax(logits / temperature)``.

    ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``; position 0 (no context)
    and padding positions (``attention_mask == 0``) are 0.0. ``entropy[b, t]`` is the
    entropy of the distribution that token ``t`` was drawn from, with the same zeros.
    ``temperature`` is a float or one value per row (per-episode temperature jitter).
    Differentiable; works with right padding (the trainer's layout) and any other.

    ``chunk_tokens > 0`` (``trainer.logits_chunk_tokens``) never materialises the ``[B, T, V]``
    logits: the decoder's final hidden states are scored ``chunk_tokens`` positions at a time
    (see :func:`_head_scores`); the numbers are those of the plain path up to float rounding.
    ``0``, or an architecture outside :data:`CHUNKABLE_MODEL_TYPES`, takes the plain path.

    ``positions`` (bool ``[B, T]``, e.g. the loss mask): only these tokens are scored, the others
    are 0 like padding; on the hidden-state paths the LM head and its log-softmax then run at these
    positions alone (TRL's ``logits_to_keep``, for any mask: multi-turn trajectories hold several
    scored spans). ``share_prefixes``: forward the rows' token trie once instead of the padded batch
    (:mod:`asyncrl.policy.packing`; rows sharing a prompt compute it once) — same numbers up to
    float rounding; architectures outside :data:`CHUNKABLE_MODEL_TYPES` take the padded path.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, T]"
        )
    if positions is not None and positions.shape != input_ids.shape:
        raise ValueError(
            f"positions {tuple(positions.shape)} must be [B, T] like input_ids {tuple(input_ids.shape)}"
        )
    b, t = input_ids.shape
    if isinstance(temperature, torch.Tensor) and temperature.numel() != b:
        raise ValueError(f"temperature has {temperature.numel()} entries for a batch of {b}")
    valid = attention_mask.to(torch.bool)
    input_ids = input_ids.masked_fill(~valid, 0)  # padding may hold any id (e.g. -100)
    zeros = torch.zeros(b, 1, dtype=torch.float32, device=input_ids.device)
    if t < 2:
        return zeros.expand(b, t).clone(), (zeros.expand(b, t).clone() if with_entropy else None)
    keep = valid[:, 1:] & valid[:, :-1]
    if positions is not None:
        keep = keep & positions[:, 1:].to(torch.bool)
    if (share_prefixes or chunk_tokens > 0) and can_chunk_logits(model):
        lp, ent = _chunked_scores(
            model, input_ids, attention_mask, temperature, keep, with_entropy, chunk_tokens, share_prefixes
        )
    else:
        lp, ent = _plain_scores(model, input_ids, attention_mask, temperature, keep, with_entropy)
    return torch.cat([zeros, lp], dim=1), (None if ent is None else torch.cat([zeros, ent], dim=1))


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    *,
    chunk_tokens: int = 0,
    positions: torch.Tensor | None = None,
    share_prefixes: bool = False,
) -> torch.Tensor:
    """Per-token log-probs ``[B, T]``; see :func:`token_logprobs_and_entropy`."""
    return token_logprobs_and_entropy(
        model,
        input_ids,
        attention_mask,
        temperature,
        with_entropy=False,
        chunk_tokens=chunk_tokens,
        positions=positions,
        share_prefixes=share_prefixes,
    )[0]
