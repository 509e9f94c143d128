"""Sharded trainer ranks (``trainer.parallel: fsdp``): the policy under FSDP2's ``fully_shard``.

With ``trainer.world_size > 1`` and ``parallel: fsdp`` each rank keeps 1/N of every parameter, of its
gradient and of the AdamW moments (ZeRO-3), instead of the whole model (``ddp``).
The learner's maths is unchanged; :class:`asyncrl.trainer.parallel.Sharded` asks this module.

Units
    Every decoder layer is one ``fully_shard`` unit (its parameters all-gathered just before its
    forward, freed after it, gathered again for the backward, gradients reduce-scattered after it).
    The learner never calls the causal LM's own ``forward``: it runs the decoder and the LM head as
    separate calls (the head only at the loss positions, in chunks; :mod:`asyncrl.policy.model`). So the
    root unit is :class:`~asyncrl.trainer.parallel.Scorer`, a module whose ``forward`` IS the learner's scoring function: the
    embeddings, the final norm and the (tied) head belong to it, are gathered when a score starts and
    stay gathered until its backward ends (FSDP2 does not reshard its root after the forward), so the
    head's chunked calls, and their recomputation in the backward, see whole weights.

Lock-step
    Every pass through the scorer is a collective (all-gathers in the forward, reduce-scatters in
    the backward), so every rank must run the same number of passes: the learner pads a rank's share
    of micro-batches with passes of weight 0 (:meth:`asyncrl.trainer.parallel.Sharded.own`), and an
    adapter or layer that got no gradient on a rank reduce-scatters zeros
    (``set_reduce_scatter_unused_params``). The reduce-scatter SUMS (divide factor 1): the learner's
    micro-batch weights already make the sum over ranks the one-rank gradient, as with ``ddp``.

The full state
    Publishing a version (the canary runs the model on its probe) and checkpointing the policy need the
    whole weights on rank 0: :meth:`ShardedPolicy.gather` all-gathers every parameter, on every rank
    together (rank 0 sends ``gather``), into a :class:`~asyncrl.policy.Policy` twin of rank 0 — the
    same modules, built once on the meta device — which then publishes and saves exactly as one rank
    does. The twin's weights are released at the next step. The optimiser state stays sharded: each
    rank writes its shards of the moments (``torch.distributed.checkpoint``, as with ``ddp``).

Resume
    A checkpoint holds full tensors whatever wrote it: every rank loads it into the unsharded model and
    optimiser first, then :meth:`~asyncrl.trainer.parallel.Sharded.wrap` shards both (each rank keeps its own slice, no
    communication), so a checkpoint of any world size and either mode resumes in this one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

if TYPE_CHECKING:
    from asyncrl.policy import Policy
    from asyncrl.trainer.distributed import RankGroup


def _meta(p: torch.Tensor) -> torch.nn.Parameter:
    """A parameter shaped like ``p`` on the meta device (no memory)."""
    return torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)


class ShardedPolicy:
    """A rank's FSDP2-sharded policy: the scorer to run (the root unit), and the gathered full state."""

    def __init__(self, policy: Policy, scorer: torch.nn.Module, group: RankGroup) -> None:
        from asyncrl.policy import Policy

        model = policy.model
        # rank 0's twin: a copy of the modules with every parameter on the meta device, buffers real
        twin = copy.deepcopy(model, {id(p): _meta(p) for p in model.parameters()}) if group.leader else None
        self._slots = [  # (live module, twin module, parameter name), tied parameters included
            (live, mirror, name)
            for live, mirror in zip(model.modules(), (twin or model).modules(), strict=True)
            for name, p in live._parameters.items()
            if p is not None
        ]
        self.twin = None if twin is None else Policy(twin, policy.tokenizer)  # type: ignore[arg-type]
        mesh = init_device_mesh(group.device.type, (group.world,))
        hf: Any = model  # get_decoder is untyped in transformers (and reached through peft's wrapper)
        units: list[FSDPModule] = [fully_shard(layer, mesh=mesh) for layer in hf.get_decoder().layers]
        self.scorer = fully_shard(scorer, mesh=mesh)
        for unit in [*units, self.scorer]:
            unit.set_gradient_divide_factor(1.0)  # a sum: the learner's weights normalise
            unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
            unit.set_reduce_scatter_unused_params(True)  # a rank with no gradient sends zeros
        self._units = [*units, self.scorer]
        self.gathered = False

    def gather(self) -> Policy | None:
        """Collective: every parameter's full tensor; rank 0 gets them as its twin policy (else ``None``)."""
        for unit in self._units:
            unit.reshard()  # every rank in the same (sharded) state: the same all-gathers below
        full: dict[int, torch.nn.Parameter | None] = {}
        for live, mirror, name in self._slots:
            p = live._parameters[name]
            assert p is not None
            if id(p) not in full:
                t = p.full_tensor() if isinstance(p, DTensor) else p  # an all-gather on every rank
                # only rank 0 keeps the whole tensor; the others drop it at once
                keep = self.twin is not None
                full[id(p)] = torch.nn.Parameter(t.detach(), requires_grad=p.requires_grad) if keep else None
            if self.twin is not None:
                mirror._parameters[name] = full[id(p)]  # tied parameters stay tied (one tensor)
        self.gathered = True
        return self.twin

    def release(self) -> None:
        """Drop the twin's weights (the next optimiser step makes them stale)."""
        if self.twin is not None and self.gathered:
            for _, mirror, name in self._slots:
                p = mirror._parameters[name]
                assert p is not None
                mirror._parameters[name] = _meta(p)
        self.gathered = False


def shard_optimizer_state(state: dict[str, Any], params: Sequence[torch.Tensor]) -> dict[str, Any]:
    """``state`` (an optimiser ``state_dict`` of whole tensors, the same on every rank) for the sharded
    ``params``: every moment shaped like its parameter becomes this rank's slice of it (no communication);
    scalars (AdamW's step) stay as they are."""
    for idx, entries in state["state"].items():
        p = params[idx]
        for name, value in entries.items():
            if isinstance(p, DTensor) and isinstance(value, torch.Tensor) and value.shape == p.shape:
                entries[name] = distribute_tensor(value, p.device_mesh, p.placements, src_data_rank=None)
    return state
