"""What the built-in engine asks of a forward pass, with the plain answers (the model's own forward): one
object, so the engine's loops have no fast-path branches (the way the learner asks
:class:`~asyncrl.trainer.parallel.Parallel`). :mod:`asyncrl.engine.cpu` answers with the CPU fast path and
:func:`~asyncrl.engine.cpu.make_forward` picks. The static decoder (GPU) runs the model's forward.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncrl.engine.decode import last_logits
from asyncrl.policy.model import as_attention_bias


class Forward:
    """The questions, answered by ``model``'s forward (the policy's, or its merged copy)."""

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
        """The last-position logits ``[rows, V]`` of ``tokens [rows, n]`` at ``positions [rows, n]``, each query
        seeing the cache columns ``allowed [rows, n, columns]`` marks (:meth:`~asyncrl.engine.prefill.Prefill._level`).
        Writes the windows' KV into ``cache``."""
        return last_logits(
            self.model, tokens, positions, as_attention_bias(allowed[:, None], self.attn), cache
        )

    def repack(self, changed: set[int] | None) -> None:
        """The weights changed (those whose ``id`` is in ``changed``; ``None``: any): rebuild what is derived."""

    def modules(self) -> list[torch.nn.Module]:
        """The modules a call computes through (what core lending hooks: :meth:`GenerationEngine.compute_modules`)."""
        return [self.model]
