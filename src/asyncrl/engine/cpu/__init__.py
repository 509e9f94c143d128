"""The built-in engine's CPU fast path behind :class:`~asyncrl.engine.forward.Forward`; :func:`make_forward`
picks, once: :class:`~asyncrl.engine.cpu.fused.FusedForward` (``fused_decode``: packed linears and a
written-out Llama-layout forward), :class:`~asyncrl.engine.cpu.packed.PackedForward` (``packed_linear``) or
the model's own forward (a GPU, no merged LoRA copy, the switches off, or releases the code was not written
for: :data:`WRITTEN_FOR`), with one log line saying why a part asked for is off. Also here:
:mod:`~asyncrl.engine.cpu.head_padding`, for vLLM's CPU attention kernels.
"""

from __future__ import annotations

import importlib
import logging

import torch
from packaging.version import Version
from transformers import PreTrainedModel

from asyncrl.config import HFEngineConfig
from asyncrl.engine.cpu.fused import FusedForward, fusable
from asyncrl.engine.cpu.packed import PackedForward
from asyncrl.engine.forward import Forward

log = logging.getLogger(__name__)

WRITTEN_FOR = {"torch": "2.13.0", "transformers": "5.23.0"}
"""The releases the fast path was written and tested against (pyproject.toml's pins; a test keeps them
equal): it reaches oneDNN through private torch ops and writes out transformers' Llama layer, neither a
stable interface, so under any other release the plain forward runs."""


def unsupported_release() -> str | None:
    """Why this process's torch or transformers is not a release the fast path was written for, or ``None``
    (a local build of the release, ``2.13.0+cpu``, is that release)."""
    for name, want in WRITTEN_FOR.items():  # the modules now loaded (importing peft swaps transformers')
        have = str(importlib.import_module(name).__version__)
        if Version(have).public != want:
            return f"{name} {have} is not {want}, the release it was written for"
    return None


def make_forward(model: PreTrainedModel, cfg: HFEngineConfig, *, merged: bool, plain: bool) -> Forward:
    """The forward the engine runs for ``model`` (``merged``: the merged LoRA copy, which the engine owns and
    may pack; ``plain``: its growing cache is full-attention layers, which the fused forward writes into)."""
    if not cfg.packed_linear:
        return Forward(model)
    device = next(model.parameters()).device
    off = (
        unsupported_release()
        or (f"the model is on {device.type}, not a CPU" if device.type != "cpu" else None)
        or ("this torch has no oneDNN" if not torch.backends.mkldnn.is_available() else None)  # type: ignore[no-untyped-call]
        or (None if merged else "no merged LoRA copy to pack (model.lora with merge_lora)")
    )
    if off is not None:
        log.log(logging.WARNING if off.startswith(tuple(WRITTEN_FOR)) else logging.INFO, _OFF, off)
        return Forward(model)
    if not cfg.fused_decode:
        return PackedForward(model)
    if not (plain and fusable(model)):
        log.info(_OFF, f"fused_decode: {model.config.model_type} is not a Llama-layout model it writes out")
        return PackedForward(model)
    return FusedForward(model, cfg.fused_prefill)


_OFF = "rollout.engine: the CPU fast path is off, the model's own forward runs: %s"
