"""A written-out forward for the merged copy's packed weights: the one-token decode step
(``rollout.engine.fused_decode``) and the prefill of a level of prompt spans (``rollout.engine.fused_prefill``).

The Hugging Face forward pass runs, per layer, three q/k/v and two gate/up matmuls on the same input, layout
copies around the attention kernel (``repeat_kv``: every key and value copied once per query head sharing it)
and the cache update through generic code. :class:`FusedDecoder` runs the same arithmetic for new tokens of
a Llama-layout model (:data:`FUSABLE`, no sliding window): q/k/v
as **one** packed matmul (:class:`FusedLinear`) and gate/up as one; the rotary tables (the model's own rotary
module, so every rope type it supports) and the additive mask once per step, not per layer; the step's k and
v written straight into the cache's buffers (:class:`~asyncrl.engine.decode.BufferLayer`); attention as
``baddbmm`` + softmax + ``bmm`` with each kv head's query heads (and, in a prefill, their query positions)
stacked as its query rows (no repeat or copy of the keys; docs/engines.md says why not
``scaled_dot_product_attention``). The norms, the activation, the embedding, o, down and the LM head are the
merged copy's own modules; a prefill runs the LM head at each row's last position only.

The result equals the model's forward up to float rounding (``tests/test_engine.py`` checks the log-probs
against the trainer's). The stacked weights are derived data, repacked at every refold of the merged copy
(:meth:`FusedForward.repack`), so the weight-sync canary's probe, which decodes through this step, sees the
weights served.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.models.llama.modeling_llama import rotate_half

from asyncrl.engine.cpu.packed import PackedForward, PackedLinear, pack, packable, packed_linear
from asyncrl.engine.decode import BufferLayer

FUSABLE = {
    "llama": ("LlamaAttention", "LlamaMLP"),
    "qwen2": ("Qwen2Attention", "Qwen2MLP"),
    "mistral": ("MistralAttention", "MistralMLP"),
}
"""Model types the fused step knows, with the attention and MLP classes whose arithmetic it writes out."""


class FusedLinear(torch.nn.Module):
    """Several linear layers on the same input as one packed matmul: their weights (and biases) stacked
    along the output dimension, packed by oneDNN. The parts' parameters stay theirs (nothing is
    registered here); :meth:`repack` after every change of them."""

    def __init__(self, parts: list[PackedLinear]) -> None:
        super().__init__()
        self.parts = parts  # a plain list: not submodules, so no second path to their parameters
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.packed = torch.empty(0)
        self.bias: torch.Tensor | None = None
        self.repack()

    @torch.no_grad()
    def repack(self) -> None:
        """Stack and pack the parts' weights as they are now."""
        weight = torch.cat([p.weight.detach() for p in self.parts])
        self.packed = pack(weight)
        biases = [
            p.bias.detach() if p.bias is not None else p.weight.new_zeros(p.out_features) for p in self.parts
        ]
        self.bias = None if all(p.bias is None for p in self.parts) else torch.cat(biases)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, parts={len(self.parts)}, packed"


class StepInputs(NamedTuple):
    """What every layer of one forward shares: the rotary tables and the additive mask. A decode step
    (``x [rows, hidden]``): ``[rows, 1, dim]`` and ``[rows * kv_heads, 1, columns]``. A prefill of up to ``n``
    tokens a row (``x [tokens, hidden]``, the rows' real tokens only, row by row): ``[tokens, 1, dim]`` and
    ``[rows * kv_heads, heads / kv_heads * n, columns]`` (a kv head's query rows: its query heads, each at
    every position of the row's right-aligned window), ``real`` the tokens' places in the ``rows * n``
    window and ``n``."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor
    real: torch.Tensor | None = None
    n: int = 1


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scaling: float, kernel: str
) -> torch.Tensor:
    """``softmax(q kᵀ · scaling + mask) v`` over ``q [b, queries, d]``, ``keys, values [b, columns, d]`` and
    an additive ``mask [b, queries, columns]``. float32: ``baddbmm`` + softmax + ``bmm``. Any other dtype
    (bfloat16) rounds where the model's own attention ``kernel`` (``config._attn_implementation``) rounds,
    so the step computes what the model's forward computes: ``sdpa``, the same kernel on the stacked query
    rows (one head of ``queries`` rows per batch entry); else transformers' eager attention (the scores
    rounded, scaled, masked; the softmax in float32, rounded before ``bmm``). In bfloat16 ``baddbmm``'s
    single rounding alone moved the tiny models' log-probs 3x further from the trainer's than the
    model's own decode step (docs/engines.md)."""
    if q.dtype == torch.float32:
        scores = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=scaling)
        return torch.bmm(torch.softmax(scores, dim=-1), values)
    if kernel == "sdpa":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return sdpa(q[:, None], keys[:, None], values[:, None], attn_mask=mask[:, None], scale=scaling)[:, 0]
    # the cache's views copied first: bfloat16 ``bmm`` on them copies too, and then ran 2x slower
    scores = torch.bmm(q, keys.contiguous().transpose(1, 2)).mul_(scaling).add_(mask)
    return torch.bmm(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), values.contiguous())


