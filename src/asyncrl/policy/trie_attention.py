"""Attention over a token trie that computes each row's new nodes against its own path only.

The trainer forwards a micro-batch's rows as one packed token trie (:mod:`asyncrl.policy.packing`):
node ``i`` attends to its ancestors and itself. Over the dense ``N × N`` tree mask, attention
computes every pair and masks most of them (on the demo-real batch 27 % of the 920² pairs are
ancestors). The trie's nodes are numbered in the order the rows create them, so row ``r``'s tokens
are its path ``p_r`` (``L_r`` nodes): a prefix of nodes earlier rows created, then ``n_r`` new nodes
``s_r .. s_r + n_r - 1``, contiguous. New node ``s_r + i`` sits at depth ``L_r - n_r + i`` and
attends to ``p_r[0 .. L_r - n_r + i]``. Hence, per layer,

    out[s_r : s_r + n_r] = softmax(q[s_r : s_r + n_r] · k[p_r]ᵀ · scale + M_r) · v[p_r]

with ``M_r`` the lower-right causal mask of ``n_r × L_r`` (``is_causal`` where ``n_r = L_r``, the
row that creates its whole path): one ``scaled_dot_product_attention`` per row that owns nodes, the
keys and values gathered once per layer for all rows. That computes ``Σ_r n_r·L_r`` pairs instead of
``N²``, and the numbers are those of the dense tree mask up to float rounding (every softmax row holds
the same scores; ``tests/test_learner_passes.py`` checks outputs and gradients).

A model whose attention implementation is ``sdpa`` runs it when its forward gets the plan as the keyword
``trie``: importing this module registers, under transformers' ``sdpa`` name, a function that takes that
path with a plan and is transformers' own sdpa without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward


@dataclass(frozen=True)
class TriePlan:
    """Which rows' new nodes attend to which keys (see the module docstring).

    ``keys``: ``[Σ L_r]`` the concatenated paths of the rows that own nodes; ``spans``: per such row,
    ``(first owned node, owned nodes n_r, offset of its path in keys, path length L_r)``; ``masks``:
    per such row the bool ``[n_r, L_r]`` lower-right causal mask, ``None`` where ``n_r = L_r``.
    """

    keys: torch.Tensor
    spans: tuple[tuple[int, int, int, int], ...]
    masks: tuple[torch.Tensor | None, ...]

    @property
    def pairs(self) -> int:
        """Query-key pairs the kernel computes (a row's masked upper triangle included)."""
        return sum(n * length for _, n, _, length in self.spans)


def trie_plan(paths: list[list[int]], device: torch.device | None = None) -> TriePlan:
    """The plan of a trie whose rows' node paths are ``paths`` (nodes numbered in creation order)."""
    keys: list[int] = []
    spans: list[tuple[int, int, int, int]] = []
    masks: list[torch.Tensor | None] = []
    created = 0
    for path in paths:
        length = len(path)
        owned = sum(1 for node in path if node >= created)
        if owned == 0:
            continue
        first = path[length - owned]
        if first != created or path[-1] != created + owned - 1:
            raise ValueError("trie_plan: a row's new nodes must be numbered next, in order")
        spans.append((first, owned, len(keys), length))
        keys.extend(path)
        created += owned
        if owned == length:
            masks.append(None)
        else:
            q = torch.arange(length - owned, length, device=device)
            masks.append(torch.arange(length, device=device)[None, :] <= q[:, None])
    return TriePlan(torch.tensor(keys, dtype=torch.long, device=device), tuple(spans), tuple(masks))


def trie_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: TriePlan, scale: float
) -> torch.Tensor:
    """Attention of the packed trie ``query`` ``[1, heads, N, d]`` over ``key``/``value``
    ``[1, kv_heads, N, d]`` (grouped-query when ``kv_heads < heads``), ``[1, heads, N, d]`` out."""
    gqa = key.shape[1] != query.shape[1]
    k, v = key.index_select(2, plan.keys), value.index_select(2, plan.keys)
    outs = []
    for (first, n, at, length), mask in zip(plan.spans, plan.masks, strict=True):
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, first : first + n],
                k[:, :, at : at + length],
                v[:, :, at : at + length],
                attn_mask=mask,
                is_causal=mask is None,
                scale=scale,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outs, dim=2)


def _sdpa_or_trie(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *args: Any,
    trie: TriePlan | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, or with a plan (``trie=``) :func:`trie_attention`
    (``[1, N, heads, d]`` out, as sdpa returns it)."""
    if trie is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    if query.shape[0] != 1 or args or kwargs.get("dropout"):
        raise ValueError("trie attention: one packed trie, no attention dropout")
    scaling = kwargs.get("scaling")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return trie_attention(query, key, value, trie, scale).transpose(1, 2).contiguous(), None


# The plan travels as a keyword of the model's forward down to every attention call, so a recomputed
# forward (gradient checkpointing runs it again inside backward) takes the same path.
AttentionInterface.register("sdpa", _sdpa_or_trie)
