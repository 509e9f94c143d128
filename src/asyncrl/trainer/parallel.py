"""Which parallelism a trainer rank runs: one object the learner asks, so its inner loop has no branches
(in the spirit of torchtitan's ``ParallelDims``). :class:`Parallel` is the interface (its answers are
one rank's: :class:`Single`).

:class:`Replicated` (``trainer.parallel: ddp``) runs the :class:`Scorer` under torch's
``DistributedDataParallel``: gradient accumulation under ``no_sync()`` for all but a rank's last
micro-batch, whose backward all-reduces the accumulated gradients in buckets, overlapped with the
backward. The comm hook SUMS (:func:`_sum`): the learner's micro-batch weights make the sum over ranks
the one-rank gradient. Every rank runs at least one gradient pass per minibatch (a rank without a
micro-batch runs a padding pass of weight 0), because every rank must join each bucket's all-reduce.
:class:`Sharded` (``fsdp``) runs it under FSDP2 (:mod:`asyncrl.trainer.fsdp`), every pass a collective.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from asyncrl.config import RunConfig
from asyncrl.policy.scoring import token_logprobs_and_entropy

if TYPE_CHECKING:
    from asyncrl.policy import Policy
    from asyncrl.trainer.distributed import Command, RankGroup
    from asyncrl.trainer.fsdp import ShardedPolicy

Parts = list[tuple[dict[str, float], float, float]]
"""A minibatch's micro-batch metrics: ``(metrics, policy weight, token weight)`` each."""


