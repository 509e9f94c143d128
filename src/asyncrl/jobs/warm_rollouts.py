"""Warm start from the policy's own episodes: rejection-sampling fine-tuning (expert iteration).

``trainer.sft.source: rollouts`` (and ``auto`` once the environment's demonstrations, if any, are
learned). The rule, a round at a time (:class:`~asyncrl.config.trainer.RolloutSFTConfig`):

1. **Measure.** The current policy plays the first ``heldout_tasks`` held-out tasks ``G`` times each
   (``G = rollout.group_size``, the run's sampling settings): held-out success ``p`` (successful
   episodes / episodes) and **pass@G**, the share of those tasks with at least one success in their
   group of ``G`` — the tasks whose GRPO groups can carry a reward difference (played and counted by
   :mod:`asyncrl.jobs.groups`, as ``asyncrl env signal`` plays and counts its groups). Round 0 measures the
   starting policy (the base model, or the demonstrations' result under ``auto``).
2. **Stop** when pass@G reaches ``target_pass_at_g``, or after ``rounds`` rounds, or once
   ``max_minutes`` of rounds have passed.
3. **Play.** ``tasks_per_round`` training tasks (never held-out ones: the task source's split), each
   ``samples_per_task`` times, at round ``r``'s temperature (``temperatures``, the last repeating).
4. **Keep** the episodes the environment itself grades ``success`` — its own reward and outcome decide,
   nothing here re-scores — as token-exact samples: the ids the engine sampled and the renderer built
   (tool calls and observations included, observations masked out of the loss), at most
   ``keep_per_task`` distinct ones per task over all rounds. The kept set grows round by round.
5. **Fine-tune** the *starting* policy afresh on the whole kept set (ReST-EM's choice: no drift from
   fine-tuning a fine-tuned policy again on its own samples) for ``⌈epochs × kept / batch_size⌉``
   steps (at least 1, at most ``max_steps``; ``trainer.sft``'s batch size and learning rate), then go
   to 1.

The policy RL starts from is the round with the best held-out pass@G (on a tie, the better held-out
success; then the earliest): a round that made things worse is not kept. Episodes whose environment faulted (outcome ``env_error``:
a ``reset`` or tool that raised past the guard's retries) are counted and skipped, never kept.

What it cannot do: a task the policy never solves once in ``samples_per_task`` samples gives nothing
to keep — rounds cannot start from zero. ``asyncrl env signal`` then reports pass@k of 0 and names what
can work (demonstrations, a tool, an easier level).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch

from asyncrl.jobs.groups import group_signal, play, play_groups
from asyncrl.records import Trajectory
from asyncrl.rollout.heldout import heldout_tasks

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncrl.config import RunConfig
    from asyncrl.envs.base import TaskSource
    from asyncrl.policy.model import Policy

Sample = tuple[list[int], list[int]]
"""(token ids, loss mask): one SFT sample."""


@dataclass
class RoundReport:
    """One round of the rollouts warm start (round 0: the starting policy, measured only)."""

    round: int
    heldout_success: float
    """Successful held-out episodes / episodes (``heldout_tasks`` tasks × G)."""
    heldout_pass_at_g: float
    """Share of those held-out tasks with ≥ 1 success in their group of G."""
    temperature: float | None
    """The round's sampling temperature (``None``: round 0 plays no training task)."""
    tasks: int
    episodes: int
    tasks_with_success: int
    """Training tasks with ≥ 1 successful episode of ``samples_per_task``."""
    kept: int
    """SFT samples this round added to the kept set (distinct successful episodes, at most
    ``keep_per_task`` a task over all rounds)."""
    kept_total: int
    """The kept set the round fine-tuned on."""
    steps: int
    """Its optimiser steps."""
    faulted: int
    """Episodes whose environment faulted (skipped, never kept)."""
    round_seconds: float


