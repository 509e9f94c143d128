"""The generation-engine interface: token prompts in, sampled continuations with behaviour log-probs out.

Callers (rollout workers, evaluation) depend only on :class:`GenerationEngine`; the backend is
chosen by ``rollout.engine.kind`` in :func:`asyncrl.engine.make_engine`:
:class:`~asyncrl.engine.hf.HFEngine` (``hf``, built in) or
:class:`~asyncrl.engine.vllm_backend.VLLMEngine` (``vllm``, optional dependency).

**Weights.** An engine loads a new weight version through one method,
:meth:`GenerationEngine.load_weights`: the tensors (full weights, or a LoRA adapter version, as
:meth:`~asyncrl.policy.model.Policy.state_dict_tensors` returns them and the weight store
publishes them) and, when they came from a verified weight-store snapshot, its directory — which
an engine whose model lives in other processes (vLLM) may reload from directly.
:attr:`GenerationEngine.version` changes only once the load succeeded. To load a directory
written by :meth:`~asyncrl.policy.model.Policy.save` or the weight store, read it with
:func:`read_weights` first. After every load the weight-sync canary
(:mod:`asyncrl.policy.canary`) asks the engine for :meth:`GenerationEngine.fingerprint` and
:meth:`GenerationEngine.probe` and refuses a version whose values differ from the trainer's.

**Behaviour log-prob definition.** For every sampled token the engine records
``log q(token)``, where ``q`` is the distribution the token was actually drawn from:

1. ``softmax(logits / temperature)``;
2. restricted to the top-p nucleus (the smallest set of most likely tokens whose mass
   reaches ``top_p``) and renormalised over it.

With ``top_p = 1`` step 2 is the identity, so the recorded value equals
:func:`asyncrl.policy.scoring.token_logprobs` with the same temperature, which is what the
trainer recomputes (to float32 rounding; the test suite pins max ``|Δ| < 1e-5``, mean ``< 1e-6``,
about 8x and 5x the measured floor: docs/engines.md#log-prob-tolerances-and-the-mutants-they-catch). With
``top_p < 1`` the recorded value is larger by ``-log(nucleus mass)``: the trainer's
tempered-softmax log-prob does not model truncation, and that gap is absorbed by the
importance ratio like any other behaviour/target mismatch.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from asyncrl.records import SamplingParams

if TYPE_CHECKING:
    from asyncrl.policy.canary import Fingerprint

FinishReason = Literal["stop", "length"]


@dataclass
class Sample:
    """One sampled continuation of one prompt."""

    token_ids: list[int]
    """Sampled tokens, including the stop token if one was hit."""
    logprobs: list[float]
    """Behaviour log-prob of each sampled token (see the module docstring)."""
    finish_reason: FinishReason
    """``stop``: a stop token was sampled; ``length``: max_new_tokens or the context ran out."""


class GenerationEngine(ABC):
    """Batched sampler with versioned weights; the only interface rollout code depends on."""

    version: int
    """Version of the weights currently loaded (0 for the initial weights)."""
    max_context: int
    """Longest prompt + continuation the engine accepts, in tokens."""

    # the built-in engine's counters (per engine; they stay 0 where a backend computes elsewhere)
    decode_steps: int = 0
    """Decode steps run (all paths)."""
    decode_seconds: float = 0.0
    """Time in decode steps; over :attr:`decode_steps`, the per-step latency."""
    prefill_tokens_computed: int = 0
    """Prompt tokens run through the model in prefills (with sharing: each distinct prefix once)."""
    prefill_tokens_reused: int = 0
    """Prompt tokens whose KV came from the prefix cache instead."""
    prefill_tokens_shared: int = 0
    """Prompt tokens whose KV another prompt of the same chunk computed (prefix sharing)."""
    prefill_seconds: float = 0.0
    """Time in prefills (cached-KV assembly included)."""

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]
    ) -> list[Sample]:
        """Sample one continuation per prompt; ``sampling`` is shared or one per prompt.

        A continuation ends at the first stop token (included), after
        ``max_new_tokens`` tokens, or when prompt + continuation fill the context
        (``finish_reason == "length"`` for both). A prompt longer than the context raises
        ``ValueError``.
        """

    @abstractmethod
    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:
        """Load ``tensors`` as weight version ``version``; set :attr:`version` once they are in place.

        ``tensors``: full weights, or a LoRA adapter version (strict either way: a name or shape
        that does not fit raises). ``path``: the verified weight-store snapshot directory they were
        read from, if any; an engine in another process may reload from it directly, and uses
        ``tensors`` when it cannot (e.g. retention removed the directory meanwhile). The built-in
        engine uses ``tensors`` only.
        """

    def fingerprint(self, names: Sequence[str]) -> Fingerprint | None:
        """The :func:`~asyncrl.policy.canary.fingerprint` of the weights the engine's model holds now
        under ``names`` (a version's tensor names), read from the model itself, not from a file; a name
        the model lacks is left out. ``None``: this backend cannot read its model's tensors (the weight-sync
        canary then checks the probe only)."""
        return None

    def probe(self, ids: Sequence[int]) -> list[float] | None:
        """``log p(ids[t] | ids[:t])`` for ``t = 1..len(ids)-1`` at temperature 1 under the weights the
        engine serves now (what the weight-sync canary compares with the trainer's), computed by as much
        of the engine's generation path as the backend can run (its docstring says which); ``None``: not
        supported by this backend."""
        return None

    def generate_probed(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams], ids: Sequence[int]
    ) -> tuple[list[Sample], list[float] | None]:
        """:meth:`generate` and :meth:`probe` of ``ids`` under the same weights, in one call: the weight-sync
        canary's probe riding along the first call after a load. A backend that can run the probe's rows
        in the call's own batch does (their decode steps are then the call's); this default runs them
        after the call."""
        return self.generate(prompts, sampling), self.probe(ids)

    def compute_modules(self) -> list[torch.nn.Module]:
        """The torch modules whose forward passes this engine runs in this process, each generation
        step through one of them (core lending polls before their decoder layers); none for a backend
        that computes elsewhere."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release processes or files the engine holds (nothing for the built-in engine)."""


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of ``path/model.safetensors`` (a directory as :meth:`Policy.save` or the weight
    store writes it) or of the file ``path`` itself, on the CPU, for :meth:`GenerationEngine.load_weights`."""
    from safetensors.torch import load_file

    from asyncrl.policy.model import WEIGHTS_NAME

    p = Path(path)
    file = p / WEIGHTS_NAME if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"no weights at {str(file)!r} (expected a directory holding {WEIGHTS_NAME})")
    return load_file(str(file))


def with_room(
    prompts: list[list[int]], max_context: int, run: Callable[[list[int]], list[tuple[int, Sample]]]
) -> list[Sample]:
    """One sample per prompt: those ``run(rows)`` gives, as ``(index, sample)``, for the ``rows`` whose prompt
    leaves room for a token; an empty ``length`` sample for each other prompt."""
    done = dict(run([i for i, p in enumerate(prompts) if len(p) < max_context]))
    return [done.get(i) or Sample([], [], "length") for i in range(len(prompts))]


def stop_ids(stop_token_ids: Sequence[int], vocab_size: int, max_batch: int) -> list[int]:
    """An engine's stop token ids, sorted and unique, after checking them and its ``max_batch``."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    bad = [t for t in stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"stop token ids {bad} are outside the vocabulary (0..{vocab_size - 1})")
    return sorted(set(stop_token_ids))


def check_requests(
    prompts: list[list[int]],
    sampling: SamplingParams | list[SamplingParams],
    max_context: int,
    vocab_size: int,
) -> list[SamplingParams]:
    """Validate a :meth:`GenerationEngine.generate` call; return one :class:`SamplingParams` per prompt."""
    params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
    if len(params) != len(prompts):
        raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
    for i, sp in enumerate(params):
        if not (math.isfinite(sp.temperature) and sp.temperature > 0):
            raise ValueError(
                f"sampling[{i}].temperature = {sp.temperature!r}: must be > 0 "
                "(use a small value such as 1e-4 for near-greedy decoding)"
            )
        if not (0 < sp.top_p <= 1):
            raise ValueError(f"sampling[{i}].top_p = {sp.top_p!r}: must be in (0, 1]")
        if sp.max_new_tokens < 1:
            raise ValueError(f"sampling[{i}].max_new_tokens = {sp.max_new_tokens!r}: must be >= 1")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty; a prompt needs at least one token")
        if len(prompt) > max_context:
            raise ValueError(
                f"prompt {i} has {len(prompt)} tokens, longer than the model's context of "
                f"{max_context} tokens"
            )
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {i} holds token ids outside the vocabulary (0..{vocab_size - 1})")
    return params
