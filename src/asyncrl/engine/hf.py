"""The built-in generation engine (``rollout.engine.kind: hf``): batched sampling with a Hugging Face
causal LM in this process, a KV cache, optional static decoding with CUDA graphs and a prefix cache.

The interface, the behaviour log-prob definition it implements and the one weight-load method:
:mod:`asyncrl.engine.base`.

With a prefix cache (``prefix_cache``) each row's KV is kept after a call
(:mod:`asyncrl.engine.prefix_cache`) and a later prompt that extends a kept sequence prefills only
its new tokens (the layout: :meth:`asyncrl.engine.prefill.Prefill._level`).

With a LoRA policy and ``merge_lora`` the engine samples from a :class:`~asyncrl.policy.lora.MergedCopy`
instead (:attr:`HFEngine.merged`, :attr:`HFEngine.model`; ``policy.model`` stays the PEFT model that loads
are validated against): plain weights with the adapter folded in, so a decode step runs no adapter matmuls.
Growing-cache decode steps and prefills run through :attr:`HFEngine.forward` (:mod:`asyncrl.engine.forward`;
on a CPU, :mod:`asyncrl.engine.cpu`'s fast path over the copy's packed weights). Everything derived from
the weights is rebuilt at every :meth:`HFEngine.load_weights`.
:meth:`HFEngine.fingerprint` then reports the adapter the copy was folded from and :meth:`HFEngine.probe`
runs on the copy: the weight-sync canary checks what is served.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.cache_utils import DynamicLayer

from asyncrl.config import HFEngineConfig
from asyncrl.engine.base import GenerationEngine, Sample, check_requests, stop_ids, with_room
from asyncrl.engine.cpu import make_forward
from asyncrl.engine.decode import StaticDecoder, decode_buckets, pad_rows, sample_tokens
from asyncrl.engine.prefill import Prefill
from asyncrl.engine.prefix_cache import Hit, PrefixCache
from asyncrl.engine.prefix_tree import plan_prefill
from asyncrl.policy.canary import Fingerprint, fingerprint, probe_logprobs
from asyncrl.policy.lora import MergedCopy, MergeUnsupported, is_lora
from asyncrl.policy.model import Policy, input_vocab_size
from asyncrl.records import SamplingParams

log = logging.getLogger(__name__)

STATIC_CACHE_SLACK = 128
"""Static-cache columns beyond ``max_context``: left padding puts a chunk's newest token at column
``width + step``, so a chunk fits when ``width + steps <= max_context + STATIC_CACHE_SLACK``; one
that does not (a long prompt batched with short ones that may still sample many tokens) is decoded
with the growing cache instead."""


@dataclass
class _DecodeState:
    """The per-row tensors of one chunk's decode loop.

    ``out_*``, ``n_out`` and ``stopped`` are indexed by original row; the others by *active* row
    (``rows`` maps active -> original), and shrink when finished rows are compacted away.
    """

    out_tokens: torch.Tensor  # [rows_run, max_steps]
    out_logprobs: torch.Tensor  # [rows_run, max_steps]
    n_out: torch.Tensor  # [rows_run]
    stopped: torch.Tensor  # [rows_run]
    rows: torch.Tensor  # active row -> original row
    finished: torch.Tensor  # per active row (the dummies are finished from the start)
    next_pos: torch.Tensor  # position id of the next token of each active row
    budget: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    valid: torch.Tensor  # [active rows, columns]: the KV columns each row sees
    forced: torch.Tensor | None = None  # [rows_run, max_steps]: tokens to feed instead of sampling
    mixed: bool = False  # forced holds -1 for rows that sample

    @classmethod
    def start(
        cls,
        rows_run: int,
        max_steps: int,
        lengths: torch.Tensor,
        budget: torch.Tensor,
        params: list[SamplingParams],
        valid: torch.Tensor,
        pad_token_id: int,
    ) -> _DecodeState:
        """Rows ``len(params)..rows_run`` are the static bucket's one-token dummies (budget 0)."""
        dev, extra = lengths.device, rows_run - len(params)
        lengths = torch.cat([lengths, torch.ones(extra, dtype=torch.long, device=dev)])
        budget = torch.cat([budget, torch.zeros(extra, dtype=torch.long, device=dev)])
        return cls(
            out_tokens=torch.full((rows_run, max_steps), pad_token_id, dtype=torch.long, device=dev),
            out_logprobs=torch.zeros((rows_run, max_steps), dtype=torch.float32, device=dev),
            n_out=torch.zeros(rows_run, dtype=torch.long, device=dev),
            stopped=torch.zeros(rows_run, dtype=torch.bool, device=dev),
            rows=torch.arange(rows_run, device=dev),
            finished=budget <= 0,
            next_pos=lengths.clone(),
            budget=budget,
            temperature=_row_values([sp.temperature for sp in params], extra, dev),
            top_p=_row_values([sp.top_p for sp in params], extra, dev),
            valid=valid,
        )

    def samples(self, b: int) -> list[Sample]:
        """The first ``b`` rows as :class:`Sample` s (their first ``n_out`` tokens and log-probs)."""
        cols = (self.out_tokens[:b], self.out_logprobs[:b], self.n_out[:b], self.stopped[:b])
        tokens, logprobs, counts, stops = (x.cpu().tolist() for x in cols)
        return [
            Sample(t[:n], lp[:n], "stop" if s else "length")
            for t, lp, n, s in zip(tokens, logprobs, counts, stops, strict=True)
        ]

    def compact(self, keep: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """Drop the active rows not in ``keep``; ``tok`` (the step's tokens) compacted alike."""
        self.rows, self.valid, self.finished = self.rows[keep], self.valid[keep], self.finished[keep]
        self.temperature, self.top_p = self.temperature[keep], self.top_p[keep]
        self.budget, self.next_pos = self.budget[keep], self.next_pos[keep]
        return tok[keep]


def _row_values(values: list[float], extra: int, dev: torch.device) -> torch.Tensor:
    """Per-row float32 sampling values, with ``extra`` dummy rows of 1.0."""
    return torch.tensor(values + [1.0] * extra, dtype=torch.float32, device=dev)


class HFEngine(GenerationEngine):
    """Batched sampling with a Hugging Face causal LM and a KV cache.

    Prompts are left-padded into chunks of at most ``max_batch`` rows. Position ids
    count real tokens only, and explicit attention masks hide the padding, so a
    prompt's continuation does not depend on its batch-mates (up to float rounding)
    and its log-probs match the trainer's right-padded recomputation. Rows that finish
    early are dropped from the batch (and the KV cache) once enough have finished to be
    worth the copy. The sampling loop is written out rather than using
    ``model.generate`` so that the recorded log-probs are, by construction, those of
    the distribution each token was drawn from.

    The prefix cache and the merged LoRA copy: the module docstring.

    The engine samples from ``policy.model`` itself (no copy): :meth:`load_weights`
    overwrites those parameters in place. Give the engine its own :class:`Policy` when
    something else (a trainer) must keep its weights; code that changes the weights other than
    through :meth:`load_weights` must call :meth:`clear_prefix_cache` (and, with a merged copy,
    :meth:`refresh_merged`).
    """

    # counters, per engine (each instance sets its own on first update)
    merge_seconds: float = 0.0
    """Time folding adapters into the merged copy (at construction and every load; repacks included)."""
    static_chunks: int = 0
    """Chunks decoded on the static path (the rest on the growing cache)."""
    prefix_cache_seconds: float = 0.0
    """Time looking up and storing prefix-cache entries."""

    def __init__(
        self, policy: Policy, cfg: HFEngineConfig, stop_token_ids: Sequence[int], *, seed: int | None = None
    ) -> None:
        """``seed`` makes sampling reproducible (the generator persists across calls). The prefix cache and
        prefix sharing need a model whose cache layers are plain full-attention layers (else they are off)."""
        self.policy, self.device = policy, policy.device
        self.merged = _merged_copy(policy) if cfg.merge_lora else None
        self.model: PreTrainedModel = self.merged.model if self.merged is not None else policy.model
        self._plain = _plain_dynamic_cache(self.model)
        self.forward = make_forward(self.model, cfg, merged=self.merged is not None, plain=self._plain)
        self.version = 0
        self.max_context = policy.max_context
        self.max_batch = cfg.max_batch
        self.compact_fraction = cfg.compact_fraction
        self.vocab_size = input_vocab_size(self.model)
        self.stop_token_ids = stop_ids(stop_token_ids, self.vocab_size, cfg.max_batch)
        pad = policy.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        self._stop = torch.tensor(self.stop_token_ids, dtype=torch.long, device=self.device)
        on_gpu = self.device.type == "cuda"
        self.static_cache = on_gpu if cfg.static_cache == "auto" else cfg.static_cache == "on"
        self.cuda_graphs = cfg.cuda_graphs and on_gpu
        self.cache_len = self.max_context + STATIC_CACHE_SLACK
        self.buckets = decode_buckets(cfg.max_batch)
        self._decoders: dict[int, StaticDecoder] = {}
        self._graph_pool: Any = None
        self.prefill = Prefill(self.forward, self.device, self.pad_token_id, self._plain)
        self.prefix_sharing = cfg.prefix_sharing
        self.prefix_cache: PrefixCache | None = None
        if cfg.prefix_cache and self._plain:
            self.prefix_cache = PrefixCache(int(cfg.prefix_cache_mb * 2**20))

    # ---- weights ---------------------------------------------------------------------------
    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:
        """Copy ``tensors`` into the policy's parameters in place (``path`` is not needed here)."""
        self.clear_prefix_cache()  # before the load: a failed load leaves no stale entry either
        adapter = self.merged is not None and set(tensors) <= set(self.merged.adapter)
        try:
            self.policy.load_tensors(tensors)  # full weights, or a LoRA adapter version (strict either way)
        finally:  # even a load that failed half-way: serve what the policy now holds
            self.refresh_merged(adapter_only=adapter)
        self.version = version

    def refresh_merged(self, *, adapter_only: bool = False) -> None:
        """Fold the policy's adapter into the merged copy again and repack (nothing without a copy).
        ``adapter_only``: only the adapter changed since the last refresh, so only the folded layers'
        packed copies are rebuilt (not the LM head's, the embeddings', ...)."""
        if self.merged is not None:
            t0 = time.perf_counter()
            self.merged.refresh()
            self.forward.repack({id(w) for w in self.merged.folded} if adapter_only else None)
            self.merge_seconds += time.perf_counter() - t0

    def compute_modules(self) -> list[torch.nn.Module]:
        """The forward's modules (the served model, the policy's or its merged copy, and a fast path's own);
        see the interface."""
        return self.forward.modules()

    def fingerprint(self, names: Sequence[str]) -> Fingerprint:
        """Read from the live parameters and buffers (no copy); see the interface. With a merged copy,
        the adapter tensors are those the copy was folded from (:attr:`MergedCopy.adapter`)."""
        state = self.policy.model.state_dict()
        if self.merged is not None:
            state |= self.merged.adapter
        return fingerprint({n: state[n] for n in names if n in state})

    def probe(self, ids: Sequence[int]) -> list[float]:
        """``log p(ids[t] | ids[:t])``, ``t = 1..n-1`` (see the interface): ``t < n/2`` from one uncached
        forward pass (:func:`~asyncrl.policy.canary.probe_logprobs`), ``t >= n/2`` through the generation
        path — :meth:`_generate_chunk` on two rows prompted with ``ids[:n/2]`` (a group: with prefix
        sharing their prefill is shared and gathered; the prefix cache is looked up and stored as for any
        call), then ``ids[n/2:]`` fed token by token through the decode loop (static decoder and CUDA
        graphs where those are on), the two rows' log-probs averaged. Counts in the engine's prefill and
        decode figures like any call. :meth:`generate_probed` runs the same two rows inside a call."""
        return self.generate_probed([], [], ids)[1]

    def generate_probed(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams], ids: Sequence[int]
    ) -> tuple[list[Sample], list[float]]:
        """:meth:`generate` and :meth:`probe` in one call (see the interface): the probe's two rows join the
        call's last chunk (the one with the fewest rows) where ``max_batch`` leaves room, teacher-forced
        beside rows that sample, so its decode steps are the call's own; else they run as a chunk of
        their own."""
        params = check_requests(prompts, sampling, self.max_context, self.vocab_size)
        full = probe_logprobs(self.model, ids)
        split = max(1, len(ids) // 2)
        head, tail = list(ids[:split]), list(ids[split:])
        rows = min(2, self.max_batch)
        sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=len(tail))
        riders = _Riders([head] * rows, [sp] * rows, tail)
        samples = self._generate(prompts, params, riders)
        if riders.samples is None:  # no chunk had room for them
            with _inference(self.model):
                riders.samples = self._generate_chunk(
                    riders.prompts, riders.params, riders.forced(0, len(tail))
                )
        path = [sum(lps) / rows for lps in zip(*(s.logprobs for s in riders.samples), strict=True)]
        return samples, full[: split - 1] + path

    def clear_prefix_cache(self) -> None:
        """Forget every cached KV state (they belong to the weights they were computed with)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # ---- generation ------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]
    ) -> list[Sample]:
        return self._generate(prompts, check_requests(prompts, sampling, self.max_context, self.vocab_size))

    def _generate(
        self, prompts: list[list[int]], params: list[SamplingParams], riders: _Riders | None = None
    ) -> list[Sample]:
        """The samples of checked requests, in chunks of ``max_batch`` rows; ``riders`` join the last chunk
        where it has room (their samples then in ``riders.samples``)."""

        def run(rows: list[int]) -> list[tuple[int, Sample]]:
            rows = sorted(rows, key=lambda i: len(prompts[i]))  # similar lengths share a chunk: less padding
            chunks = [rows[start : start + self.max_batch] for start in range(0, len(rows), self.max_batch)]
            out: list[Sample] = []
            with _inference(self.model):
                for k, c in enumerate(chunks):
                    ps, sps = [prompts[i] for i in c], [params[i] for i in c]
                    last = k == len(chunks) - 1
                    if riders is None or not last or len(c) + riders.rows > self.max_batch:
                        out += self._generate_chunk(ps, sps)
                        continue
                    steps = max(sp.max_new_tokens for sp in sps + riders.params)
                    got = self._generate_chunk(
                        ps + riders.prompts, sps + riders.params, riders.forced(len(c), steps)
                    )
                    out, riders.samples = out + got[: len(c)], got[len(c) :]
            return list(zip(rows, out, strict=True))

        return with_room(prompts, self.max_context, run)

    def _generate_chunk(
        self, prompts: list[list[int]], params: list[SamplingParams], forced: torch.Tensor | None = None
    ) -> list[Sample]:
        """Prefill the rows' prompts (shared prefixes once), then decode them together to the end
        (``forced`` ``[rows, max_new_tokens]``: feed these tokens instead of sampling; stops ignored)."""
        b = len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long, device=self.device)
        budget = torch.minimum(
            torch.tensor([sp.max_new_tokens for sp in params], dtype=torch.long, device=self.device),
            self.max_context - lengths,
        )
        max_steps = int(budget.max())
        static = self.static_cache and self._plain and max(map(len, prompts)) + max_steps <= self.cache_len
        # Static decoding runs the smallest bucket of rows that holds them; the extra rows are one-token dummies.
        rows_run = next(n for n in self.buckets if n >= b) if static else b

        logits, cache, valid = self.prefill_rows(prompts, 0 if static else max_steps)
        t_load = time.perf_counter()
        width = valid.shape[1]
        decoder = self._decoder(rows_run) if static else None
        if decoder is not None:
            assert isinstance(cache, torch.Tensor)
            valid, logits = decoder.load(cache, valid), pad_rows(logits, rows_run)
            self.static_chunks += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # prefill and decode times apart
        self.prefill_seconds += time.perf_counter() - t_load

        st = _DecodeState.start(rows_run, max_steps, lengths, budget, params, valid, self.pad_token_id)
        if forced is not None:
            st.forced = pad_rows(forced[:, :max_steps].to(self.device), rows_run)
            st.mixed = bool((forced < 0).any())
        t0 = time.perf_counter()
        store_seconds = self.prefix_cache_seconds
        steps = self._decode(st, logits, cache, decoder, width, prompts)
        self.decode_steps += steps
        self.decode_seconds += time.perf_counter() - t0 - (self.prefix_cache_seconds - store_seconds)
        kept = decoder.cache if decoder is not None else cache
        assert isinstance(kept, (DynamicCache, StaticCache))
        active = torch.arange(st.rows.shape[0], device=self.device)[: b if decoder is not None else None]
        self._keep(kept, active, st, prompts)
        return st.samples(b)

    def prefill_rows(
        self, prompts: list[list[int]], room: int
    ) -> tuple[torch.Tensor, torch.Tensor | DynamicCache, torch.Tensor]:
        """:meth:`Prefill.run` for ``prompts``, cached prefixes looked up and shared ones computed once
        (``room``: its meaning there), counted in the engine's prefill figures."""
        hits = self._lookup(prompts)
        plan = plan_prefill(
            prompts, [h.length if h else 0 for h in hits], share=self.prefix_sharing and self._plain
        )
        t0 = time.perf_counter()
        out = self.prefill.run(plan, hits, prompts, room)
        self.prefill_seconds += time.perf_counter() - t0
        self.prefill_tokens_computed += plan.computed_tokens
        self.prefill_tokens_reused += plan.reused_tokens
        self.prefill_tokens_shared += sum(map(len, prompts)) - plan.computed_tokens - plan.reused_tokens
        return out

    def _decode(
        self,
        st: _DecodeState,
        logits: torch.Tensor,
        cache: torch.Tensor | DynamicCache,
        decoder: StaticDecoder | None,
        width: int,
        prompts: list[list[int]],
    ) -> int:
        """Sample token after token until every row stopped or spent its budget; the steps taken."""
        steps = 0
        for step in range(st.out_tokens.shape[1]):
            forced = None if st.forced is None else st.forced[st.rows, step]
            tok, lp = sample_tokens(logits, st.temperature, st.top_p, self.generator, forced, mixed=st.mixed)
            # Finished rows still in the batch write past their n_out; those are ignored.
            live = ~st.finished
            st.out_tokens[st.rows, step] = tok
            st.out_logprobs[st.rows, step] = lp
            st.n_out[st.rows] = torch.where(live, step + 1, st.n_out[st.rows])
            hit_stop = live & torch.isin(tok, self._stop)
            if forced is not None:
                hit_stop &= forced < 0  # a forced row runs its budget
            st.stopped[st.rows] |= hit_stop
            st.finished = st.finished | hit_stop | (step + 1 >= st.budget)
            n_done = int(st.finished.sum())  # the step's one host sync: is the chunk done?
            if n_done == st.finished.shape[0]:
                break
            st.valid = torch.cat([st.valid, torch.ones_like(st.valid[:, :1])], dim=1)
            if decoder is not None:
                # Fixed shapes: finished rows keep decoding (their tokens are ignored); the
                # column of this step's token becomes visible to every row.
                logits = decoder.step(tok, st.next_pos, width + step)
            else:
                assert isinstance(cache, DynamicCache)
                if n_done >= max(1.0, self.compact_fraction * st.finished.shape[0]):
                    self._keep(cache, st.finished.nonzero().squeeze(-1), st, prompts)  # leaving the batch
                    keep = (~st.finished).nonzero().squeeze(-1)
                    cache.batch_select_indices(keep)
                    tok = st.compact(keep, tok)
                logits = self.forward.decode(tok, st.next_pos, st.valid, cache)
            st.next_pos = st.next_pos + 1
            steps += 1
        return steps

    # ---- prefix cache ------------------------------------------------------------------------
    def _keep(
        self,
        cache: DynamicCache | StaticCache,
        active: torch.Tensor,
        st: _DecodeState,
        prompts: list[list[int]],
    ) -> None:
        """Keep the KV of the ``active`` batch rows in the prefix cache (if any): their prompt and every
        sampled token but the last (a finished row left in the batch has later columns too, tokens sampled
        after it finished, so only the first ``len(prompt) + n_out - 1`` of its ``valid`` ones are its own)."""
        if self.prefix_cache is None:
            return
        originals = st.rows[active]
        counts, sampled = st.n_out[originals].tolist(), st.out_tokens[originals].tolist()
        seqs = [prompts[r] + s[: n - 1] for r, s, n in zip(originals.tolist(), sampled, counts, strict=True)]
        self.prefix_cache_seconds += self.prefix_cache.store_rows(cache, active, st.valid, seqs, self.version)

    def _lookup(self, prompts: list[list[int]]) -> list[Hit | None]:
        """Each prompt's longest cached prefix; an entry wholly used is dropped (its row stores an extension)."""
        if self.prefix_cache is None:
            return [None] * len(prompts)
        t0 = time.perf_counter()
        hits = [self.prefix_cache.lookup(p, self.version) for p in prompts]
        for h in hits:
            if h is not None and h.length == len(h.entry.ids):
                self.prefix_cache.discard(h.key)
        self.prefix_cache_seconds += time.perf_counter() - t0
        return hits

    def _decoder(self, rows: int) -> StaticDecoder:
        """The static decoder of a bucket, built (and its decode step captured) on first use."""
        dec = self._decoders.get(rows)
        if dec is None:
            if self.cuda_graphs and self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            dec = StaticDecoder(
                self.model, self.forward.attn, rows, self.cache_len, self.cuda_graphs, self._graph_pool
            )
            self._decoders[rows] = dec
        return dec


