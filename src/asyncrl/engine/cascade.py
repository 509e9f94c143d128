"""Shared-prefix ("cascade") decode attention for the built-in engine's growing-cache decode path
(``rollout.engine.shared_prefix_attention``).

The rows of a chunk often share a prompt prefix (a GRPO group samples one prompt 8 or 16 times), and a
decode step's attention reads each row's KV, so the shared prompt's KV is read once per row, per layer.
Here the rows are grouped by their longest prefix shared with another row (:func:`prefix_groups`); a
group's prefix KV is copied once into a tensor of its own, and each decode step attends

* over the prefix **once per group**: the group's queries stacked, ``[kv_heads, rows x heads_per_kv,
  head_dim]`` against the prefix ``[kv_heads, prefix, head_dim]`` (one matmul reads it once), and
* over each row's **suffix** (its prompt after the group's prefix, then its sampled tokens) in the
  rows' own cache,

then merges the two partial softmaxes exactly (the log-sum-exp merge of FlashInfer's cascade
attention): with ``m`` the partial maxima, ``l`` the partial sums of ``exp(s - m)`` and ``o`` the
partial unnormalised outputs, ``out = (o_p e^(m_p - m) + o_s e^(m_s - m)) / (l_p e^(m_p - m) + l_s
e^(m_s - m))``, ``m = max(m_p, m_s)``. Every term is float32; the result equals attention over the
whole row up to float rounding (``tests/test_engine.py`` checks the log-probs against the trainer's).

The rows' cache is the ordinary growing cache (:func:`~asyncrl.engine.decode.buffer_cache`: a row's
prompt in its ``valid`` columns of the first ``width``, sampled tokens from column ``width`` on): the
decode step still writes its token there, and compaction and the prefix cache read it as before; only
the attention reads the prefix from the group tensor and the suffix from the window ``start..`` of the
rows' cache (``start``: the first column any row's suffix prompt occupies), each row's prefix columns in
that window masked off.

The model runs the step with its attention implementation switched to :data:`ATTENTION` (registered in
transformers' attention interface) for the step only, the group state passed as a keyword argument.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache, PreTrainedModel

from asyncrl.engine.decode import layer_kv

ATTENTION = "asyncrl_shared_prefix"
"""The attention implementation name a shared-prefix decode step runs under."""


def prefix_groups(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """``(group of each row, prefix length of each group)``.

    A row's prefix is the longest prefix it shares with any other row; rows with the same prefix form
    a group. A row sharing nothing, or whose shared prefix no other row has as its own (it shares less
    with the others than they do among themselves), is a group of one whose prefix is its whole prompt.
    """
    n = len(prompts)
    lcp = [0] * n
    order = sorted(range(n), key=lambda i: prompts[i])
    for a, b in pairwise(order):  # the longest common prefix is with a neighbour
        k = _common(prompts[a], prompts[b])
        lcp[a], lcp[b] = max(lcp[a], k), max(lcp[b], k)
    keys: list[tuple[Any, ...]] = [tuple(p[:k]) for p, k in zip(prompts, lcp, strict=True)]
    count: dict[tuple[Any, ...], int] = {}
    for key in keys:
        count[key] = count.get(key, 0) + 1
    ids: dict[tuple[Any, ...], int] = {}
    group: list[int] = []
    lengths: list[int] = []
    for r, key in enumerate(keys):
        if lcp[r] == 0 or count[key] == 1:
            key, length = ("row", r), len(prompts[r])
        else:
            length = lcp[r]
        if key not in ids:
            ids[key] = len(lengths)
            lengths.append(length)
        group.append(ids[key])
    return group, lengths


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class SharedPrefix:
    """One chunk's shared-prefix attention state: the groups' prefix KV and the rows' suffix windows.

    ``cache``: the rows' growing cache after the prefill, ``valid [rows, width]`` its real columns (a
    row's prompt tokens, in order); ``prompts``: the rows' prompts, in cache row order.
    """

    def __init__(self, cache: DynamicCache, prompts: list[list[int]], valid: torch.Tensor) -> None:
        group, lengths = prefix_groups(prompts)
        dev = valid.device
        prefix = torch.tensor([lengths[g] for g in group], device=dev)
        rank = valid.long().cumsum(1)  # real columns up to and including each column
        is_prefix = valid & (rank <= prefix[:, None])
        is_tail = valid & ~is_prefix
        tail_cols = is_tail.any(0).nonzero()
        self.width = valid.shape[1]
        self.start = int(tail_cols[0]) if len(tail_cols) else self.width
        self.tail_valid = is_tail[:, self.start :]
        self.group = torch.tensor(group, dtype=torch.long, device=dev)
        first = {g: r for r, g in reversed(list(enumerate(group)))}  # a group's first row holds its prefix
        columns = [is_prefix[first[g]].nonzero().squeeze(-1) for g in range(len(lengths))]
        longest = max(lengths)
        self.prefix_k: list[torch.Tensor] = []
        self.prefix_v: list[torch.Tensor] = []
        for layer in cache.layers:
            keys, values = layer_kv(layer)
            shape = (len(lengths), keys.shape[1], longest, keys.shape[-1])
            pk, pv = keys.new_zeros(shape), values.new_zeros(shape)
            for g, cols in enumerate(columns):
                pk[g, :, : len(cols)] = keys[first[g]].index_select(-2, cols)
                pv[g, :, : len(cols)] = values[first[g]].index_select(-2, cols)
            self.prefix_k.append(pk)
            self.prefix_v.append(pv)
        allowed = torch.arange(longest, device=dev)[None, :] < torch.tensor(lengths, device=dev)[:, None]
        self.prefix_bias = _bias(allowed)[:, None, None]
        self.suffix_bias = torch.empty(0)
        self._index()

    def _index(self) -> None:
        """The stacking of the rows' queries per group: ``gather [groups, slots]`` (row of each slot; a
        group with fewer rows repeats its first) and ``scatter [rows]`` (each row's ``group * slots +
        slot``)."""
        groups = int(self.group.max()) + 1
        members = [(self.group == g).nonzero().squeeze(-1) for g in range(groups)]
        slots = max(len(m) for m in members)
        self.gather = torch.stack([torch.cat([m, m[:1].expand(slots - len(m))]) for m in members])
        scatter = torch.empty_like(self.group)
        for g, m in enumerate(members):
            scatter[m] = g * slots + torch.arange(len(m), device=m.device)
        self.scatter = scatter

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (the cache's rows were compacted alike); drop groups left empty."""
        used, group = torch.unique(self.group[keep], return_inverse=True)
        self.group, self.tail_valid = group, self.tail_valid[keep]
        self.prefix_k = [k[used] for k in self.prefix_k]
        self.prefix_v = [v[used] for v in self.prefix_v]
        self.prefix_bias = self.prefix_bias[used]
        self._index()

    def begin_step(self, valid: torch.Tensor) -> None:
        """Before a decode step's forward (here or :class:`~asyncrl.engine.fused.FusedDecoder`'s): the
        suffix mask of ``valid [rows, width + steps]``, the columns each row sees (this step's included)."""
        self.suffix_bias = _bias(torch.cat([self.tail_valid, valid[:, self.width :]], dim=1))[:, None, None]

    def step(
        self,
        model: PreTrainedModel,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """One decode step of ``tokens [rows]`` at ``positions``; ``valid [rows, width + steps]`` the
        columns each row sees (this step's included). Returns the next logits ``[rows, V]``."""
        self.begin_step(valid)
        with _attention(model, ATTENTION):
            out = model(
                input_ids=tokens[:, None],
                position_ids=positions[:, None],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                shared_prefix=self,
            )
        logits: torch.Tensor = out.logits[:, -1]
        return logits

    def attend(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
    ) -> torch.Tensor:
        """Attention of one decode step, ``query [rows, heads, 1, dim]`` against the rows' whole cache
        ``key``, ``value`` ``[rows, kv_heads, columns, dim]``: ``[rows, 1, heads, dim]``."""
        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        q = query.float().reshape(rows, kv_heads, heads // kv_heads, dim) * scaling
        groups, slots = self.gather.shape
        # the prefix, once per group: the group's queries stacked [groups, kv_heads, slots x heads_per_kv, dim]
        qg = q[self.gather].transpose(1, 2).reshape(groups, kv_heads, -1, dim)
        m_p, l_p, o_p = _partial(
            qg, self.prefix_k[layer].float(), self.prefix_v[layer].float(), self.prefix_bias
        )
        m_p, l_p, o_p = (_ungroup(x, slots, self.scatter) for x in (m_p, l_p, o_p))
        # each row's suffix: [rows, kv_heads, heads_per_kv, dim] against its window of the cache
        ks, vs = key[:, :, self.start :].float(), value[:, :, self.start :].float()
        m_s, l_s, o_s = _partial(q, ks, vs, self.suffix_bias)
        m = torch.maximum(m_p, m_s)
        a_p, a_s = torch.exp(m_p - m), torch.exp(m_s - m)
        out = (o_p * a_p + o_s * a_s) / (l_p * a_p + l_s * a_s)
        return out.reshape(rows, 1, heads, dim).to(query.dtype)


def _partial(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A partial softmax attention ``(max, sum of exp(s - max), unnormalised output)`` of ``q [..., n, d]``
    (already scaled) against ``k``, ``v`` ``[..., cols, d]``, ``bias`` broadcasting to the scores."""
    s = q @ k.transpose(-1, -2) + bias
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return m, e.sum(-1, keepdim=True), e @ v


def _ungroup(x: torch.Tensor, slots: int, scatter: torch.Tensor) -> torch.Tensor:
    """``[groups, kv_heads, slots x heads_per_kv, c]`` -> ``[rows, kv_heads, heads_per_kv, c]``."""
    groups, kv_heads, _, c = x.shape
    per_slot = x.reshape(groups, kv_heads, slots, -1, c).transpose(1, 2)
    return per_slot.reshape(groups * slots, kv_heads, -1, c)[scatter]


def _bias(allowed: torch.Tensor) -> torch.Tensor:
    """Additive float32 mask: 0 where allowed, ``-inf`` elsewhere."""
    return torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device).masked_fill(
        ~allowed, float("-inf")
    )


def _shared_prefix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    shared_prefix: SharedPrefix | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention interface entry of :data:`ATTENTION` (only run by :meth:`SharedPrefix.step`)."""
    assert shared_prefix is not None and query.shape[2] == 1, "shared-prefix attention: decode steps only"
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    layer = getattr(module, "layer_idx")  # noqa: B009
    return shared_prefix.attend(int(layer), query, key, value, scale), None


AttentionInterface.register(ATTENTION, _shared_prefix_attention)


@contextmanager
def _attention(model: PreTrainedModel, name: str) -> Iterator[None]:
    """``model`` runs attention implementation ``name`` inside the block (its own one restored after)."""
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
