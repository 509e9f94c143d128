"""The built-in engine's decode machinery: sampling a token from logits (the behaviour log-prob
definition of :mod:`asyncrl.engine.base`), the static decoder (a preallocated KV cache per batch-size
bucket, its step optionally captured as a CUDA graph), and growing caches over preallocated buffers.
Used by :class:`~asyncrl.engine.hf.HFEngine`."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import DynamicLayer, StaticLayer

from asyncrl.policy.model import as_attention_bias

log = logging.getLogger(__name__)


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None,
    forced: torch.Tensor | None = None,
    *,
    mixed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return ``(tokens [B], behaviour log-probs [B])``.

    ``logits`` is ``[B, V]``, ``temperature`` and ``top_p`` are ``[B]``. The log-prob is
    taken from ``log_softmax`` (not ``log(softmax)``) and the nucleus correction is
    ``- log(kept mass)``, so both are exact to float32 rounding even for unlikely tokens.
    ``forced`` ``[B]``: take these tokens instead of drawing (teacher forcing, the canary's probe);
    ``mixed``: a negative entry draws that row's token (a call the probe rides along).
    """
    logp = torch.log_softmax(logits.float() / temperature[:, None], dim=-1)
    probs = logp.exp()
    log_mass = torch.zeros_like(temperature)
    nucleus = top_p < 1.0
    if bool(nucleus.any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        # Keep a token while the mass of strictly more likely tokens is below top_p; the
        # most likely token is always kept, so the nucleus is never empty.
        keep_sorted = mass_before < top_p[:, None]
        keep_sorted |= ~nucleus[:, None]
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
        log_mass = torch.where(nucleus, probs.sum(-1).log(), log_mass)
    if forced is None:
        tokens = draw(probs, generator)
    else:
        tokens = torch.where(forced < 0, draw(probs, generator), forced) if mixed else forced
    lp = logp.gather(-1, tokens[:, None]).squeeze(-1) - log_mass
    return tokens, lp


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``weights`` ``[B, V]`` (non-negative, unnormalised), with probability
    ``weights / weights.sum()``: inverse transform sampling on a float64 cumulative sum.

    The first index whose cumulative weight exceeds ``u * total`` (``u`` uniform in [0, 1)); an
    index of weight 0 never is. ``torch.multinomial`` draws one exponential variate per vocabulary
    entry instead, about 90x slower on SmolLM2's vocabulary (docs/benchmarks.md).
    """
    cdf = weights.double().cumsum(-1)
    u = torch.rand((weights.shape[0], 1), dtype=torch.float64, device=weights.device, generator=generator)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_max(weights.shape[-1] - 1)
    # u * total can round up to total: the last index, which may have weight 0; take the likeliest then
    ok = weights.gather(-1, idx) > 0
    return torch.where(ok, idx, weights.argmax(-1, keepdim=True)).squeeze(-1)


def last_logits(
    model: PreTrainedModel, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: Any
) -> torch.Tensor:
    """Last-position logits ``[B, V]`` of one cached forward pass (prefill or one decode step)."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits: torch.Tensor = out.logits[:, -1]
    return logits


def decode_buckets(max_batch: int) -> list[int]:
    """Row counts static decoding runs at: powers of two from 8 below ``max_batch``, then ``max_batch``."""
    return [*itertools.takewhile(lambda n: n < max_batch, (8 << i for i in itertools.count())), max_batch]


class StaticDecoder:
    """Fixed-shape decoding for one bucket of rows, the launch-efficient path for GPUs.

    A generic decode step with a growing cache has new tensor shapes every step and launches
    hundreds of small kernels; on a GPU a small model then spends its time launching, not
    computing (docs/engines.md#the-built-in-engine-on-a-gpu). Here the KV cache is a :class:`~transformers.StaticCache` of ``cache_len`` columns
    allocated once, and the step's inputs (token ids, position ids, attention mask) live in fixed
    buffers, so every step of every chunk has the same shapes and addresses. With ``graphs`` one
    decode step is captured as a CUDA graph once per bucket and each step is a single replay.

    Column ``c`` of the cache holds the token at column ``c`` of the left-padded chunk: the
    prefill writes columns ``0 .. width-1``, decode step ``k`` writes column ``width + k`` (the
    cache's own in-place counter, which a graph replay advances on the device). The mask buffer
    hides pad columns and columns not yet written, so results equal the growing-cache path up to
    float rounding (``tests/test_engine.py`` checks it on the CPU, where the same buffers are run
    eagerly).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        attn: str,
        rows: int,
        cache_len: int,
        graphs: bool,
        graph_pool: Any = None,
    ) -> None:
        self.model, self.attn, self.rows, self.cache_len = model, attn, rows, cache_len
        dev = next(model.parameters()).device
        self.cache = StaticCache(config=model.config, max_cache_len=cache_len)
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.mask = as_attention_bias(
            torch.zeros((rows, 1, 1, cache_len), dtype=torch.bool, device=dev), self.attn
        )
        self._visible = as_attention_bias(torch.ones((), dtype=torch.bool, device=dev), self.attn)
        self.graph: Any = None
        self.logits: torch.Tensor | None = None
        self.capture_error: str | None = None
        if graphs:
            self._capture(graph_pool)

    def _step_forward(self) -> torch.Tensor:
        return last_logits(self.model, self.ids, self.pos, self.mask, self.cache)

    def _capture(self, pool: Any) -> None:
        """Capture one decode step as a CUDA graph (warm-up first, on a side stream, as CUDA requires)."""
        try:
            self.mask[..., 0] = self._visible  # warm-up rows attend to something: no NaNs
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # the first call allocates the cache (lazily, at its first update)
                    self._step_forward()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits = self._step_forward()
            self.graph = graph
        except Exception as exc:  # capture is an optimisation: decode eagerly instead
            self.graph, self.logits = None, None
            self.capture_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "CUDA graph capture failed for %d rows (%s); decoding eagerly", self.rows, self.capture_error
            )
        finally:
            self.cache.reset()  # type: ignore[no-untyped-call]  # in place: the graph keeps pointing at the same tensors

    def load(self, kv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Put the chunk's prompt KV (``[layers, 2, b, kv_heads, width, head_dim]``, its real columns
        ``valid [b, width]``) in the cache; return ``valid`` for all bucket rows (a dummy row sees
        one zero column, so its attention is never empty)."""
        b, width = valid.shape
        self.cache.reset()  # type: ignore[no-untyped-call]
        for i, layer in enumerate(self.cache.layers):
            assert isinstance(layer, StaticLayer)
            if not layer.is_initialized:  # eager (CPU) decoding: no capture allocated it
                shape = (self.rows, *kv.shape[3:])
                layer.lazy_initialization(kv[i, 0, :1].expand(shape), kv[i, 1, :1].expand(shape))
            keys, values = layer_kv(layer)
            keys[:b, :, :width].copy_(kv[i, 0])
            values[:b, :, :width].copy_(kv[i, 1])
            layer.cumulative_length.fill_(width)
        rows_valid = torch.zeros((self.rows, width), dtype=torch.bool, device=valid.device)
        rows_valid[:b] = valid
        rows_valid[b:, -1] = True
        allowed = torch.zeros((self.rows, 1, 1, self.cache_len), dtype=torch.bool, device=valid.device)
        allowed[:, 0, 0, :width] = rows_valid
        self.mask.copy_(as_attention_bias(allowed, self.attn))
        return rows_valid

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """Decode ``tokens`` ``[rows]`` at ``positions``, written to cache ``column``; next logits."""
        self.ids.copy_(tokens[:, None])
        self.pos.copy_(positions[:, None])
        self.mask[..., column] = self._visible
        if self.graph is not None:
            self.graph.replay()
            assert self.logits is not None
            return self.logits
        return self._step_forward()


def layer_kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[B, kv_heads, T, head_dim]`` of one full-attention cache layer (growing or static)."""
    assert layer.keys is not None and layer.values is not None
    return layer.keys, layer.values


class BufferLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A full-attention cache layer over preallocated buffers ``[B, kv_heads, capacity, head_dim]``.

    An update writes its columns in place and returns views of the filled columns: no concatenation,
    allocation or page faults per decode step (the growing cache's ``torch.cat`` copies the whole KV
    at every step). A write past the capacity reallocates (the engine sizes buffers so it does not).
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.kbuf, self.vbuf, self.filled = keys, values, filled
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        """Point ``keys`` and ``values`` at the ``filled`` columns (after the buffers or the count changed)."""
        self.keys, self.values = self.kbuf[:, :, : self.filled], self.vbuf[:, :, : self.filled]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.filled + key_states.shape[-2]
        if n > self.kbuf.shape[-2]:
            grow = (0, 0, 0, n - self.kbuf.shape[-2])
            self.kbuf = torch.nn.functional.pad(self.kbuf, grow)
            self.vbuf = torch.nn.functional.pad(self.vbuf, grow)
        self.kbuf[:, :, self.filled : n] = key_states
        self.vbuf[:, :, self.filled : n] = value_states
        self.filled = n
        self._views()
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
        self._views()


def buffer_cache(kv: torch.Tensor, filled: int, config: Any) -> DynamicCache:
    """A growing cache whose layers are views of ``kv`` ``[layers, 2, B, kv_heads, capacity, head_dim]``,
    the first ``filled`` columns already holding KV."""
    cache = DynamicCache(config=config)
    cache.layers = [BufferLayer(kv[i, 0], kv[i, 1], filled) for i in range(kv.shape[0])]
    return cache


def kv_dims(model: PreTrainedModel) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of the model's KV cache."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return int(c.num_hidden_layers), int(heads), int(dim)


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows`` rows."""
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))]) if rows > x.shape[0] else x