class FusedAttention(torch.nn.Module):
    """One layer's attention for one new token per row (see the module docstring)."""

    def __init__(self, attn: Any, kernel: str) -> None:
        super().__init__()
        self.kernel = kernel  # the model's attention kernel: how a bfloat16 step rounds (attend)
        self.qkv_proj = FusedLinear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj: PackedLinear = attn.o_proj
        self.scaling = float(attn.scaling)
        self.head_dim = int(attn.head_dim)
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.heads = attn.q_proj.out_features // self.head_dim

    def forward(self, x: torch.Tensor, step: StepInputs, layer: BufferLayer) -> torch.Tensor:
        if step.real is not None:
            return self._tokens(x, step, layer)
        rows, h, kv, d = x.shape[0], self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv_proj(x).view(rows, h + 2 * kv, d)
        qk = qkv[:, : h + kv]
        # cos, sin [rows, 1, dim]: q and k rotated together (transformers' untyped rotate_half)
        qk = qk * step.cos + rotate_half(qk) * step.sin  # type: ignore[no-untyped-call]
        keys, values = layer.update(qk[:, h:, None], qkv[:, h + kv :, None])
        q = qk[:, :h].reshape(rows * kv, h // kv, d)  # head j uses kv head j // (h // kv), as repeat_kv
        keys, values = keys.flatten(0, 1), values.flatten(0, 1)  # views [rows * kv, columns, d]
        out = attend(q, keys, values, step.mask, self.scaling, self.kernel).reshape(rows, h * d)
        projected: torch.Tensor = self.o_proj(out)
        return projected

    def _tokens(self, x: torch.Tensor, step: StepInputs, layer: BufferLayer) -> torch.Tensor:
        """A prefill's real tokens ``x [tokens, hidden]``: the matmuls on those only; attention in the rows'
        windows (``step.real``), where a padding query is zero and sees only its own zero key."""
        assert step.real is not None
        h, kv, d, n = self.heads, self.kv_heads, self.head_dim, step.n
        rows = step.mask.shape[0] // kv
        qkv = self.qkv_proj(x).view(x.shape[0], h + 2 * kv, d)
        qk = qkv[:, : h + kv]
        qkv[:, : h + kv] = qk * step.cos + rotate_half(qk) * step.sin  # type: ignore[no-untyped-call]
        window = qkv.new_zeros(rows * n, h + 2 * kv, d).index_copy_(0, step.real, qkv).view(rows, n, -1, d)
        keys, values = layer.update(
            window[:, :, h : h + kv].transpose(1, 2), window[:, :, h + kv :].transpose(1, 2)
        )
        q = window[:, :, :h].reshape(rows, n, kv, h // kv, d).permute(0, 2, 3, 1, 4).reshape(rows * kv, -1, d)
        keys, values = keys.flatten(0, 1), values.flatten(0, 1)  # views [rows * kv, columns, d]
        out = attend(q, keys, values, step.mask, self.scaling, self.kernel)  # [rows * kv, h / kv * n, d]
        out = out.view(rows, kv, h // kv, n, d).permute(0, 3, 1, 2, 4).reshape(rows * n, h * d)
        projected: torch.Tensor = self.o_proj(out.index_select(0, step.real))
        return projected


class FusedMLP(torch.nn.Module):
    """One layer's MLP, ``down(act(gate(x)) * up(x))``, gate and up as one matmul."""

    def __init__(self, mlp: Any) -> None:
        super().__init__()
        self.gate_up_proj = FusedLinear([mlp.gate_proj, mlp.up_proj])
        self.down_proj: PackedLinear = mlp.down_proj
        self.act_fn = mlp.act_fn
        self.split = mlp.gate_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        down: torch.Tensor = self.down_proj(
            self.act_fn(gate_up[..., : self.split]) * gate_up[..., self.split :]
        )
        return down


class FusedLayer(torch.nn.Module):
    def __init__(self, layer: Any, kernel: str) -> None:
        super().__init__()
        self.input_layernorm = layer.input_layernorm
        self.self_attn = FusedAttention(layer.self_attn, kernel)
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.mlp = FusedMLP(layer.mlp)

    def forward(self, x: torch.Tensor, step: StepInputs, cache_layer: BufferLayer) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), step, cache_layer)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class FusedDecoder(torch.nn.Module):
    """The decode step of :func:`fusable` model whose linear layers are :class:`PackedLinear` s (the
    module docstring). Built from, and sharing every tensor with, the model (the stacked q/k/v and
    gate/up weights are its own packed copies)."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        inner: Any = model.model
        self.embed_tokens = inner.embed_tokens
        self.rotary_emb = inner.rotary_emb
        kernel = str(model.config._attn_implementation)  # transformers' only spelling of the kernel's name
        layers = [FusedLayer(layer, kernel) for layer in inner.layers]
        self.layers = torch.nn.ModuleList(layers)
        self.norm = inner.norm
        self.kv_heads = layers[0].self_attn.kv_heads
        self.groups = layers[0].self_attn.heads // self.kv_heads
        self.lm_head: PackedLinear = model.lm_head  # type: ignore[assignment]
        self.stacks = [s for layer in layers for s in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj)]

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """:meth:`Forward.decode <asyncrl.engine.forward.Forward.decode>` (every cache layer a :class:`BufferLayer`)."""
        x = self.embed_tokens(tokens)
        cos, sin = self.rotary_emb(x, positions[:, None])  # [rows, 1, dim]: once for every layer
        bias = torch.zeros(valid.shape, dtype=x.dtype, device=x.device).masked_fill_(~valid, float("-inf"))
        mask = bias.repeat_interleave(self.kv_heads, dim=0)[:, None, :]  # [rows * kv_heads, 1, columns]
        step = StepInputs(cos, sin, mask)
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            assert isinstance(cache_layer, BufferLayer)
            x = layer(x, step, cache_layer)  # a call: core lending's hook polls here
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """:meth:`Forward.prefill <asyncrl.engine.forward.Forward.prefill>` of right-aligned windows (the last ``n``
        of the ``columns``; every cache layer a :class:`BufferLayer` holding the others): a window column the
        last query does not see is padding, skipped by the matmuls."""
        rows, n, columns = allowed.shape
        own = allowed[:, -1, columns - n :]  # [rows, n]: the windows' real tokens (the last query sees each)
        real = own.reshape(-1).nonzero().squeeze(-1)
        x = self.embed_tokens(tokens.reshape(-1)[real])
        cos, sin = self.rotary_emb(x, positions.reshape(1, -1)[:, real])  # [1, tokens, dim]
        bias = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(~allowed, float("-inf"))
        shape = (rows, self.kv_heads, self.groups, n, columns)
        mask = bias[:, None, None].expand(shape).reshape(rows * self.kv_heads, self.groups * n, columns)
        step = StepInputs(cos[0, :, None], sin[0, :, None], mask, real, n)
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            assert isinstance(cache_layer, BufferLayer)
            x = layer(x, step, cache_layer)
        last = own.sum(1).cumsum(0) - 1  # each row's last token among x's
        logits: torch.Tensor = self.lm_head(self.norm(x[last]))
        return logits


def fusable(model: PreTrainedModel) -> bool:
    """Whether :class:`FusedDecoder` computes ``model``'s forward once its linears are packed: a known
    Llama-layout model (no sliding window, no logit scaling) whose linear layers
    :func:`~asyncrl.engine.cpu.packed.pack_linears` all packs, in one dtype (float32 or bfloat16)."""
    cfg = model.config.to_dict()
    names = FUSABLE.get(str(cfg.get("model_type", "")))
    children = dict(model.named_children())
    inner: Any = children.get("model")  # a transformers model body: layers of its own classes
    if names is None or inner is None or "rotary_emb" not in dict(inner.named_children()):
        return False
    if cfg.get("sliding_window") is not None and cfg.get("use_sliding_window", True):
        return False
    linears = [children.get("lm_head", torch.nn.Identity())]
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (type(attn).__name__, type(mlp).__name__) != names or vars(attn).get("sliding_window"):
            return False
        linears += [
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        ]
    return (
        all(packable(m) for m in linears) and len({m.weight.dtype for m in linears}) == 1
    )  # one stack, one dtype


class FusedForward(PackedForward):
    """Packed linears, decode steps (and prefills: ``fused_prefill``) through :class:`FusedDecoder`, whose
    stacks' parts keep no packed copy (they run only in the model's own forward, as plain ``linear``)."""

    def __init__(self, model: PreTrainedModel, fused_prefill: bool) -> None:
        super().__init__(model)
        self.fused = FusedDecoder(model)
        self.fused_prefill = fused_prefill
        stacked = {id(p) for stack in self.fused.stacks for p in stack.parts}
        for layer in self.packed:
            if id(layer) in stacked:
                layer.unpack()
        self.packed = [layer for layer in self.packed if id(layer) not in stacked]

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        logits: torch.Tensor = self.fused(tokens, positions, valid, cache)
        return logits

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        if self.fused_prefill:
            return self.fused.prefill(tokens, positions, allowed, cache)
        return super().prefill(tokens, positions, allowed, cache)

    def repack(self, changed: set[int] | None) -> None:
        super().repack(changed)
        for stack in self.fused.stacks:
            if changed is None or any(id(p.weight) in changed for p in stack.parts):
                stack.repack()

    def modules(self) -> list[torch.nn.Module]:
        return [self.model, self.fused]
