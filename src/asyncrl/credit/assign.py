"""Credit assignment for a training batch: trajectories in, per-token advantages out.

:class:`CreditAssigner` is what the learner calls. It dispatches on ``credit.strategy``
(formulas in ``docs/credit.md``; the maths lives in :mod:`asyncrl.algo`):

* ``outcome`` / ``process`` — :mod:`asyncrl.credit.outcome`.
* ``value_delta`` — segment ``k`` of trajectory ``i`` gets ``n_i · c_k + α (G_k − Ḡ)`` where
  ``c = value_delta_credit(V(before), V(after), A_i)`` sums to the outcome advantage ``A_i``
  (so a constant value model reproduces ``outcome``), ``G_k`` is the process reward-to-go
  and ``Ḡ`` its batch mean. The terminal ``V(after last)`` is the observed final reward.
* ``gae`` — GAE(γ, λ) with the value model as critic, over segments (``gae_level: turn``) or
  model tokens (``token``); rewards: ``α p_k`` at the end of turn ``k`` plus the final reward at
  the end of the last turn. No outcome baseline: the critic is the baseline.
* ``tree`` — :mod:`asyncrl.credit.tree`: segments are edges of the group's tree of conversation
  states; segment ``k`` gets ``L_i · spread(node_k) + α (G_k − Ḡ)``, the change in Monte-Carlo
  success probability it caused (an unbranched group reproduces ``outcome``).
* ``turn_group`` — GiGPO: ``A_i + ω A^S`` where step groups are turns of one task group whose
  exact preceding context is identical, and ``A^S`` normalises the step returns
  ``G_k = γ^{n−1−k} R + α Σ_{j≥k} γ^{j−k} p_j`` within a step group.

Every model token of a segment gets the segment's advantage (token-level GAE excepted).
``last_groups`` keeps the batch's per-segment records for the credit sample files, and the
value model (when the strategy needs one) is trained by :meth:`train_value` after the policy step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncrl.algo import brier_score, gae, roc_auc, turn_group_advantages, turn_level_gae, value_delta_credit
from asyncrl.config import RunConfig, TrainerConfig, default_of
from asyncrl.credit.outcome import process_to_go, reward_to_go, sequence_advantages, token_advantages
from asyncrl.credit.samples import CreditGroup, CreditSample, CreditSampleFile, SegmentCredit, write_samples
from asyncrl.credit.tree import tree_segment_advantages
from asyncrl.records import Group, Trajectory, members

if TYPE_CHECKING:
    from asyncrl.policy.model import Policy

VALUE_STRATEGIES = ("gae", "value_delta")
VALUE_DIR = "credit/value"


def segment_spans(traj: Trajectory) -> list[tuple[int, int, int, float]]:
    """``(start, model_end, end, process_reward)`` of each segment: model tokens are ``[start, model_end)``."""
    out: list[tuple[int, int, int, float]] = []
    pos = 0
    for turn in traj.turns:
        n = len(turn.token_ids)
        if turn.role == "model":
            out.append((pos, pos + n, pos + n, max(-1.0, min(1.0, turn.process_reward))))
        elif turn.role == "tool" and out:
            s, me, _, p = out[-1]
            out[-1] = (s, me, pos + n, p)
        pos += n
    return [s for s in out if s[1] > s[0]]


def _whole_groups(groups: list[CreditGroup], n: int, rng: random.Random) -> list[CreditGroup]:
    """Random groups, whole, until at least ``n`` samples (at least one group)."""
    order = list(range(len(groups)))
    rng.shuffle(order)
    out: list[CreditGroup] = []
    for g in order:
        if out and sum(len(o.samples) for o in out) >= n:
            break
        out.append(groups[g])
    return out


def _some_members(groups: list[CreditGroup], n: int, rng: random.Random) -> list[CreditGroup]:
    """``n`` samples drawn at random from all the groups' members, each kept in its group (batch order)."""
    total = sum(len(g.samples) for g in groups)
    drawn = set(rng.sample(range(total), min(n, total)))
    out: list[CreditGroup] = []
    first = 0
    for g in groups:
        kept = [s for j, s in enumerate(g.samples, first) if j in drawn]
        first += len(g.samples)
        if kept:
            out.append(CreditGroup(id=g.id, samples=kept))
    return out


