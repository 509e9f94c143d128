"""float32 master weights for trained parameters held in a lower precision (``model.dtype: bfloat16``).

The model computes in its own dtype (the working copy: forward and backward in bfloat16), but an AdamW
update of ``lr · m̂/√v̂`` is far below bfloat16's resolution near a weight (8 significant bits: a step
smaller than ``|w| / 256`` rounds away), so updates applied to bfloat16 weights are lost or biased, and
bfloat16 moments lose the small second moments (mixed-precision training, Micikevicius et al. 2018).
So for every trained parameter that is not float32 the optimiser holds a float32 *master* copy:

1. backward fills the working parameter's gradient (bfloat16); :meth:`MasterWeights.grads_in` moves it
   to the master, as float32 (and frees the working one);
2. the gradient clip and the optimiser step (AdamW state float32, created on the masters) run on the
   masters, in float32;
3. :meth:`MasterWeights.weights_out` rounds the masters into the working parameters (round to nearest
   even), which the next forward and every published weight version read: the engine loads the model's
   own dtype, as at ``model.dtype: float32``.

Parameters already float32 are trained as they are: LoRA's adapters under a bfloat16 base are float32
(peft keeps adapter weights float32 over a half-precision base), so a LoRA run needs no master copy —
the adapter is its own master, and the engine folds it into the bfloat16 weights in float32 and rounds
once (:class:`asyncrl.policy.lora.MergedCopy`). A trainer checkpoint holds the working copy: a resumed
trainer starts its masters from the bfloat16 weights (:meth:`MasterWeights.pull`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class MasterWeights:
    """float32 masters of the low-precision ones among ``params`` (the optimiser's parameters)."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params: list[torch.Tensor] = []
        """What the optimiser steps: each trained parameter, or its float32 master when it has one."""
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        """``(working, master)`` for every trained parameter that is not float32."""
        for p in params:
            if p.dtype in (torch.bfloat16, torch.float16):
                master = torch.nn.Parameter(p.detach().to(torch.float32, copy=True))
                self.pairs.append((p, master))
                self.params.append(master)
            else:
                self.params.append(p)

    @property
    def masters(self) -> list[torch.Tensor]:
        return [m for _, m in self.pairs]

    def grads_in(self) -> None:
        """Each working gradient, as float32, becomes its master's (the working one is freed)."""
        for w, m in self.pairs:
            m.grad = None if w.grad is None else w.grad.to(torch.float32)
            w.grad = None

    @torch.no_grad()
    def weights_out(self) -> None:
        """The masters, rounded to the working dtype, into the working parameters."""
        for w, m in self.pairs:
            w.copy_(m)

    @torch.no_grad()
    def pull(self) -> None:
        """The masters from the working parameters (after weights were loaded into the model)."""
        for w, m in self.pairs:
            m.copy_(w)

    def zero_grad(self) -> None:
        """Drop the working parameters' gradients (the optimiser drops the masters')."""
        for w, _ in self.pairs:
            w.grad = None
