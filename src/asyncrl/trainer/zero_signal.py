"""Groups without a reward difference: which the learner is spared (``trainer.skip_equal_reward_groups``).

A group **has a reward difference** when the final rewards of its episodes (one sample per episode:
:meth:`~asyncrl.records.Group.episode_heads`) are not all equal (:mod:`asyncrl.learning_signal`). With a group
baseline (GRPO and its kin, :func:`asyncrl.algo.group_advantages`) every member of a group without one
gets advantage exactly 0 — singleton groups included — so the group adds nothing to the policy term
but its tokens to the normaliser, and its entropy and KL terms. The trainer consumes a batch whole
(every sample's fate is ``trained`` at the step that took it, acknowledged after the checkpoint that
covers the step, as for any trained sample), but forwards only the groups with a difference; a batch
with none takes no optimiser step (no forward, no NaN from an empty normaliser) and the step still
counts. The cost ledger books the left-out groups as ``zero_advantage`` waste: their generation, not
training they never had (:class:`Split`).

Not in a trainer group (``trainer.world_size > 1``): the ranks share a batch's groups, and a rank whose
share the filter emptied would sit out the step's collectives while the others wait for it (the group
times out and restarts), so a group trains every group, as before the filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncrl.config import RunConfig
from asyncrl.records import Group


def differs(group: Group) -> bool:
    """Whether the episodes of ``group`` were not all rewarded alike (module docstring)."""
    return len({t.final_reward for t in group.episode_heads()}) > 1


def zero_for_equal_rewards(cfg: RunConfig) -> bool:
    """Whether the run's credit assignment gives a group without a reward difference zero advantage:
    ``credit.strategy: outcome`` with a group baseline (``batch_mean`` centres on the whole batch, and
    the other strategies add per-turn or critic terms that differ even where the outcomes do not)."""
    return cfg.credit.strategy == "outcome" and cfg.credit.baseline != "batch_mean"


@dataclass
class Split:
    """A batch cut into the groups the learner trains on and those left out of the gradient."""

    kept: list[Group] = field(default_factory=list)
    left_out: list[Group] = field(default_factory=list)

    @classmethod
    def of(cls, batch: Sequence[Group], cfg: RunConfig) -> Split:
        """``batch`` as ``trainer.skip_equal_reward_groups`` cuts it (everything kept when off, or when
        the credit strategy gives such groups an advantage)."""
        if (
            not (cfg.trainer.skip_equal_reward_groups and zero_for_equal_rewards(cfg))
            or cfg.trainer.world_size > 1
        ):
            return cls(list(batch), [])
        out = cls()
        for g in batch:
            (out.kept if differs(g) else out.left_out).append(g)
        return out

    def metrics(self) -> dict[str, float]:
        """``train/zero_signal_groups`` and ``train/zero_signal_samples``: what this step left out."""
        return {
            "train/zero_signal_groups": float(len(self.left_out)),
            "train/zero_signal_samples": float(sum(len(g.members) for g in self.left_out)),
        }
