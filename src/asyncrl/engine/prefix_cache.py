"""A prefix cache of KV states for the built-in engine: multi-turn episodes prefill only their new tokens.

An episode's model turn ``t + 1`` is prompted with everything turn ``t`` saw and sampled plus the
environment's observation. Without a cache the engine recomputes the keys and values of that whole
context at every turn. :class:`PrefixCache` keeps, after each ``generate`` call, the KV of every
row's real tokens (its prompt and its sampled tokens except the last, whose KV was never computed),
keyed by those token ids. A later prompt that shares a prefix with a stored entry starts from the
entry's first ``n`` columns (``n`` = the longest common prefix, at most ``len(prompt) - 1`` so that
at least one token is run and gives the next-token logits) and prefills only the rest.

Rules:

* **Weights.** An entry belongs to the weight version it was computed with; the engine clears the
  cache on every weight load, and a lookup ignores entries of another version (a version set by
  hand), so KV of old weights is never mixed with new ones.
* **Memory.** Entries are evicted least recently used first once their KV exceeds ``max_bytes``;
  an entry that alone exceeds it is not kept.
* **Dominated entries.** An entry whose ids are a prefix of a newly stored entry's ids adds
  nothing (the new one holds the same columns and more); the engine drops it when it stores the
  extension, so an episode holds one entry, its latest turn.

Positions are baked into cached keys (rotary embeddings are applied before caching), and an
entry's column ``j`` is token ``j`` at position ``j``, so a prefix is valid for any prompt that
starts with the same ids.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncrl.engine.decode import layer_kv


@dataclass
class CacheEntry:
    """KV states of one token sequence."""

    ids: np.ndarray
    """The token ids, ``int64 [L]``."""
    kv: torch.Tensor
    """Keys and values, ``[layers, 2, kv_heads, L, head_dim]`` (index 0 keys, 1 values)."""
    version: int
    """Weight version the KV was computed with."""

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass
class Hit:
    """A usable prefix: the first ``length`` columns of ``entry``."""

    key: tuple[int, ...]
    entry: CacheEntry
    length: int


class PrefixCache:
    """LRU map from token sequences to their KV, bounded in bytes (see the module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        """Entries dropped to stay within ``max_bytes`` (not counting clears and dominated entries)."""

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, prompt: list[int], version: int) -> Hit | None:
        """The entry sharing the longest prefix with ``prompt`` (at most ``len(prompt) - 1`` tokens)."""
        if not self.entries or len(prompt) < 2:
            return None
        p = np.asarray(prompt, dtype=np.int64)
        best: Hit | None = None
        for key, entry in self.entries.items():
            if entry.version != version or entry.ids[0] != p[0]:
                continue
            m = min(len(entry.ids), len(p) - 1)
            same = entry.ids[:m] == p[:m]
            n = m if bool(same.all()) else int(same.argmin())
            if n > 0 and (best is None or n > best.length):
                best = Hit(key, entry, n)
        if best is not None:
            self.entries.move_to_end(best.key)
        return best

    def store(self, ids: list[int], kv: torch.Tensor, version: int) -> None:
        """Keep ``kv`` (``[layers, 2, kv_heads, len(ids), head_dim]``) as the KV of ``ids``."""
        key = tuple(ids)
        self.discard(key)
        entry = CacheEntry(np.asarray(ids, dtype=np.int64), kv, version)
        if entry.nbytes > self.max_bytes:
            return
        self.entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.nbytes
            self.evictions += 1

    def store_rows(
        self, cache: Any, rows: torch.Tensor, valid: torch.Tensor, seqs: list[list[int]], version: int
    ) -> float:
        """Keep the KV of batch rows ``rows`` of ``cache`` (a growing or static cache of full-attention
        layers): row ``rows[j]``'s first ``len(seqs[j])`` columns marked in ``valid [B, columns]``, as the
        KV of ``seqs[j]``. Returns the seconds it took."""
        t0 = time.perf_counter()
        kv_layers = [layer_kv(layer) for layer in cache.layers]
        heads, dim = kv_layers[0][0].shape[1], kv_layers[0][0].shape[3]
        for row, seq in zip(rows.tolist(), seqs, strict=True):
            columns = valid[row].nonzero().squeeze(-1)[: len(seq)]
            first, n = int(columns[0]), len(seq)
            run = int(columns[-1]) - first + 1 == n  # one run of columns: every layout the engine makes
            ref = kv_layers[0][0]
            kv = torch.empty((len(kv_layers), 2, heads, n, dim), dtype=ref.dtype, device=ref.device)
            for i, pair in enumerate(kv_layers):  # one copy each, straight into the entry
                for part, src in enumerate(pair):
                    if run:
                        kv[i, part].copy_(src[row, :, first : first + n])
                    else:
                        torch.index_select(src[row], 1, columns, out=kv[i, part])
            self.store(seq, kv, version)
        return time.perf_counter() - t0

    def discard(self, key: tuple[int, ...]) -> None:
        """Drop the entry of ``key`` if there is one."""
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes

    def clear(self) -> None:
        """Drop every entry (after a weight load)."""
        self.entries.clear()
        self.bytes = 0
