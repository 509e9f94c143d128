"""Prepacked linear layers for CPU decoding (``rollout.engine.packed_linear``) and :class:`PackedForward`,
the fast path of the merged copy with its linears packed and the model's own forward.

A decode step multiplies ``batch`` rows (16, say) by every weight of the model: a skinny matmul whose
speed depends on how the weight is laid out for the kernel. ``torch.nn.functional.linear`` on a CPU
calls MKL's ``sgemm`` with the weight as stored; oneDNN can instead reorder the weight once into its
own blocked layout and reuse that layout at every step (what inductor does with ``freezing``).
:func:`pack_linears` swaps the ``nn.Linear`` layers of a model the engine owns for
:class:`PackedLinear` s that compute through such a copy; the weights themselves stay where they were
(same parameters, names and state dict), so loads, the merged copy's refolds and the weight-sync
canary see what they saw before. The packed copies are derived data: :meth:`PackedLinear.repack` after
every change of the weights (:meth:`PackedForward.repack`, after each refold of the merged copy).

Float32 or bfloat16 (:data:`PACKED_DTYPES`); the result equals ``linear`` up to float rounding (the summation
order differs; in bfloat16 it measured bit-identical here).
Under autograd (a forward with gradients enabled) and inside ``torch.compile`` (inductor cannot take
oneDNN's opaque tensor) a :class:`PackedLinear` computes as ``linear`` does. oneDNN's packing is reached
through two private torch ops (:func:`pack`, :func:`packed_linear`; torch has no public one), which is
why :mod:`asyncrl.engine.cpu` turns the fast path off under a torch it was not written for.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from asyncrl.engine.forward import Forward


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` reordered into oneDNN's blocked layout (an opaque tensor for :func:`packed_linear`)."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    return packed


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``linear(x, weight, bias)`` through ``packed = pack(weight)``."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return out


PACKED_DTYPES = (torch.float32, torch.bfloat16)
"""The weight dtypes oneDNN packs (bfloat16 on a CPU with AVX-512 BF16 or AMX runs at about twice the
float32 rate; elsewhere oneDNN emulates it, correct and slower)."""


def packable(m: torch.nn.Module) -> bool:
    """Whether :func:`pack_linears` packs ``m``: a float32 or bfloat16 ``nn.Linear`` on the CPU."""
    return type(m) is torch.nn.Linear and m.weight.dtype in PACKED_DTYPES and m.weight.device.type == "cpu"


class PackedLinear(torch.nn.Module):
    """``nn.Linear`` computing through a oneDNN-packed copy of its weight (float32 or bfloat16, CPU inference)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same parameter: names, ties and in-place loads unchanged
        self.bias = linear.bias
        self.packed: torch.Tensor | None = None
        self.repack()

    @torch.no_grad()
    def repack(self) -> None:
        """Pack the weight as it is now."""
        self.packed = pack(self.weight)

    def unpack(self) -> None:
        """Compute as ``linear`` from now on, with no packed copy to keep: for a layer whose decode-step
        matmul runs elsewhere (the fused step's stacked copy), left to prefills, where a packed layout
        gains nothing (``docs/engines.md``). :meth:`repack` packs it again."""
        self.packed = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        # inductor cannot take oneDNN's opaque tensor: its own kernels
        if self.packed is None or grad or torch.compiler.is_compiling():
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return packed_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        packed = "packed" if self.packed is not None else "unpacked"
        return f"in_features={self.in_features}, out_features={self.out_features}, {packed}"


def pack_linears(model: torch.nn.Module) -> list[PackedLinear]:
    """Swap every float32 ``nn.Linear`` of ``model`` for a :class:`PackedLinear` (in place); return them."""
    packed = {name: PackedLinear(m) for name, m in model.named_modules() if packable(m)}
    for name, p in packed.items():
        model.set_submodule(name, p)
    return list(packed.values())


class PackedForward(Forward):
    """The model's own forward over its linears packed in place (:func:`pack_linears`)."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self.packed = pack_linears(model)

    def repack(self, changed: set[int] | None) -> None:
        for layer in self.packed:
            if changed is None or id(layer.weight) in changed:
                layer.repack()