@dataclass
class RolloutsReport:
    """Every round, which one RL starts from, and why the rounds stopped."""

    group_size: int
    target_pass_at_g: float
    rounds: list[RoundReport] = field(default_factory=list)
    best_round: int = 0
    stopped: str = ""
    """``target`` (pass@G reached the target), ``rounds``, ``minutes`` (the budget) or ``no_rounds``."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def episodes_of(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    """Samples by episode (``multi_turn: per_turn`` episodes are several samples), in order."""
    out: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        out[t.episode].append(t)
    return out


def keep_successes(
    trajs: list[Trajectory], per_task: int, seen: dict[str, set[tuple[int, ...]]] | None = None
) -> tuple[list[Sample], int, int]:
    """The SFT samples of successful episodes not in ``seen`` (task id → the token sequences kept so far,
    updated), at most ``per_task`` distinct episodes a task; also the number of tasks of ``trajs`` with a
    success and of faulted episodes."""
    kept: list[Sample] = []
    seen = defaultdict(set) if seen is None else seen
    solved: set[str] = set()
    faulted = 0
    for samples in episodes_of(trajs).values():
        first = samples[0]
        faulted += first.outcome == "env_error"
        key = tuple(i for s in samples for i in s.token_ids())
        if first.outcome != "success":
            continue
        solved.add(first.task.id)
        distinct = seen.setdefault(first.task.id, set())
        if key in distinct or len(distinct) >= per_task:
            continue
        distinct.add(key)
        kept.extend((s.token_ids(), s.loss_mask()) for s in samples)
    return kept, len(solved), faulted


class _Snapshot:
    """The trainable parameters of a round (LoRA: the adapter), to return to the best round."""

    def __init__(self, policy: Policy) -> None:
        self.params = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}

    def restore(self, policy: Policy) -> None:
        with torch.no_grad():
            for n, p in policy.model.named_parameters():
                if n in self.params:
                    p.copy_(self.params[n])


def rollout_rounds(
    cfg: RunConfig,
    policy: Policy,
    source: TaskSource,
    fine_tune: Callable[[list[Sample], int], object],
    say: Callable[[str], None] = lambda _: None,
) -> RolloutsReport:
    """Run the rounds of the module docstring on ``policy`` (in place: it ends as the best round's),
    fine-tuning with ``fine_tune(samples, steps)``; ``say`` gets one line per round."""
    rc = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).rollouts
    rounds = rc.rounds or 0
    g, seed = cfg.rollout.group_size, cfg.trainer.sft.seed
    held = heldout_tasks(cfg, rc.heldout_tasks)
    report = RolloutsReport(group_size=g, target_pass_at_g=rc.target_pass_at_g)
    start = time.monotonic()

    def measure(r: int) -> tuple[float, float]:
        return group_signal(play_groups(cfg, policy, held, seed=seed + 7919 * r)).rates()

    best = RoundReport(0, *measure(0), None, 0, 0, 0, 0, 0, 0, 0, 0.0)
    start_params = snapshot = _Snapshot(policy)
    kept: list[Sample] = []
    seen: dict[str, set[tuple[int, ...]]] = {}
    batch = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).batch_size
    report.rounds.append(best)
    say(_line(best, g))
    rng = random.Random(seed + 2)
    for r in range(1, rounds + 1):
        if best.heldout_pass_at_g >= rc.target_pass_at_g:
            report.stopped = "target"
            break
        if time.monotonic() - start > 60 * rc.max_minutes:
            report.stopped = "minutes"
            break
        t0, temperature = time.monotonic(), rc.temperature(r - 1)
        tasks = [source.sample(rng) for _ in range(rc.tasks_per_round)]
        played = play(
            cfg, policy, tasks, rc.samples_per_task, seed=seed + 104729 * r, temperature=temperature
        )
        new, solved, faulted = keep_successes(played, rc.keep_per_task, seen)
        kept += new
        steps = min(rc.max_steps, max(1, math.ceil(rc.epochs * len(kept) / batch))) if kept else 0
        if new:  # the starting policy, fine-tuned afresh on everything kept so far
            start_params.restore(policy)
            fine_tune(kept, steps)
        episodes = len(tasks) * rc.samples_per_task
        row = RoundReport(
            r,
            *measure(r),
            temperature,
            len(tasks),
            episodes,
            solved,
            len(new),
            len(kept),
            steps,
            faulted,
            0.0,
        )
        row.round_seconds = time.monotonic() - t0
        report.rounds.append(row)
        say(_line(row, g))
        if (row.heldout_pass_at_g, row.heldout_success) > (best.heldout_pass_at_g, best.heldout_success):
            best, snapshot = row, _Snapshot(policy)
    else:
        report.stopped = "rounds" if rounds else "no_rounds"
    if report.stopped != "target" and best.heldout_pass_at_g >= rc.target_pass_at_g:
        report.stopped = "target"
    snapshot.restore(policy)
    report.best_round = best.round
    return report


def _line(row: RoundReport, g: int) -> str:
    head = f"warm start (rollouts) round {row.round}"
    if row.round == 0:
        head += " (start)"
    else:
        head += (
            f": {row.tasks_with_success}/{row.tasks} tasks with a success at T={row.temperature:g}, "
            f"{row.kept} samples kept ({row.kept_total} in all, {row.steps} steps), {row.faulted} faulted episodes"
        )
    return f"{head}; held-out success {row.heldout_success:.1%}, pass@{g} {row.heldout_pass_at_g:.1%}"
