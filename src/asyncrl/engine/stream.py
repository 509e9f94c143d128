"""Continuous batching for the built-in engine: :class:`DecodeStream` (``rollout.engine.continuous_batching``).

A ``generate`` call decodes its rows together to the end: a row that stops early waits for the longest
one, and a request that arrives meanwhile waits for the next call, so a call's decode steps run ever
fewer rows (5.7–7.2 a step on the demo-real task, docs/benchmarks.md). A stream keeps one decoding batch
open instead: requests **join** at a step boundary (their prompts prefilled, their KV copied into free
rows of the batch's buffers) and a row **leaves** the moment it stops, its sample returned at once. The
rollout worker's :class:`~asyncrl.engine.batcher.TurnBatcher` drives it, one
:meth:`DecodeStream.advance` (join, draw, feed) a step in the engine's thread.

Layout. The batch's KV lives in per-layer buffers ``[row capacity, kv_heads, column capacity, head_dim]``,
:class:`~asyncrl.engine.decode.BufferLayer` views of the first ``rows`` rows and ``filled`` columns. A
row's real columns are marked in ``valid [rows, filled]``; they need not be contiguous, nor aligned with
other rows': rotary embeddings are applied before keys are cached (a key carries its position) and a
decode step masks every column a row does not own. So a joining row's prompt KV goes to columns
``0 .. width`` of a free row, whatever the other rows hold there, and every decode step appends one
column for all rows. When the buffers are full, or finished rows are ``compact_fraction`` of the batch,
the live rows are laid out again: each row's real columns gathered, right-aligned, into fresh buffers
sized for what the rows may still decode.

What a row gets equals a ``generate`` call's: each token's behaviour log-prob is that of the distribution
it was drawn from, and a row's continuation does not depend on its batch-mates up to float rounding
(``tests/test_stream.py`` checks log-probs against the trainer's at the noise floor with rows joining
mid-stream); stop tokens, budgets and the prefix cache as there (a row's KV is kept the moment it
stops). A stream serves one weight version: a weight load while it holds rows is an error (the batcher
drains it first). Growing cache of plain full-attention layers only: the static (CUDA-graph) path, the
shared-prefix attention and other cache layouts decode call by call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from asyncrl.engine.base import GenerationEngine, Sample, check_requests
from asyncrl.engine.decode import BufferLayer, buffer_cache, kv_dims, sample_tokens
from asyncrl.engine.hf import HFEngine

if TYPE_CHECKING:
    from asyncrl.records import SamplingParams

SPARE_COLUMNS = 64
"""Columns a layout leaves beyond what its rows may still decode: joiners with longer prompts than the
batch's fit without a new layout."""
SPARE_ROWS = 8
"""Rows a layout leaves beyond its live rows and joiners (up to the engine's ``max_batch``)."""


def open_stream(engine: GenerationEngine) -> DecodeStream | None:
    """A decode stream over ``engine``; ``None`` where continuous batching does not apply (another backend,
    or :attr:`HFEngine.streams` false): the batcher then batches call by call."""
    return DecodeStream(engine) if isinstance(engine, HFEngine) and engine.streams else None