class CreditAssigner:
    def __init__(self, cfg: RunConfig, policy: Policy) -> None:
        from asyncrl.credit.value import ValueModel

        self.cfg = cfg.credit
        self.value = (
            ValueModel(self.cfg.value, policy, cfg.model.family, cfg.seed)
            if self.cfg.strategy in VALUE_STRATEGIES
            else None
        )
        self.last_groups: list[CreditGroup] = []
        """The last batch's per-segment records, group by group (the credit sample files)."""
        self.whole_groups = self.cfg.strategy == "tree" or cfg.rollout.tree.enabled
        """Sample whole groups: ``credit show`` draws their trees, ``credit ablate --siblings`` compares
        their branches."""
        self._old_values: torch.Tensor | None = None
        self._tree_values: list[list[tuple[float, float]]] = []
        """``tree``: the measured success probability before and after each segment of the batch."""

    # -- advantages ----------------------------------------------------------------------------
    def advantages(
        self, groups: Sequence[Group], ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token advantages ``[B, T]`` of the groups' members (rows group by group; zero off model
        tokens) and ``adv/``, ``credit/``, ``value/`` metrics."""
        c = self.cfg
        B, T = ids.shape
        trajs = members(groups)
        spans = [segment_spans(t) for t in trajs]
        values = self.value.predict(ids, attn) if self.value is not None else None
        self._old_values = values
        if c.strategy in ("outcome", "process"):
            adv, metrics = token_advantages(groups, T, c)
            seq_adv = None
        else:
            seq_adv, metrics = sequence_advantages(groups, c)
            adv = torch.zeros(B, T)
            if c.strategy == "gae" and c.gae_level == "token":
                assert values is not None
                adv = self._token_gae(trajs, spans, values, mask)
            else:
                seg_adv, m = self._segment_advantages(groups, spans, values, seq_adv)
                metrics.update(m)
                for i, sp in enumerate(spans):
                    for k, (s, me, _, _) in enumerate(sp):
                        adv[i, s:me] = seg_adv[i][k]
        adv = torch.where(mask > 0, adv, torch.zeros_like(adv))
        if values is not None:
            metrics.update(self._calibration(trajs, spans, values))
        records = iter(self._records(trajs, spans, values, adv, seq_adv))
        self.last_groups = [CreditGroup(id=g.id, samples=[next(records) for _ in g.members]) for g in groups]
        return adv, metrics

    def _segment_advantages(
        self,
        groups: Sequence[Group],
        spans: list[list[tuple[int, int, int, float]]],
        values: torch.Tensor | None,
        seq_adv: torch.Tensor,
    ) -> tuple[list[list[float]], dict[str, float]]:
        c = self.cfg
        trajs = members(groups)
        B, K = len(trajs), max((len(s) for s in spans), default=0)
        seg_mask = torch.zeros(B, K, dtype=torch.bool)
        v_before, v_after = torch.zeros(B, K), torch.zeros(B, K)
        proc = torch.zeros(B, K)
        for i, sp in enumerate(spans):
            for k, (s, _, e, p) in enumerate(sp):
                seg_mask[i, k] = True
                proc[i, k] = p
                if values is not None:
                    v_before[i, k] = values[i, max(s - 1, 0)]
                    last = k == len(sp) - 1
                    v_after[i, k] = trajs[i].final_reward if last else values[i, e - 1]
        mode = "dr_grpo" if c.baseline == "batch_mean" else c.baseline
        if c.strategy in ("value_delta", "tree"):  # + the process rewards to go
            if c.strategy == "value_delta":
                credits, metrics = value_delta_credit(
                    v_before, v_after, seq_adv, seg_mask, c.value_delta_eps, c.value_delta_min_ratio
                )
                base = (credits * seg_mask.sum(1, keepdim=True).float()).tolist()
            else:
                tree = tree_segment_advantages(groups, spans, mode)
                self._tree_values, base, metrics = tree.values, tree.advantages, tree.metrics
            extra, _ = process_to_go([[p for *_, p in sp] for sp in spans], c)
            return [[base[i][k] + extra[i][k] for k in range(len(sp))] for i, sp in enumerate(spans)], metrics
        if c.strategy == "gae":
            rewards = c.process_weight * proc
            for i, sp in enumerate(spans):
                if sp:
                    rewards[i, len(sp) - 1] += trajs[i].final_reward
            a, _ = turn_level_gae(rewards, v_before, seg_mask, c.gamma, c.gae_lambda)
            return [a[i, : len(sp)].tolist() for i, sp in enumerate(spans)], {
                "credit/gae_adv_mean": float(a[seg_mask].mean()) if seg_mask.any() else 0.0
            }
        # turn_group
        keys: dict[str, int] = {}
        owner, returns, states = [], [], []
        for i, (t, sp) in enumerate(zip(trajs, spans, strict=True)):
            n_seg = len(sp)
            proc_rtg = reward_to_go([p for *_, p in sp], c.gamma)
            for k, digest in enumerate(t.state_keys([s for s, *_ in sp])):  # the state before turn k
                states.append(keys.setdefault(digest, len(keys)))
                owner.append(i)
                returns.append(c.gamma ** (n_seg - 1 - k) * t.final_reward + c.process_weight * proc_rtg[k])
        if not owner:
            return [[] for _ in spans], {}
        adv, metrics = turn_group_advantages(
            seq_adv[torch.tensor(owner)],
            torch.tensor(returns),
            torch.tensor(states),
            mode,
            c.turn_group_weight,
        )
        out: list[list[float]] = [[] for _ in spans]
        for j, i in enumerate(owner):
            out[i].append(float(adv[j]))
        return out, metrics

    def _token_gae(
        self,
        trajs: list[Trajectory],
        spans: list[list[tuple[int, int, int, float]]],
        values: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        c = self.cfg
        B, T = mask.shape
        v_tok = torch.zeros(B, T)
        v_tok[:, 1:] = values[:, :-1]  # value of the state before token t
        rewards = torch.zeros(B, T)
        for i, sp in enumerate(spans):
            for k, (_, me, _, p) in enumerate(sp):
                rewards[i, me - 1] += c.process_weight * p
                if k == len(sp) - 1:
                    rewards[i, me - 1] += trajs[i].final_reward
        a, _ = gae(rewards, v_tok, mask, c.gamma, c.gae_lambda)
        return a

    def _calibration(
        self, trajs: list[Trajectory], spans: list[list[tuple[int, int, int, float]]], values: torch.Tensor
    ) -> dict[str, float]:
        """Brier score and AUC of the values at segment boundaries for the episode's success.

        Measured before the value model trains on this batch, so these segments are held out.
        """
        probs, labels = [], []
        for i, sp in enumerate(spans):
            y = 1.0 if trajs[i].outcome == "success" else 0.0
            for s, *_ in sp:
                probs.append(float(values[i, max(s - 1, 0)]))
                labels.append(y)
        p, y_t = torch.tensor(probs), torch.tensor(labels)
        out = {"value/brier": brier_score(p, y_t), "value/segments": float(len(probs))}
        auc = roc_auc(p, y_t)
        if auc == auc:  # undefined (nan) when the batch has a single class
            out["value/auc"] = auc
        if probs:
            out["value/mean"] = float(p.mean())
        return out

    def _records(
        self,
        trajs: list[Trajectory],
        spans: list[list[tuple[int, int, int, float]]],
        values: torch.Tensor | None,
        adv: torch.Tensor,
        seq_adv: torch.Tensor | None,
    ) -> list[CreditSample]:
        out = []
        for i, (t, sp) in enumerate(zip(trajs, spans, strict=True)):
            segs = []
            for k, (s, me, e, p) in enumerate(sp):
                vb = va = None
                if values is not None:
                    vb = float(values[i, max(s - 1, 0)])
                    va = float(t.final_reward) if k == len(sp) - 1 else float(values[i, e - 1])
                elif self.cfg.strategy == "tree":
                    vb, va = self._tree_values[i][k]
                segs.append(
                    SegmentCredit(
                        start=s,
                        end=e,
                        process_reward=p,
                        v_before=vb,
                        v_after=va,
                        credit=float(adv[i, s:me].mean()),
                    )
                )
            oa = float(seq_adv[i]) if seq_adv is not None else float(adv[i, sp[0][0]]) if sp else 0.0
            out.append(CreditSample(trajectory=t, segments=segs, outcome_advantage=oa))
        return out

    # -- value model ---------------------------------------------------------------------------
    def train_value(
        self, trajs: list[Trajectory], ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, float]:
        """Train the value model on the batch: every position before a model token → final reward."""
        if self.value is None:
            return {}
        vmask = torch.zeros_like(mask)
        vmask[:, :-1] = mask[:, 1:]
        targets = torch.tensor([t.final_reward for t in trajs], dtype=torch.float32)[:, None].expand_as(mask)
        old = self._old_values if self._old_values is not None else self.value.predict(ids, attn)
        return self.value.train(ids, attn, vmask, targets, old)

    # -- files -----------------------------------------------------------------------------------
    def write_samples(self, run_dir: Path, step: int, rng: random.Random) -> Path | None:
        c = self.cfg
        if not c.sample_every or not self.last_groups:
            return None
        pick = _whole_groups if self.whole_groups else _some_members
        picked = pick(self.last_groups, c.sample_size, rng)
        return write_samples(
            run_dir, CreditSampleFile(step=step, strategy=c.strategy, groups=picked, whole=self.whole_groups)
        )

    def save_value(
        self, run_dir: Path, step: int, keep: int = default_of(TrainerConfig, "keep_checkpoints")
    ) -> None:
        if self.value is None:
            return
        folder = Path(run_dir) / VALUE_DIR
        self.value.save(folder / f"step_{step:08d}.safetensors")
        for old in sorted(folder.glob("step_*.safetensors"))[:-keep]:
            old.unlink(missing_ok=True)

    def load_value(self, run_dir: Path, step: int) -> None:
        """Restore the newest saved value model not newer than ``step`` (a resume)."""
        if self.value is None:
            return
        found = [
            p
            for p in sorted((Path(run_dir) / VALUE_DIR).glob("step_*.safetensors"))
            if int(p.stem.split("_")[1]) <= step
        ]
        if found:
            self.value.load(found[-1])
