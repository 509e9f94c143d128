"""The learner: one training step on a batch of trajectories.

A step: collate (right-padded tensors) → advantages (credit) → proximal log-probs under the
weights at the start of the step → epochs × minibatches of the unified policy loss with the
staleness age of every token → approximate-KL early stop → gradient clip → optimiser and LR
schedule step. A step whose loss or gradients are not finite anywhere is undone as a whole and
reported; the caller never publishes it. With one optimiser step per learner step the check comes
before ``optimizer.step`` and costs nothing; with several (``minibatches × epochs > 1``) earlier
minibatches may already have stepped, so the weights and the optimiser state are snapshotted at
the start of the step (one device copy of each) and restored on the first non-finite minibatch.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.algo import approx_kl, entropy_loss, kl_penalty_loss, masked_mean, policy_loss
from asyncrl.config import RunConfig
from asyncrl.credit.assign import CreditAssigner
from asyncrl.policy.model import token_logprobs_and_entropy
from asyncrl.records import Trajectory


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T] long
    attn: torch.Tensor  # [B, T] 0/1
    mask: torch.Tensor  # [B, T] float, 1 on model tokens
    behaviour: torch.Tensor  # [B, T] behaviour log-probs (0 elsewhere)
    versions: torch.Tensor  # [B, T] policy version per token (-1 elsewhere)
    temperature: torch.Tensor  # [B]

    @property
    def tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device) -> Batch:
        """The same batch on ``device`` (one copy per tensor; ``Tensor.to`` copies nothing on the same device)."""
        ids, attn, mask, behaviour, versions, temperature = (
            t.to(device, non_blocking=True)
            for t in (self.ids, self.attn, self.mask, self.behaviour, self.versions, self.temperature)
        )
        return Batch(ids, attn, mask, behaviour, versions, temperature)


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


@dataclass
class _Snapshot:
    """The policy's weights and optimiser state at the start of a step, to undo it."""

    params: list[torch.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def take(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> _Snapshot:
        params = [p.detach().clone() for p in model.parameters()]
        return cls(params, copy.deepcopy(optimizer.state_dict()))

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for p, saved in zip(model.parameters(), self.params, strict=True):
                p.copy_(saved)
        optimizer.load_state_dict(self.optimizer)


class Learner:
    """Owns the policy's optimiser and LR schedule; ``step`` trains on one batch."""

    def __init__(self, cfg: RunConfig, policy: Any, ref_policy: Any | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.model = policy.model
        self.ref = ref_policy
        tc = cfg.trainer
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapter alone
        self.optimizer = torch.optim.AdamW(trainable, lr=tc.lr, weight_decay=tc.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.credit = CreditAssigner(cfg, policy)  # owns the value model, when the strategy uses one
        self.model.train()

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

    def step(self, trajs: list[Trajectory], version: int) -> dict[str, float]:
        """Train on ``trajs`` at weight ``version``; returns metrics (``train/skipped`` = 1 if not finite)."""
        tc, algo = self.cfg.trainer, self.cfg.algo
        pad = self.policy.tokenizer.pad_token_id
        host = collate(trajs, pad)
        # 1. credit: per-token advantages (computed on the host: per-trajectory Python work; a
        # value model runs on the policy's device); staleness age of every model token
        adv, metrics = self.credit.advantages(trajs, host.ids, host.attn, host.mask)
        dev = self.policy.device
        b, adv = host.to(dev), adv.to(dev)
        age = torch.where(b.mask > 0, (version - b.versions).clamp(min=0), torch.zeros_like(b.versions))
        # 2. proximal log-probs: the weights at the start of this step (decoupled PPO, KL early stop)
        with torch.no_grad():
            prox, _ = token_logprobs_and_entropy(self.model, b.ids, b.attn, b.temperature, with_entropy=False)
            ref = None
            if self.ref is not None and algo.kl_coef > 0:
                ref, _ = token_logprobs_and_entropy(
                    self.ref.model, b.ids, b.attn, b.temperature, with_entropy=False
                )
        # 3. epochs x minibatches with approximate-KL early stop; a non-finite minibatch undoes the step
        order = torch.arange(len(trajs))
        n_mb = min(tc.minibatches, len(trajs))
        snapshot = _Snapshot.take(self.model, self.optimizer) if n_mb * tc.epochs > 1 else None
        skipped = stopped = 0
        for _epoch in range(tc.epochs):
            for mb in torch.chunk(order[torch.randperm(len(order))] if n_mb > 1 else order, n_mb):
                logp, ent = token_logprobs_and_entropy(self.model, b.ids[mb], b.attn[mb], b.temperature[mb])
                m = b.mask[mb]
                loss, pm = policy_loss(
                    logp, b.behaviour[mb], adv[mb], m, algo.policy_loss, prox_logp=prox[mb], age=age[mb]
                )
                if algo.entropy_coef and ent is not None:
                    el, em = entropy_loss(ent, m, algo.entropy_coef)
                    loss, pm = loss + el, {**pm, **em}
                if ref is not None:
                    kl, km = kl_penalty_loss(logp, ref[mb], m, algo.kl_coef, algo.kl_estimator)
                    loss, pm = loss + kl, {**pm, **km}
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
                if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
                    skipped = 1  # never step on a non-finite loss or gradient; undo earlier minibatches
                    self.optimizer.zero_grad(set_to_none=True)
                    if snapshot is not None:
                        snapshot.restore(self.model, self.optimizer)
                    break
                self.optimizer.step()
                metrics.update(pm)
                metrics["train/grad_norm"] = float(grad_norm)
                if ent is not None:
                    metrics["entropy/mean"] = float(masked_mean(ent.detach(), m))
            if skipped:
                break
            if tc.target_kl is not None:
                with torch.no_grad():
                    now, _ = token_logprobs_and_entropy(
                        self.model, b.ids, b.attn, b.temperature, with_entropy=False
                    )
                kl_now = float(approx_kl(now, prox, b.mask))
                metrics["train/approx_kl"] = kl_now
                if kl_now > tc.target_kl:
                    stopped = 1
                    break
        if not skipped:
            self.scheduler.step()
        metrics.update(self.credit.train_value(trajs, host.ids, host.attn, host.mask))  # 4. the value model
        ages = age[b.mask > 0].float()
        metrics.update(
            {
                "train/skipped": float(skipped > 0),
                "train/early_stopped": float(stopped),
                "train/lr": float(self.scheduler.get_last_lr()[0]),
                "train/tokens": float(host.tokens),
                "train/samples": float(len(trajs)),
                "staleness/mean": float(ages.mean()) if ages.numel() else 0.0,
                "staleness/max": float(ages.max()) if ages.numel() else 0.0,
                "reward/mean": float(sum(t.final_reward for t in trajs) / len(trajs)),
                "reward/success_rate": sum(t.outcome == "success" for t in trajs) / len(trajs),
                "length/mean_tokens": float(host.attn.sum(1).float().mean()),
            }
        )
        return metrics