@dataclass
class _Row:
    prompt: list[int]
    budget: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class DecodeStream:
    """One open decoding batch of an :class:`~asyncrl.engine.hf.HFEngine` (the module docstring)."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine
        self._stops = frozenset(engine.stop_token_ids)
        self.layouts = 0
        """Times the batch was laid out again (new buffers, live rows gathered)."""
        self._clear()

    def _clear(self) -> None:
        """No rows, no buffers; the engine's current weight version is the one served."""
        dev = self.engine.device
        self.version = self.engine.version
        self.slots: list[_Row | None] = []
        """Batch row -> its request; ``None`` once it finished (the row is free)."""
        self.ids: list[int] = []
        """Batch row -> the id :meth:`join` gave its request."""
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros((0, 0), dtype=torch.bool, device=dev)
        self.pos = torch.zeros(0, dtype=torch.long, device=dev)
        self.temperature = torch.zeros(0, device=dev)
        self.top_p = torch.zeros(0, device=dev)
        self.logits = torch.zeros((0, self.engine.vocab_size), device=dev)
        self.tok = torch.zeros(0, dtype=torch.long, device=dev)

    @property
    def live(self) -> int:
        """Rows still decoding."""
        return sum(r is not None for r in self.slots)

    @property
    def _filled(self) -> int:
        return int(self.valid.shape[1])

    def _check_version(self) -> None:
        if self.live == 0 and self.engine.version != self.version:
            self._clear()  # nothing decoding: serve the weights the engine holds now
        if self.engine.version != self.version:
            raise RuntimeError(
                f"the engine's weights changed (version {self.version} -> {self.engine.version}) under a "
                "decode stream that holds rows; drain it before a load"
            )

    # ---- joining ----------------------------------------------------------------------------------
    def join(
        self, prompts: list[list[int]], sampling: list[SamplingParams], ids: list[int]
    ) -> list[int | Sample]:
        """Add requests at this step boundary: each gets its id from ``ids`` (the caller's, unique among
        the live rows), which :meth:`sample` returns its sample under, or its :class:`Sample` at once when
        its prompt leaves no room for a token. Invalid requests raise ``ValueError`` before anything joins."""
        e = self.engine
        self._check_version()
        params = check_requests(prompts, sampling, e.max_context, e.vocab_size)
        out: list[int | Sample] = []
        new: list[tuple[int, _Row, SamplingParams]] = []
        for rid, prompt, sp in zip(ids, prompts, params, strict=True):
            if len(prompt) >= e.max_context:
                out.append(Sample([], [], "length"))
                continue
            out.append(rid)
            new.append((rid, _Row(prompt, min(sp.max_new_tokens, e.max_context - len(prompt))), sp))
        if new:
            with e.inference():
                logits, kv, valid = e.prefill_rows([r.prompt for _, r, _ in new], 0)
                assert isinstance(kv, torch.Tensor)
                t0 = time.perf_counter()
                self._place(new, kv, valid, logits)
                e.prefill_seconds += time.perf_counter() - t0  # the joiners' KV into the batch: prefill's
        return out

    def advance(
        self,
        joiners: list[tuple[int, list[int], SamplingParams]],
        finished: Callable[[list[tuple[int, Sample]]], None],
    ) -> list[tuple[int, Exception]]:
        """One step boundary and one step, in one call: the ``joiners`` ``(id, prompt, sampling)`` join
        (:meth:`join`; one that is invalid is returned with its error and the others join), each live row
        draws its token (:meth:`sample`), and the rows still live are fed (:meth:`forward`). ``finished``
        gets the rows that stopped — those with no room at once — before the feed runs."""
        errors: list[tuple[int, Exception]] = []
        ok: list[tuple[int, list[int], SamplingParams]] = []
        for rid, prompt, sp in joiners:
            try:
                check_requests([prompt], [sp], self.engine.max_context, self.engine.vocab_size)
                ok.append((rid, prompt, sp))
            except ValueError as exc:
                errors.append((rid, exc))
        done: list[tuple[int, Sample]] = []
        if ok:
            joined = self.join([p for _, p, _ in ok], [sp for *_, sp in ok], [rid for rid, *_ in ok])
            done += [(rid, j) for (rid, *_), j in zip(ok, joined, strict=True) if isinstance(j, Sample)]
        done += self.sample()
        if done:
            finished(done)
        self.forward()
        return errors

    def _place(
        self,
        new: list[tuple[int, _Row, SamplingParams]],
        kv: torch.Tensor,
        valid: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Copy the joiners' prompt KV ``[layers, 2, n, kv_heads, width, head_dim]`` (real columns
        ``valid [n, width]``) into free rows, laying the batch out again first where it does not fit."""
        n, width = valid.shape
        rows = [r for _, r, _ in new] + [r for r in self.slots if r is not None]
        room = max(r.budget - len(r.tokens) for r in rows)
        free = [i for i, r in enumerate(self.slots) if r is None]
        cap_rows, cap_cols = self._capacity()
        if len(self.slots) + max(0, n - len(free)) > cap_rows or max(self._filled, width) + room > cap_cols:
            self._layout(extra_rows=n, min_width=width, room=room)
            free = []
        targets = (free + list(range(len(self.slots), len(self.slots) + n)))[:n]
        total = max(len(self.slots), max(targets) + 1)
        filled = max(self._filled, width)
        t = torch.tensor(targets, dtype=torch.long, device=kv.device)
        assert self.cache is not None
        for i, layer in enumerate(self.cache.layers):
            assert isinstance(layer, BufferLayer)
            for buf, part in ((layer.kbuf, kv[i, 0]), (layer.vbuf, kv[i, 1])):
                buf[: len(self.slots), :, self._filled : filled] = 0  # columns the batch had not written yet
                buf[t, :, :width] = part
                buf[t, :, width:filled] = 0
            layer.rows, layer.filled = total, filled
            layer.views()
        grown = torch.zeros((total, filled), dtype=torch.bool, device=kv.device)
        grown[: len(self.slots), : self._filled] = self.valid
        grown[t] = False
        grown[t, :width] = valid
        self.valid = grown
        self.pos = _put(
            self.pos, t, torch.tensor([len(r.prompt) for _, r, _ in new], device=kv.device), total
        )
        self.temperature = _put(
            self.temperature, t, _floats([sp.temperature for *_, sp in new], kv.device), total
        )
        self.top_p = _put(self.top_p, t, _floats([sp.top_p for *_, sp in new], kv.device), total)
        self.logits = _put(self.logits, t, logits, total)
        self.tok = _put(self.tok, t, torch.zeros(n, dtype=torch.long, device=kv.device), total)
        self.slots += [None] * (total - len(self.slots))
        self.ids += [-1] * (total - len(self.ids))
        for j, (rid, row, _) in zip(targets, new, strict=True):
            self.slots[j], self.ids[j] = row, rid

    def _capacity(self) -> tuple[int, int]:
        if self.cache is None:
            return 0, 0
        layer = self.cache.layers[0]
        assert isinstance(layer, BufferLayer)
        return int(layer.kbuf.shape[0]), int(layer.kbuf.shape[2])

    def _layout(self, extra_rows: int = 0, min_width: int = 0, room: int = 0) -> None:
        """Fresh buffers for the live rows (plus ``extra_rows`` to join), each row's real columns gathered
        right-aligned to the widest row's count (at least ``min_width``), ``room`` decode columns and the
        spare ones after them; finished rows are dropped."""
        e = self.engine
        keep = [i for i, r in enumerate(self.slots) if r is not None]
        k = torch.tensor(keep, dtype=torch.long, device=e.device)
        valid = self.valid[k]
        counts = valid.sum(1)
        width = max(int(counts.max()) if keep else 0, min_width, 1)
        index = torch.zeros((len(keep), width), dtype=torch.long, device=e.device)
        for j in range(len(keep)):
            cols = valid[j].nonzero().squeeze(-1)
            index[j, width - cols.shape[0] :] = cols
            index[j, : width - cols.shape[0]] = cols[0]  # masked: any column of the row's own is finite
        layers, heads, dim = kv_dims(e.model)
        cap_rows = min(max(e.max_batch, len(keep) + extra_rows), len(keep) + extra_rows + SPARE_ROWS)
        kv = torch.empty(
            (layers, 2, cap_rows, heads, width + room + SPARE_COLUMNS, dim),
            dtype=e.model.dtype,
            device=e.device,
        )
        if self.cache is not None and keep:
            for i, layer in enumerate(self.cache.layers):
                assert isinstance(layer, BufferLayer)
                for s, buf in enumerate((layer.kbuf, layer.vbuf)):
                    kv[i, s, : len(keep), :, :width] = buf[k[:, None], :, index].transpose(1, 2)
        self.cache = buffer_cache(kv, width, e.model.config, rows=len(keep))
        self.valid = torch.arange(width, device=e.device)[None, :] >= (width - counts)[:, None]
        self.pos, self.temperature, self.top_p = self.pos[k], self.temperature[k], self.top_p[k]
        self.logits, self.tok = self.logits[k], self.tok[k]
        self.slots = [self.slots[i] for i in keep]
        self.ids = [self.ids[i] for i in keep]
        self.layouts += 1

    # ---- decoding ---------------------------------------------------------------------------------
    def sample(self) -> list[tuple[int, Sample]]:
        """Draw each live row's next token; return the rows that stopped or spent their budget, as
        ``(id, sample)``, their KV kept in the prefix cache first (a later turn extends them)."""
        e = self.engine
        self._check_version()
        if self.live == 0:
            return []
        with e.inference():
            self.tok, lp = sample_tokens(self.logits, self.temperature, self.top_p, e.generator)
        tokens, logprobs = self.tok.tolist(), lp.tolist()  # the step's one host sync
        done: list[tuple[int, bool]] = []
        for i, row in enumerate(self.slots):
            if row is None:
                continue
            row.tokens.append(tokens[i])
            row.logprobs.append(logprobs[i])
            stopped = tokens[i] in self._stops
            if stopped or len(row.tokens) >= row.budget:
                done.append((i, stopped))
        if done and e.prefix_cache is not None:
            seqs = [_own(self.slots[i]) for i, _ in done]
            rows = torch.tensor([i for i, _ in done], dtype=torch.long, device=e.device)
            e.prefix_cache_seconds += e.prefix_cache.store_rows(
                self.cache, rows, self.valid, seqs, self.version
            )
        finished = []
        for i, stopped in done:
            row = self.slots[i]
            assert row is not None
            finished.append((self.ids[i], Sample(row.tokens, row.logprobs, "stop" if stopped else "length")))
            self.slots[i] = None
        return finished

    def forward(self) -> None:
        """Feed each live row the token it just drew: the next logits (finished rows dropped first once
        they are ``compact_fraction`` of the batch; all rows finished: the buffers are released)."""
        e = self.engine
        self._check_version()
        live = self.live
        if live == 0:
            self._clear()  # the buffers released
            return
        t0 = time.perf_counter()
        with e.inference():
            room = max(r.budget - len(r.tokens) for r in self.slots if r is not None)
            finished = len(self.slots) - live >= max(1.0, e.compact_fraction * len(self.slots))
            if finished or self._filled + 1 > self._capacity()[1]:
                self._layout(room=room)
            assert self.cache is not None
            self.valid = torch.cat([self.valid, torch.ones_like(self.valid[:, :1])], dim=1)
            self.logits = e.step(self.tok, self.pos, self.valid, self.cache)
            live_rows = torch.tensor([r is not None for r in self.slots], device=self.pos.device)
            self.pos = self.pos + live_rows  # a free row's position stays: never past the context
        e.decode_steps += 1
        e.decode_seconds += time.perf_counter() - t0


def _own(row: _Row | None) -> list[int]:
    """The tokens whose KV a finished row's cache columns hold: its prompt and all it drew but the last."""
    assert row is not None
    return row.prompt + row.tokens[:-1]


def _floats(values: list[float], dev: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=dev)


def _put(x: torch.Tensor, at: torch.Tensor, values: torch.Tensor, total: int) -> torch.Tensor:
    """``x`` grown to ``total`` rows (zeros) with rows ``at`` set to ``values``."""
    if x.shape[0] == 0:  # shaped by the values (the logits: the model's output width)
        x = values.new_zeros((total, *values.shape[1:])).to(x.dtype)
    elif total > x.shape[0]:
        x = torch.cat([x, x.new_zeros((total - x.shape[0], *x.shape[1:]))])
    x[at] = values.to(x.dtype)
    return x
