"""What the built-in engine asks of a forward pass, with the plain answers: one object, so the engine's
loops have no fast-path branches (the way the learner asks :class:`~asyncrl.trainer.parallel.Parallel`).

:class:`~asyncrl.engine.hf.HFEngine` owns batching, the caches and sampling; a :class:`Forward` owns the
arithmetic of a growing-cache decode step (:meth:`~Forward.decode`), of the prefill of a level of prompt
spans (:meth:`~Forward.prefill`) and what is derived from the weights (:meth:`~Forward.repack`, after
every load). The answers here are the model's own forward pass (transformers);
:mod:`asyncrl.engine.cpu` answers with the CPU fast path, and :func:`asyncrl.engine.cpu.make_forward`
picks. The static decoder (:class:`~asyncrl.engine.decode.StaticDecoder`, GPU) runs the model's forward.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.engine.decode import last_logits
from asyncrl.policy.model import as_attention_bias


class Forward:
    """The questions, with the plain answers: the forward pass of ``model`` (the policy's, or its merged copy)."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.attn = str(model.config._attn_implementation)  # transformers' only spelling of the kernel's name

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Next-token logits ``[rows, V]`` of ``tokens [rows]`` at ``positions [rows]``; ``valid [rows,
        columns]`` the cache columns each row sees (this step's, the next one written, included). Writes the
        step's KV into ``cache``."""
        mask = as_attention_bias(valid[:, None, None, :], self.attn)
        return last_logits(self.model, tokens[:, None], positions[:, None], mask, cache)

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """The last-position logits ``[rows, V]`` of ``tokens [rows, n]`` at ``positions [rows, n]``, right-aligned
        windows, each query seeing the cache columns ``allowed [rows, n, columns]`` marks (the layout:
        :meth:`asyncrl.engine.prefill.Prefill._level`). Writes the windows' KV into ``cache``."""
        return last_logits(
            self.model, tokens, positions, as_attention_bias(allowed[:, None], self.attn), cache
        )

    def repack(self, changed: set[int] | None) -> None:
        """The weights changed (those whose ``id`` is in ``changed``; ``None``: any): rebuild what is derived
        from them. The plain forward derives nothing."""

    def modules(self) -> list[torch.nn.Module]:
        """The modules a call computes through (what core lending hooks: :meth:`GenerationEngine.compute_modules`)."""
        return [self.model]
