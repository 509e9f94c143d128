"""The built-in engine's prefill: each chunk's prompts through the model, shared prefixes once
(:mod:`asyncrl.engine.prefix_tree`'s plan) and cached prefixes not at all (:mod:`asyncrl.engine.prefix_cache`),
into the KV layout the decode loop reads. Used by :class:`~asyncrl.engine.hf.HFEngine`."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.engine.decode import buffer_cache, kv_dims
from asyncrl.engine.forward import Forward
from asyncrl.engine.prefix_cache import Hit
from asyncrl.engine.prefix_tree import Piece, PrefillPlan


class Prefill:
    """Prefills through ``forward`` (each level a :meth:`Forward.prefill`) on ``device``; ``plain``: the
    model's growing cache is full-attention layers only (what can be gathered and shared; else each level
    runs on the model's own cache)."""

    def __init__(self, forward: Forward, device: torch.device, pad_token_id: int, plain: bool) -> None:
        self.forward, self.model = forward, forward.model
        self.device, self.pad_token_id, self._plain = device, pad_token_id, plain

    def run(
        self, plan: PrefillPlan, hits: list[Hit | None], prompts: list[list[int]], room: int
    ) -> tuple[torch.Tensor, torch.Tensor | DynamicCache, torch.Tensor]:
        """Run ``plan``'s levels; return the rows' next-token logits ``[B, V]``, their KV and ``valid``.

        The KV holds each row's prompt left-padded to ``valid.shape[1]`` columns (``valid [B, width]``
        marks the real ones): a :class:`DynamicCache` with ``room`` more columns preallocated for
        decoding, or, with ``room == 0`` (the static path), the tensor ``[layers, 2, B, kv_heads,
        width, head_dim]`` with ``width`` the longest prompt. When the plan is one level whose spans are the rows in order (nothing
        shared), that level's own layout is the rows' layout and nothing is gathered.
        """
        sources: dict[tuple[str, int], torch.Tensor] = {
            ("entry", i): h.entry.kv for i, h in enumerate(hits) if h is not None
        }
        span_logits: dict[int, torch.Tensor] = {}
        own = len(plan.levels) == 1 and [plan.node_span[n] for n in plan.row_leaf] == plan.levels[0]
        # cached pasts make a level wider than its longest prompt, which is what the static path fits
        own = own and (room > 0 or not any(plan.spans[s].start for s in plan.levels[0]))
        for level in plan.levels:
            logits, cache, valid, kv = self._level(plan, level, sources, room if own else 0)
            if own:
                return logits, cache if room or kv is None else kv, valid
            assert kv is not None
            for j, s in enumerate(level):
                first = valid.shape[1] - len(plan.spans[s].tokens)
                sources[("span", s)] = kv[:, :, j, :, first : valid.shape[1]]
                span_logits[s] = logits[j]
        width = max(map(len, prompts))
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        valid = torch.arange(width, device=self.device)[None, :] >= (width - lengths)[:, None]
        kv_rows = gather(
            self.model, self.device, [plan.pieces(n) for n in plan.row_leaf], sources, width, width + room
        )
        logits = torch.stack([span_logits[plan.node_span[n]] for n in plan.row_leaf])
        if room == 0:
            return logits, kv_rows, valid
        return logits, buffer_cache(kv_rows, width, self.model.config), valid

    def _level(
        self, plan: PrefillPlan, level: list[int], sources: dict[tuple[str, int], torch.Tensor], room: int
    ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor | None]:
        """One batched forward over a level's spans: last logits ``[S, V]``, the cache, ``valid [S, width]``
        and the cache's storage ``[layers, 2, S, kv_heads, width + room, head_dim]`` (``None`` for a
        model whose cache layers are not plain full-attention layers).

        Layout: each span's past (its ancestors' KV) left-padded to the longest past, then a window of
        the spans' tokens, right-aligned; masks hide the padding of both and position ids count real
        tokens, so each span's tokens see exactly their ancestors.
        """
        dev = self.device
        spans = [plan.spans[s] for s in level]
        reused = torch.tensor([sp.start for sp in spans], dtype=torch.long, device=dev)
        lengths = reused + torch.tensor([len(sp.tokens) for sp in spans], dtype=torch.long, device=dev)
        n_cached = int(reused.max())
        n_delta = int((lengths - reused).max())
        width = n_cached + n_delta
        ids = [[self.pad_token_id] * (n_delta - len(sp.tokens)) + sp.tokens for sp in spans]
        input_ids = torch.tensor(ids, dtype=torch.long).to(dev)  # one host-to-device copy
        cols = torch.arange(width, device=dev)
        delta_start = width - (lengths - reused)  # column of each span's first token
        cached_cols = (cols[None, :] >= (n_cached - reused)[:, None]) & (cols[None, :] < n_cached)
        valid = cached_cols | (cols[None, :] >= delta_start[:, None])
        q = cols[n_cached:width]
        position_ids = (q[None, :] - delta_start[:, None] + reused[:, None]).clamp_min(0)
        # Prefill mask: causal, real keys only, plus the diagonal so pad rows are never empty.
        causal = cols[None, :] <= q[:, None]
        diagonal = cols[None, :] == q[:, None]
        allowed = causal[None] & (valid[:, None, :] | diagonal[None])
        kv: torch.Tensor | None = None
        if self._plain:
            kv = gather(
                self.model,
                self.device,
                [plan.pieces(sp.parent) for sp in spans],
                sources,
                n_cached,
                width + room,
            )
            cache = buffer_cache(kv, n_cached, self.model.config)
        else:  # sliding-window layers: the model's own growing cache (nothing shared, no prefix cache)
            cache = DynamicCache(config=self.model.config)
        return self.forward.prefill(input_ids, position_ids, allowed, cache), cache, valid, kv


def gather(
    model: PreTrainedModel,
    device: torch.device,
    paths: list[list[Piece]],
    sources: dict[tuple[str, int], torch.Tensor],
    end: int,
    cols: int,
) -> torch.Tensor:
    """``[layers, 2, len(paths), kv_heads, cols, head_dim]``: each path's KV right-aligned at column ``end``.

    Columns before a path are zero (hidden by the masks); columns from ``end`` on are left for
    the forward passes to write.
    """
    layers, heads, dim = kv_dims(model)
    kv = torch.empty((layers, 2, len(paths), heads, cols, dim), dtype=model.dtype, device=device)
    for i, pieces in enumerate(paths):
        col = end - sum(p.length for p in pieces)
        kv[:, :, i, :, :col].zero_()  # only the padding: the rest is written here or by the forward
        for p in pieces:
            src = sources[p.source]
            kv[:, :, i, :, col : col + p.length] = src[:, :, :, p.column : p.column + p.length]
            col += p.length
    return kv