@dataclass
class _Riders:
    """The canary probe's rows riding along a call (:meth:`HFEngine.generate_probed`): their prompts and
    sampling, the tokens they are fed, and, once run, their samples."""

    prompts: list[list[int]]
    params: list[SamplingParams]
    tail: list[int]
    samples: list[Sample] | None = None

    @property
    def rows(self) -> int:
        return len(self.prompts)

    def forced(self, free: int, steps: int) -> torch.Tensor:
        """``[free + rows, steps]``: -1 (draw) for the ``free`` rows before the riders, then the riders'
        tokens (padded past their budget, where they are finished)."""
        forced = torch.full((free + self.rows, max(steps, len(self.tail))), -1, dtype=torch.long)
        forced[free:] = 0
        forced[free:, : len(self.tail)] = torch.tensor(self.tail, dtype=torch.long)
        return forced


@contextmanager
def _inference(model: PreTrainedModel) -> Iterator[None]:
    """``model`` in eval mode, no autograd; its training flag restored after."""
    was_training = model.training
    model.train(False)
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _plain_dynamic_cache(model: PreTrainedModel) -> bool:
    """Whether the model's growing cache is full-attention layers only (what the prefix cache can rebuild)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _merged_copy(policy: Policy) -> MergedCopy | None:
    """A merged copy of a LoRA policy to sample from; ``None`` without LoRA, or (with a warning) for an
    adapter that cannot be folded."""
    if not is_lora(policy.model):
        return None
    t0 = time.perf_counter()
    try:
        merged = MergedCopy(policy.model)
    except MergeUnsupported as exc:
        log.warning("rollout.engine.merge_lora: sampling through the unmerged adapter (%s)", exc)
        return None
    log.debug("merged LoRA copy built in %.2f s", time.perf_counter() - t0)
    return merged
