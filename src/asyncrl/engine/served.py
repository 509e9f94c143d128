"""What the built-in engine samples from (:class:`ServedModel`): the policy's model, or a merged copy of
its LoRA adapter, with the CPU decode switches applied to it — packed linear layers and the fused decode
step. Everything derived from the weights (the fold, the packed and stacked
copies) is rebuilt by :meth:`ServedModel.refresh`, which the engine runs at every weight load.
"""

from __future__ import annotations

import logging
import time

from transformers import PreTrainedModel

from asyncrl.engine.fused import FusedDecoder, fusable
from asyncrl.engine.packed import PackedLinear, pack_linears, packing_available
from asyncrl.policy.lora import MergedCopy, MergeUnsupported, is_lora
from asyncrl.policy.model import Policy

log = logging.getLogger(__name__)


class ServedModel:
    """The model the engine runs and its derived decode paths.

    ``merged``: with ``merge_lora`` and a LoRA policy, a :class:`MergedCopy` (else ``None``; with a
    warning for an adapter it cannot fold); ``model``: its model, or ``policy.model``. ``packed``: with
    ``packed_linear`` (``rollout.engine.packed_linear``), a merged copy and oneDNN on a CPU, the copy's
    linear layers swapped for :class:`PackedLinear` s; else none. ``fused``: with ``fused_decode``
    (``rollout.engine.fused_decode``), packed layers and a model :func:`~asyncrl.engine.fused.fusable`,
    the :class:`FusedDecoder` growing-cache decode steps run; else ``None`` (they run ``model``).
    """

    def __init__(
        self,
        policy: Policy,
        merge_lora: bool,
        packed_linear: bool,
        fused_decode: bool,
    ) -> None:
        self.merged = _merged_copy(policy) if merge_lora else None
        self.model: PreTrainedModel = self.merged.model if self.merged is not None else policy.model
        self.packed: list[PackedLinear] = []
        if (
            packed_linear
            and self.merged is not None
            and packing_available(next(self.model.parameters()).device)
        ):
            self.packed = pack_linears(self.model)
        self.fused: FusedDecoder | None = None
        if fused_decode and self.packed and fusable(self.model):
            self.fused = FusedDecoder(self.model)

    def refresh(self) -> None:
        """Fold the policy's adapter into the merged copy again and repack (nothing without a copy)."""
        if self.merged is None:
            return
        self.merged.refresh()
        for layer in self.packed:
            layer.repack()
        if self.fused is not None:
            self.fused.repack()


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
