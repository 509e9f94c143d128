"""Groups of episodes played offline, and what they show: the one group player of the offline jobs.

``asyncrl env signal`` (:mod:`asyncrl.jobs.env_signal`), the warm start's rollout rounds
(:mod:`asyncrl.jobs.warm_rollouts`) and the benchmarks (``bench/task_signal.py``, ``bench/rg_pick.py``)
play each task ``G`` times as evaluation plays (:func:`~asyncrl.rollout.heldout.run_episodes`: the
run's sampling settings, the built-in engine, latency and injected faults off) and count the groups
with :class:`Counts`: success ``p`` = successful episodes / episodes, **pass@G** = groups with at least
one success / groups, and the groups whose final rewards differ (those that carry a GRPO gradient).
An episode of several samples (``model.multi_turn: per_turn``) counts once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

from asyncrl.records import Task, Trajectory
from asyncrl.rollout.heldout import run_episodes

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.policy.model import Policy


@dataclass(frozen=True)
class Counts:
    """What a bucket's groups (or several buckets' groups) showed."""

    groups: int = 0
    differ: int = 0
    """Groups whose members' final rewards differ."""
    solved: int = 0
    """Groups with at least one success (pass@G's numerator)."""
    successes: int = 0
    episodes: int = 0

    def __add__(self, o: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(astuple(self), astuple(o), strict=True)))

    def rates(self) -> tuple[float, float]:
        """``(p, pass@G)``: successful episodes / episodes and solved groups / groups; nothing played:
        ``(0.0, 0.0)``."""
        if not self.episodes:
            return 0.0, 0.0
        return self.successes / self.episodes, self.solved / self.groups


def play(
    cfg: RunConfig,
    policy: Policy,
    tasks: list[Task],
    times: int,
    *,
    seed: int,
    temperature: float | None = None,
) -> list[Trajectory]:
    """Every task ``times`` times, concurrently: every sample, in task order. ``temperature`` replaces
    the run's sampling temperature."""
    repeated = [task for task in tasks for _ in range(times)]
    return asyncio.run(run_episodes(cfg, policy, repeated, seed=seed, temperature=temperature))


def play_groups(cfg: RunConfig, policy: Policy, tasks: list[Task], *, seed: int) -> list[list[Trajectory]]:
    """Each task played ``rollout.group_size`` times: the samples of each task's group, in task order."""
    trajs = play(cfg, policy, tasks, cfg.rollout.group_size, seed=seed)
    by_task: dict[int, list[Trajectory]] = defaultdict(list)
    index = {t.id: i for i, t in enumerate(tasks)}
    for t in trajs:
        by_task[index[t.task.id]].append(t)
    return [by_task[i] for i in range(len(tasks))]


def group_signal(groups: list[list[Trajectory]]) -> Counts:
    """What the groups showed; an episode of several samples counts once."""
    out = Counts()
    for samples in groups:
        ends = list({t.episode: t for t in samples}.values())
        if not ends:
            continue
        wins = sum(t.outcome == "success" for t in ends)
        out += Counts(1, len({t.final_reward for t in ends}) > 1, wins > 0, wins, len(ends))
    return out
