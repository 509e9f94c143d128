"""The learner: one training step on a batch of trajectories.

A step: leave out the groups without a reward difference (``trainer.skip_equal_reward_groups``,
:mod:`asyncrl.trainer.zero_signal`; none left: nothing runs) → collate (right-padded tensors) →
advantages (credit) → proximal log-probs under the
weights at the start of the step → epochs × minibatches of the unified policy loss with the
staleness age of every token → approximate-KL early stop → gradient clip → optimiser and LR
schedule step (trained bfloat16 weights through float32 masters: :mod:`asyncrl.trainer.master`) → the
train–inference log-prob gap of the step's start weights (:mod:`asyncrl.trainer.gap`). A step whose loss or gradients are not finite anywhere is undone as a whole and
reported; the caller never publishes it. With one optimiser step per learner step the check comes
before ``optimizer.step`` and costs nothing; with several (``minibatches × epochs > 1``) earlier
minibatches may already have stepped, so the weights and the optimiser state are snapshotted at
the start of the step (one device copy of each) and restored on the first non-finite minibatch.

Memory: a minibatch is one optimiser step but not necessarily one forward pass. It is cut into
micro-batches of at most ``trainer.max_tokens_per_microbatch`` padded tokens (:func:`microbatches`,
rows sorted by length so little padding is computed); each micro-batch's loss is scaled by
:func:`asyncrl.algo.microbatch_weights` and back-propagated at once, so its activations are freed
before the next one and the accumulated gradient is the whole minibatch's (gradient accumulation,
not extra optimiser steps). Log-probs come from the final hidden states in chunks of
``trainer.logits_chunk_tokens`` (never ``[B, T, V]`` logits); ``trainer.gradient_checkpointing``
recomputes block activations in the backward. The no-grad passes (proximal, reference, KL check)
use the same micro-batches.

Parallelism (``trainer.world_size > 1``): the learner asks :attr:`Learner.parallel`
(:mod:`asyncrl.trainer.parallel`) which micro-batches this rank runs, what to score the policy with,
how to accumulate, and for the sums over the ranks; the code below is the same for one rank, DDP and
FSDP2. Normalisers, clipping, the finiteness check and the optimiser step are computed identically
on every rank.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from asyncrl.algo import (
    GapTerms,
    PolicyLossConfig,
    approx_kl,
    entropy_loss,
    gap_terms,
    kl_penalty_loss,
    masked_mean,
    microbatch_weights,
    policy_loss,
    policy_loss_mask,
)
from asyncrl.config import RunConfig
from asyncrl.credit.assign import CreditAssigner
from asyncrl.policy.packing import shared_microbatches
from asyncrl.policy.scoring import can_chunk_logits, decoder_layer_shape, token_logprobs_and_entropy
from asyncrl.records import Group, Trajectory, members
from asyncrl.trainer.gap import GapTally
from asyncrl.trainer.master import MasterWeights
from asyncrl.trainer.parallel import Parallel, Single
from asyncrl.trainer.zero_signal import Split

if TYPE_CHECKING:
    from asyncrl.policy.model import Policy


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] long
    attn: torch.Tensor  # [B, T] 0/1
    mask: torch.Tensor  # [B, T] float, 1 on model tokens
    behaviour: torch.Tensor  # [B, T] behaviour log-probs (0 elsewhere)
    versions: torch.Tensor  # [B, T] policy version per token (-1 elsewhere)
    temperature: torch.Tensor  # [B]

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device`` (one copy per tensor; ``Tensor.to`` copies nothing on the same device)."""
        return Batch(*(t.to(device, non_blocking=True) for t in vars(self).values()))


def collate(batch: list[Trajectory], pad_id: int) -> Batch:
    T = max(len(t.token_ids()) for t in batch)
    B = len(batch)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T))
    behaviour = torch.zeros((B, T))
    versions = torch.full((B, T), -1, dtype=torch.long)
    for i, t in enumerate(batch):
        n = len(t.token_ids())
        ids[i, :n] = torch.tensor(t.token_ids())
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(t.loss_mask(), dtype=torch.float32)
        behaviour[i, :n] = torch.tensor(t.behaviour_logprobs())
        versions[i, :n] = torch.tensor(t.token_versions())
    temperature = torch.tensor([t.sampling.temperature for t in batch], dtype=torch.float32)
    return Batch(ids, attn, mask, behaviour, versions, temperature)