class Scorer(torch.nn.Module):
    """:func:`~asyncrl.policy.scoring.token_logprobs_and_entropy` of ``model`` as a module: the unit DDP and
    FSDP2 wrap (their forward hooks run around the learner's separate decoder and head calls)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model  # a transformers model (or peft's wrapper of one)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: torch.Tensor, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return token_logprobs_and_entropy(self.model, input_ids, attention_mask, temperature, **kw)


class Trains(Protocol):
    """What :meth:`Parallel.wrap` needs of the learner."""

    @property
    def policy(self) -> Policy: ...
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler: ...

    def build_optimizer(self) -> None: ...


class Parallel:
    """The questions, with the one-rank answers (:class:`Single`)."""

    world = 1
    scorer: torch.nn.Module

    def wrap(self, learner: Trains) -> None:
        """Put ``learner``'s policy under this parallelism (after any checkpoint was loaded into it)."""
        self.scorer = Scorer(learner.model)

    def own(self, sizes: list[int], backward: bool) -> list[int]:
        """Indices of the micro-batches (``sizes`` in padded tokens) this rank runs; ``-1`` is a padding
        pass of weight 0; ``backward``: a gradient pass."""
        return list(range(len(sizes)))

    def accumulate(self, last: bool) -> AbstractContextManager[Any]:
        """The context of a micro-batch's forward and backward; ``last``: this rank's last of the minibatch."""
        return nullcontext()

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def reduce(self, total: torch.Tensor, parts: Parts) -> tuple[torch.Tensor, Parts, dict[str, float]]:
        """The minibatch's loss and every micro-batch's metrics (all ranks'), and metrics of the split."""
        return total, parts, {}

    def clip(self, params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    def release(self) -> None:
        """A step starts: a gathered full state goes stale."""

    def full_policy(self, policy: Policy) -> Policy:
        """Rank 0: ``policy`` with its whole weights."""
        return policy

    def gather(self) -> Policy | None:
        """Collective with a sharded policy: its full state (rank 0 gets it; else ``None``)."""
        return None

    def tell(self, command: Callable[[], Command]) -> None:
        """Rank 0: send the followers ``command()`` (built only when there are followers)."""

    def beat(self) -> None:
        """Rank 0, idle: keep the followers' collective timeout from firing."""


class Single(Parallel):
    """One rank (``trainer.world_size: 1``)."""


class _Ranks(Parallel):
    """N ranks of one process group: the split of micro-batches, the sums and the commands."""

    def __init__(self, group: RankGroup) -> None:
        self.group = group
        self.world = group.world

    def own(self, sizes: list[int], backward: bool) -> list[int]:
        return self.group.mine(sizes)

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        return self.group.sum_(t)

    def reduce(self, total: torch.Tensor, parts: Parts) -> tuple[torch.Tensor, Parts, dict[str, float]]:
        ran = self.group.per_rank(len(parts))  # what each rank ran, not what it was told
        split = {f"train/microbatches_rank{r}": float(n) for r, n in enumerate(ran)}
        return self.group.sum_(total), self.group.gather_parts(parts), split

    def tell(self, command: Callable[[], Command]) -> None:
        self.group.send(command())

    def beat(self) -> None:
        self.group.beat()


def _sum(group, bucket):  # type: ignore[no-untyped-def]  # DDP rejects the string annotations of this module
    """DDP's comm hook: a bucket's gradients summed over the ranks (DDP's own hook divides by the world)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class Replicated(_Ranks):
    """Every rank the whole model and optimiser (``trainer.parallel: ddp``): torch's DDP."""

    def wrap(self, learner: Trains) -> None:
        from torch.nn.parallel import DistributedDataParallel

        device = self.group.device
        self.ddp = DistributedDataParallel(
            Scorer(learner.model),
            device_ids=[device] if device.type == "cuda" else None,
            forward_sync_buffers=False,  # no collective in a forward: ranks run unequal numbers of passes
        )
        self.ddp.register_comm_hook(None, _sum)
        self.scorer = self.ddp

    def own(self, sizes: list[int], backward: bool) -> list[int]:
        mine = self.group.mine(sizes)
        return [-1] if backward and not mine else mine  # every rank joins the gradient all-reduce

    def accumulate(self, last: bool) -> AbstractContextManager[Any]:
        return nullcontext() if last else self.ddp.no_sync()


class Sharded(_Ranks):
    """Each rank 1/N of every parameter, gradient and moment (``trainer.parallel: fsdp``): FSDP2."""

    sharded: ShardedPolicy

    def wrap(self, learner: Trains) -> None:
        """Shard the policy and the optimiser in place: parameters and AdamW moments become this rank's
        slices (no communication), the LR schedule is kept."""
        from asyncrl.trainer.fsdp import ShardedPolicy, shard_optimizer_state

        state, schedule = learner.optimizer.state_dict(), learner.scheduler.state_dict()
        self.scorer = Scorer(learner.model)  # FSDP2's root unit (fully_shard wraps it in place)
        self.sharded = ShardedPolicy(learner.policy, self.scorer, self.group)
        learner.build_optimizer()  # on the sharded parameters
        trainable = [p for p in learner.model.parameters() if p.requires_grad]
        learner.optimizer.load_state_dict(shard_optimizer_state(state, trainable))
        learner.scheduler.load_state_dict(schedule)

    def own(self, sizes: list[int], backward: bool) -> list[int]:
        """Every pass is a collective: every rank runs as many as the busiest (padding passes)."""
        mine = self.group.mine(sizes)
        return mine + [-1] * (self.group.most(sizes) - len(mine))

    def clip(self, params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm  # the norm of sharded gradients

    def release(self) -> None:
        self.sharded.release()

    def full_policy(self, policy: Policy) -> Policy:
        from asyncrl.trainer.distributed import Gather

        if not self.sharded.gathered:  # once per step
            self.group.send(Gather())
            self.gather()
        assert self.sharded.twin is not None  # rank 0 keeps the twin
        return self.sharded.twin

    def gather(self) -> Policy | None:
        return self.sharded.gather()


def make_parallel(cfg: RunConfig, group: RankGroup | None) -> Parallel:
    """This rank's parallelism: one rank without a group, else ``trainer.parallel``'s."""
    if group is None:
        return Single()
    return Sharded(group) if cfg.trainer.parallel == "fsdp" else Replicated(group)