def microbatches(lengths: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """Row indices of micro-batches of at most ``max_tokens`` padded tokens (rows × longest row).

    Rows are taken longest first (stable), so each micro-batch pads to little more than its own
    rows; a row longer than the budget is a micro-batch of its own. ``max_tokens = 0`` is one
    micro-batch of every row in order. ``lengths``: ``[B]`` real tokens per row.
    """
    n = int(lengths.shape[0])
    if max_tokens <= 0 or n == 0:
        return [torch.arange(n)]
    order = torch.sort(lengths, descending=True, stable=True).indices.tolist()
    parts: list[list[int]] = [[order[0]]]
    width = max(int(lengths[order[0]]), 1)  # the longest row of the current micro-batch (its first)
    for r in order[1:]:
        if (len(parts[-1]) + 1) * width <= max_tokens:
            parts[-1].append(r)
        else:
            parts.append([r])
            width = max(int(lengths[r]), 1)
    return [torch.tensor(p, dtype=torch.long) for p in parts]


class _Minibatch(NamedTuple):
    """What the loss of a set of rows needs besides the model (all ``[B, T]`` over the whole batch).

    ``prox`` is ``None`` when nothing reads the proximal log-probs (:attr:`Learner.needs_prox`)."""

    b: Batch
    adv: torch.Tensor
    prox: torch.Tensor | None
    ref: torch.Tensor | None
    age: torch.Tensor


class _Part(NamedTuple):
    """One micro-batch: its rows, its padded width, and whether it is forwarded as a token trie."""

    rows: torch.Tensor
    width: int
    shared: bool


def _merge_metrics(parts: list[tuple[dict[str, float], float, float]]) -> dict[str, float]:
    """One minibatch's metrics from its micro-batches' ``(metrics, policy weight, token weight)``.

    Losses add up with their weights (so ``loss/policy`` is the whole minibatch's loss), token counts
    add up, ``*_max``/``*_min`` take the extreme, anything else is a mean weighted by valid tokens.
    """
    out: dict[str, float] = {}
    for metrics, w_policy, w_tok in parts:
        for k, v in metrics.items():
            if k.endswith("_max"):
                out[k] = max(out.get(k, -math.inf), v)
            elif k.endswith("_min"):
                out[k] = min(out.get(k, math.inf), v)
            elif k == "policy/tokens":
                out[k] = out.get(k, 0.0) + v
            else:
                out[k] = out.get(k, 0.0) + (w_policy if k == "loss/policy" else w_tok) * v
    return out


@dataclass
class _Snapshot:
    """The policy's weights and optimiser state at the start of a step, to undo it."""

    params: list[torch.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def take(cls, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> _Snapshot:
        """``tensors``: the model's parameters and the float32 masters (:mod:`asyncrl.trainer.master`)."""
        params = [p.detach().clone() for p in tensors]
        return cls(params, copy.deepcopy(optimizer.state_dict()))

    def restore(self, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for p, saved in zip(tensors, self.params, strict=True):
                p.copy_(saved)
        optimizer.load_state_dict(self.optimizer)


class Learner:
    """Owns the policy's optimiser and LR schedule; ``step`` trains on one batch."""

    def __init__(self, cfg: RunConfig, policy: Policy, ref_policy: Policy | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.model = policy.model
        self.ref = ref_policy
        tc = cfg.trainer
        self.gap = GapTally()  # the train-inference log-prob gap over the process's steps
        self._gap_parts: list[GapTerms] = []
        self.build_optimizer()
        self.credit = CreditAssigner(cfg, policy)  # owns the value model, when the strategy uses one
        if tc.gradient_checkpointing:
            hf: Any = self.model  # a transformers model (or peft's wrapper of one)
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.parallelize(Single())

    def parallelize(self, parallel: Parallel) -> None:
        """Train under ``parallel`` (after any checkpoint was loaded into the policy and optimiser)."""
        self.parallel = parallel
        parallel.wrap(self)

    def build_optimizer(self) -> None:
        """A fresh AdamW and LR schedule on the trainable parameters (again after they were sharded); a
        trainable parameter below float32 (``model.dtype: bfloat16``, full fine-tune) is stepped through
        its float32 master (:mod:`asyncrl.trainer.master`), so the optimiser state is float32 too."""
        tc = self.cfg.trainer
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapter alone
        self.master = MasterWeights(trainable)
        # fused: one kernel per step without the foreach path's parameter-sized temporaries (the
        # optimiser step was the peak of a memory-lean step); CPU and CUDA have the kernel
        fused = self.policy.device.type in ("cpu", "cuda") and bool(trainable)
        self.optimizer = torch.optim.AdamW(
            self.master.params, lr=tc.lr, weight_decay=tc.weight_decay, fused=fused
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)

    def _lr_factor(self, step: int) -> float:
        tc = self.cfg.trainer
        if step < tc.warmup_steps:
            return (step + 1) / tc.warmup_steps
        frac = min(1.0, (step - tc.warmup_steps) / max(1, tc.total_steps - tc.warmup_steps))
        if tc.lr_schedule == "linear":
            return 1.0 - 0.9 * frac
        if tc.lr_schedule == "cosine":
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        return 1.0

    @property
    def needs_prox(self) -> bool:
        """Whether anything reads the proximal log-probs (the weights at the start of the step): the
        ``decoupled_ppo`` loss, or ``trainer.target_kl``'s check after an epoch that is not the last.
        Other losses take their ratio against the behaviour log-probs, so the pass is skipped."""
        tc = self.cfg.trainer
        return self.cfg.algo.policy_loss.kind == "decoupled_ppo" or (
            tc.target_kl is not None and tc.epochs > 1
        )

    def step(self, groups: Sequence[Group], version: int) -> dict[str, float]:
        """Train on the members of ``groups`` at weight ``version``; returns metrics (``train/skipped``
        = 1 if not finite). Groups without a reward difference are left out of the gradient
        (``trainer.skip_equal_reward_groups``, :mod:`asyncrl.trainer.zero_signal`); with none left the
        step runs nothing (``train/samples`` 0: no forward, no optimiser or LR step). The reward figures
        are the whole batch's."""
        split = Split.of(groups, self.cfg)
        trajs = members(groups)
        metrics = {
            **split.metrics(),
            "reward/mean": float(sum(t.final_reward for t in trajs) / len(trajs)),
            "reward/success_rate": sum(t.outcome == "success" for t in trajs) / len(trajs),
        }
        if not split.kept:
            lr = float(self.scheduler.get_last_lr()[0])
            return metrics | {"train/skipped": 0.0, "train/samples": 0.0, "train/tokens": 0.0, "train/lr": lr}
        return self._train(split.kept, version) | metrics

    def _train(self, groups: Sequence[Group], version: int) -> dict[str, float]:
        """:meth:`step` on the groups it keeps."""
        algo = self.cfg.algo
        self.parallel.release()  # a gathered full state is about to go stale
        pad = self.policy.tokenizer.pad_token_id
        trajs = members(groups)
        host = collate(trajs, pad)
        # 1. credit: per-token advantages (computed on the host: per-trajectory Python work; a
        # value model runs on the policy's device); staleness age of every model token
        adv, metrics = self.credit.advantages(groups, host.ids, host.attn, host.mask)
        dev = self.policy.device
        b, adv = host.to(dev), adv.to(dev)
        age = torch.where(b.mask > 0, (version - b.versions).clamp(min=0), torch.zeros_like(b.versions))
        # 2. the first epoch's minibatches; proximal log-probs only when read; reference log-probs
        first = self._minibatches(len(trajs))
        with torch.no_grad():
            prox = self._proximal(b, first[0])
            ref = None
            if self.ref is not None and algo.kl_coef > 0:  # the reference is replicated on every rank
                ref = self._logprobs(partial(token_logprobs_and_entropy, self.ref.model), b)
        # 3. epochs x minibatches (one optimiser step each) with approximate-KL early stop; a
        # non-finite minibatch undoes the whole step
        self._gap_parts = []
        skipped, stopped = self._epochs(_Minibatch(b, adv, prox, ref, age), first, metrics)
        if not skipped:
            self.scheduler.step()
            metrics.update(self._record_gap(b, age, prox))
        metrics.update(self.credit.train_value(trajs, host.ids, host.attn, host.mask))  # 4. the value model
        ages = age[b.mask > 0].float()
        metrics.update(
            {
                "train/skipped": float(skipped),
                "train/early_stopped": float(stopped),
                "train/lr": float(self.scheduler.get_last_lr()[0]),
                "train/tokens": float(host.mask.sum()),
                "train/samples": float(len(trajs)),
                "staleness/mean": float(ages.mean()) if ages.numel() else 0.0,
                "staleness/max": float(ages.max()) if ages.numel() else 0.0,
                "length/mean_tokens": float(host.attn.sum(1).float().mean()),
            }
        )
        return metrics

    def _epochs(
        self, data: _Minibatch, first: list[torch.Tensor], metrics: dict[str, float]
    ) -> tuple[bool, bool]:
        """Run the epochs (``first``: epoch 0's minibatches); returns ``(skipped, early_stopped)``.

        A non-finite minibatch restores the snapshot taken here (when there is more than one
        optimiser step) and ends the step; the KL early stop compares with the proximal log-probs
        after every epoch but the last.
        """
        tc, b = self.cfg.trainer, data.b
        tensors = [*self.model.parameters(), *self.master.masters]
        snapshot = _Snapshot.take(tensors, self.optimizer) if len(first) * tc.epochs > 1 else None
        metrics["train/microbatches"] = 0.0
        for epoch in range(tc.epochs):
            for i, mb in enumerate(first if epoch == 0 else self._minibatches(b.ids.shape[0])):
                finite, pm = self._minibatch_step(data, mb, fill_prox=epoch == 0 and i == 0)
                if not finite:  # never step on a non-finite loss or gradient; undo earlier minibatches
                    if snapshot is not None:
                        snapshot.restore(tensors, self.optimizer)
                    return True, False
                for k in [k for k in pm if k.startswith("train/microbatches")]:  # counts add up
                    metrics[k] = metrics.get(k, 0.0) + pm.pop(k)
                metrics.update(pm)
            if tc.target_kl is not None and epoch < tc.epochs - 1:
                assert data.prox is not None  # needs_prox
                with torch.no_grad():
                    now = self._logprobs(self.parallel.scorer, b)
                kl_now = float(approx_kl(now, data.prox, b.mask))
                metrics["train/approx_kl"] = kl_now
                if kl_now > tc.target_kl:
                    return False, True
        return False, False

    # ---- helpers ------------------------------------------------------------------------------
    def _proximal(self, b: Batch, first: torch.Tensor) -> torch.Tensor | None:
        """Proximal log-probs ``[B, T]`` when something reads them (:attr:`needs_prox`), else ``None``.

        The rows of ``first`` (epoch 0's first minibatch) are left at 0: their gradient pass runs on
        the start weights and fills them in (:meth:`_minibatch_step`), so with one minibatch there is
        no extra pass at all.
        """
        if not self.needs_prox:
            return None
        keep = torch.ones(b.ids.shape[0], dtype=torch.bool)
        keep[first] = False
        return self._logprobs(self.parallel.scorer, b, torch.arange(b.ids.shape[0])[keep])

    def _minibatches(self, n: int) -> list[torch.Tensor]:
        """One epoch's minibatches: ``trainer.minibatches`` chunks of a random order (in order for one)."""
        n_mb = min(self.cfg.trainer.minibatches, n)
        order = torch.arange(n)
        return list(torch.chunk(order[torch.randperm(n)] if n_mb > 1 else order, n_mb))

    def _parts(self, b: Batch, rows: torch.Tensor) -> list[_Part]:
        """``rows`` cut into micro-batches by the token budget, each with its padded width.

        With ``trainer.share_prefixes`` and rows that share enough to save compute
        (:func:`~asyncrl.policy.packing.shared_microbatches`), rows sharing a prefix are kept together
        and each micro-batch is forwarded as one token trie.
        """
        budget = self.cfg.trainer.max_tokens_per_microbatch
        lengths = b.attn[rows].sum(1).cpu()
        cut = None
        if self.cfg.trainer.share_prefixes and can_chunk_logits(self.model):
            cut = shared_microbatches(b.ids[rows].cpu(), lengths, budget, decoder_layer_shape(self.model))
        parts = cut if cut is not None else microbatches(lengths, budget)
        return [_Part(rows[p], max(int(lengths[p].max()), 1), cut is not None) for p in parts]

    def _own(self, parts: list[_Part], backward: bool) -> list[int]:
        """Indices of the micro-batches this rank runs (``-1``: a padding pass, :meth:`_idle_part`)."""
        return self.parallel.own([len(p.rows) * p.width for p in parts], backward)

    def _idle_part(self, b: Batch, parts: list[_Part]) -> _Part:
        """A padding pass (a rank with fewer micro-batches than a collective needs): one row of the last
        (smallest) micro-batch — the one with the most loss tokens, so the loss reaches every unit and
        each runs its backward — weighted 0."""
        rows = parts[-1].rows
        row = rows[int(b.mask[rows].sum(1).argmax())].reshape(1)  # a row with loss tokens: a backward
        return _Part(row, max(int(b.attn[row].sum()), 1), False)

    def _score(
        self, score: Any, b: Batch, part: _Part, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) ``[len(rows), width]`` of a micro-batch under ``score`` (the
        parallelism's scorer of the policy, or the reference's), at its loss positions only (0
        elsewhere: nothing reads them, so the LM head never runs there)."""
        rows, width = part.rows, part.width
        return score(  # type: ignore[no-any-return]
            b.ids[rows, :width],
            b.attn[rows, :width],
            b.temperature[rows],
            with_entropy=with_entropy,
            chunk_tokens=self.cfg.trainer.logits_chunk_tokens,
            positions=self._positions(b, part),
            share_prefixes=part.shared,
        )

    def _positions(self, b: Batch, part: _Part) -> torch.Tensor | None:
        """The positions a micro-batch's scores are read at: its loss mask."""
        return b.mask[part.rows, : part.width] > 0

    def _logprobs(self, score: Any, b: Batch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Log-probs ``[B, T]`` of ``rows`` (all by default; 0 elsewhere), no grad, one micro-batch at a time."""
        out = torch.zeros_like(b.mask)
        rows = torch.arange(b.ids.shape[0]) if rows is None else rows
        parts = self._parts(b, rows.to(b.ids.device)) if rows.numel() else []
        for i in self._own(parts, backward=False):
            part = parts[i] if i >= 0 else self._idle_part(b, parts)
            lp = self._score(score, b, part, with_entropy=False)[0]
            if i >= 0:
                out[part.rows, : part.width] = lp
        return self.parallel.sum_(out)

    def _weights(self, d: _Minibatch, parts: list[_Part]) -> tuple[list[float], list[float]]:
        """Per-micro-batch weights of the policy term and of the token-mean terms (entropy, KL).

        The policy term aggregates over :func:`policy_loss_mask`, which with a divergence filter
        depends on the current log-probs: with more than one micro-batch they are computed first in
        a no-grad pass (one extra forward), so the normaliser is the whole minibatch's.
        """
        pl = self.cfg.algo.policy_loss
        masks = [d.b.mask[p.rows, : p.width] for p in parts]
        keep = masks
        if len(parts) > 1 and pl.max_behaviour_divergence is not None:
            with torch.no_grad():
                keep = [
                    policy_loss_mask(
                        self._score(self.parallel.scorer, d.b, p, False)[0],
                        d.b.behaviour[p.rows, : p.width],
                        m,
                        pl,
                    )
                    for p, m in zip(parts, masks, strict=True)
                ]
        return microbatch_weights(keep, pl.agg), microbatch_weights(masks, "token_mean")

    def _minibatch_step(
        self, d: _Minibatch, mb: torch.Tensor, fill_prox: bool
    ) -> tuple[bool, dict[str, float]]:
        """One optimiser step on rows ``mb``: accumulate micro-batch gradients, clip, step.

        ``fill_prox``: the weights are still the step's start weights (epoch 0's first minibatch), so
        the detached log-probs of this gradient pass ARE the proximal log-probs of ``mb``: they are
        used as such and written into ``d.prox`` (the pass before the epochs skipped these rows).
        Returns ``(finite, metrics)``; when the loss or the gradient norm is not finite the
        gradients are dropped and nothing is stepped.
        """
        tc, algo = self.cfg.trainer, self.cfg.algo
        # seq_mean_token_sum_norm divides by the padded length: the whole batch's, in every micro-batch
        pl = algo.policy_loss
        if pl.agg == "seq_mean_token_sum_norm" and pl.max_tokens is None:
            pl = pl.model_copy(update={"max_tokens": int(d.b.ids.shape[1])})
        parts = self._parts(d.b, mb)
        w_policy, w_tok = self._weights(d, parts)
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=d.b.ids.device)
        merged: list[tuple[dict[str, float], float, float]] = []  # one entry per micro-batch this rank ran
        own = self._own(parts, backward=True)
        for n, i in enumerate(own):
            part, wp, wt = (
                (parts[i], w_policy[i], w_tok[i]) if i >= 0 else (self._idle_part(d.b, parts), 0.0, 0.0)
            )
            with self.parallel.accumulate(last=n == len(own) - 1):
                loss, pm = self._micro_loss(d, part, pl, wp, wt, fill_prox and i >= 0)
                if loss.requires_grad:
                    loss.backward()  # type: ignore[no-untyped-call]
            if i >= 0:
                total = total + loss.detach()
                merged.append((pm, wp, wt))
        # the whole minibatch's loss, proximal log-probs (each rank filled its own rows) and metrics
        total, merged, split = self.parallel.reduce(total, merged)
        if fill_prox and d.prox is not None:
            d.prox[mb] = self.parallel.sum_(d.prox[mb])
        self.master.grads_in()  # bfloat16 gradients -> the float32 masters (none: nothing to do)
        grad_norm = self.parallel.clip(self.master.params, tc.grad_clip)
        if not (torch.isfinite(total) and torch.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            return False, {}
        self.optimizer.step()
        self.master.weights_out()  # the update, applied in float32, rounded into the working copy
        metrics = _merge_metrics(merged)
        metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/microbatches"] = float(len(parts))
        return True, metrics | split

    def _micro_loss(
        self, d: _Minibatch, part: _Part, pl: PolicyLossConfig, wp: float, wt: float, fill_prox: bool
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's weighted loss (policy + entropy bonus + KL penalty) and its metrics.

        Every score (log-probs, the entropies of ``entropy/mean`` and the entropy bonus) is taken at
        the loss positions alone.
        """
        algo = self.cfg.algo
        rows, w = part.rows, part.width
        logp, ent = self._score(self.parallel.scorer, d.b, part, with_entropy=True)
        assert ent is not None
        m = d.b.mask[rows, :w]
        prox = None if d.prox is None else d.prox[rows, :w]
        if fill_prox and d.prox is None:  # the start weights' log-probs against the sampler's (with
            # proximal log-probs the gap is taken from them, every row at once: _record_gap)
            self._gap_parts.append(gap_terms(d.b.behaviour[rows, :w], logp, (m > 0) & (d.age[rows, :w] == 0)))
        if fill_prox and d.prox is not None:
            prox = logp.detach()
            d.prox[rows, :w] = prox
        loss, pm = policy_loss(
            logp, d.b.behaviour[rows, :w], d.adv[rows, :w], m, pl, prox_logp=prox, age=d.age[rows, :w]
        )
        loss = wp * loss
        # the penalties are token means: ``wt`` (tokens of this micro-batch / tokens of the step) makes
        # their sum over micro-batches the step's token mean, whatever the policy loss's aggregation
        if algo.entropy_coef:
            el, em = entropy_loss(ent, m, algo.entropy_coef, "token_mean")
            loss, pm = loss + wt * el, {**pm, **em}
        if d.ref is not None:
            kl, km = kl_penalty_loss(logp, d.ref[rows, :w], m, algo.kl_coef, algo.kl_estimator, "token_mean")
            loss, pm = loss + wt * kl, {**pm, **km}
        pm["entropy/mean"] = float(masked_mean(ent.detach(), m))
        return loss, pm

    def _record_gap(self, b: Batch, age: torch.Tensor, prox: torch.Tensor | None) -> dict[str, float]:
        """The train-inference gap of this step (:mod:`asyncrl.algo.gap`), added to :attr:`gap`: the
        trainer's log-probs at the step's start weights against the sampler's, on the model tokens the
        sampler drew with those same weights (age 0; older tokens differ by the updates since). With
        proximal log-probs (every row at the start weights) all rows; else the rows of the first
        minibatch (all of them with ``trainer.minibatches: 1``), whose gradient pass ran on the start
        weights. Returns the step's figures (``gap/step_*``)."""
        if prox is not None:
            parts = [gap_terms(b.behaviour, prox, (b.mask > 0) & (age == 0))]
        else:
            parts = self._gap_parts
        self._gap_parts = []
        return self.gap.add(parts)
