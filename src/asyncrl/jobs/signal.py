"""``asyncrl env signal CONFIG``: can this run learn? Signal per bucket before a step is trained.

For the config's model and environment it plays, for every bucket (task type × difficulty) of the task
source, the first ``tasks`` held-out tasks of that bucket, each ``rollout.group_size`` times as one group
(the rollout sampling settings, the built-in engine, seed ``cfg.seed``; latency and faults off, as
``asyncrl eval`` plays), twice: with the **base** policy (``model.path``, or the freshly initialised
built model) and with the **warm start** the run would begin from (``trainer.sft``; cached under
``cache_dir`` and shared with ``asyncrl sft`` and ``asyncrl train``; skipped when it trains no steps).

Per bucket and policy it reports held-out success ``p``, the measured share of groups whose rewards
differ (the groups that carry a GRPO gradient), the expected share ``s(p, G) = 1 − p^G − (1 − p)^G``
for binary rewards (:mod:`asyncrl.signal`), the band verdict against ``orchestrator.signal.band_low`` /
``band_high`` and what to change. The run can learn when at least one bucket of the policy RL starts
from has groups with a reward difference; the command exits 1 when none has.

``bench/task_signal.py`` times the same groups (:func:`play_groups`) with one learner step on them.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.control.buckets import bucket_of, buckets_of_source
from asyncrl.envs import make_task_source
from asyncrl.records import Task, Trajectory
from asyncrl.rollout.heldout import run_episodes
from asyncrl.signal import advice, fmt_share, share_or_none, signal_share, verdict

if TYPE_CHECKING:
    from rich.progress import Progress

    from asyncrl.policy.model import Policy


@dataclass
class BucketSignal:
    """One bucket under one policy: success, measured and expected shares of groups with a difference."""

    bucket: str
    groups: int
    differ: int
    """Groups whose members' final rewards differ."""
    episodes: int
    success: float | None
    """Successful episodes / episodes (``None``: the held-out split has no task of this bucket)."""
    signal_share: float | None
    """``differ / groups``."""
    expected_share: float | None
    """``s(success, group_size)``: what binary rewards would give at this success."""
    verdict: str
    advice: str


@dataclass
class PolicySignal:
    name: str
    """``base`` or ``warm start``."""
    buckets: list[BucketSignal]
    seconds: float

    def share(self) -> float | None:
        """Groups with a reward difference over every bucket."""
        return share_or_none(sum(b.differ for b in self.buckets), sum(b.groups for b in self.buckets))


@dataclass
class SignalReport:
    config: str
    group_size: int
    tasks_per_bucket: int
    band: tuple[float, float]
    policies: list[PolicySignal] = field(default_factory=list)
    warm_start: str = ""
    """Where the warm start came from (``cached``, ``trained in Ns``) or why there is none."""

    @property
    def start(self) -> PolicySignal:
        """The policy RL starts from: the warm start when there is one."""
        return self.policies[-1]

    @property
    def learnable(self) -> list[str]:
        """Buckets of the starting policy in the learnable band."""
        return [b.bucket for b in self.start.buckets if b.verdict == "learnable"]

    @property
    def ok(self) -> bool:
        """Some bucket of the starting policy had groups with a reward difference."""
        return any((b.signal_share or 0.0) > 0.0 for b in self.start.buckets)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "learnable": self.learnable, "ok": self.ok}

    def render(self) -> str:
        """The table and verdict ``asyncrl env signal`` prints."""
        lo, hi = self.band
        lines = [
            f"learning signal of {self.config}: group_size {self.group_size}, {self.tasks_per_bucket} held-out "
            f"task(s) per bucket, learnable band {lo:.0%}-{hi:.0%} success; warm start {self.warm_start}",
            f"{'policy':<11} {'bucket':<22} {'groups':>6} {'success':>8} {'differ':>7} {'expected':>9}  verdict",
        ]
        for pol in self.policies:
            for b in pol.buckets:
                lines.append(
                    f"{pol.name:<11} {b.bucket:<22} {b.groups:>6} {fmt_share(b.success):>8} "
                    f"{fmt_share(b.signal_share):>7} {fmt_share(b.expected_share):>9}  {b.verdict}"
                )
            lines.append(f"{pol.name:<11} {'all':<22} {'':>6} {'':>8} {fmt_share(pol.share()):>7}")
        lines.append(f"advice ({self.start.name}, where RL starts):")
        lines += [f"  {b.bucket}: {b.advice}" for b in self.start.buckets]
        if self.ok:
            band = ", ".join(self.learnable) or "none (signal outside the band only)"
            lines.append(f"verdict: the run can learn; buckets in the learnable band: {band}")
        else:
            lines.append(
                "verdict: NO SIGNAL - no group of the starting policy had a reward difference; training "
                "would run steps of zero advantage. Change the settings above before training."
            )
        return "\n".join(lines)


# -- playing groups -------------------------------------------------------------------------------
def play_groups(cfg: RunConfig, policy: Policy, tasks: list[Task], *, seed: int) -> list[list[Trajectory]]:
    """Each task played ``rollout.group_size`` times, concurrently (as ``asyncrl eval`` plays):
    the samples of each task's group, in task order."""
    g = cfg.rollout.group_size
    trajs = asyncio.run(run_episodes(cfg, policy, [t for t in tasks for _ in range(g)], seed=seed))
    by_task: dict[int, list[Trajectory]] = defaultdict(list)
    index = {t.id: i for i, t in enumerate(tasks)}
    for t in trajs:
        by_task[index[t.task.id]].append(t)
    return [by_task[i] for i in range(len(tasks))]


def group_signal(groups: list[list[Trajectory]]) -> tuple[int, int, int, int]:
    """(groups with a reward difference, groups, successful episodes, episodes); an episode of several
    samples (``model.multi_turn: per_turn``) counts once."""
    differ = n = wins = episodes = 0
    for samples in groups:
        ends = list({t.episode: t for t in samples}.values())
        if not ends:
            continue
        n += 1
        differ += len({t.final_reward for t in ends}) > 1
        wins += sum(t.outcome == "success" for t in ends)
        episodes += len(ends)
    return differ, n, wins, episodes


def _bucket(cfg: RunConfig, name: str, groups: list[list[Trajectory]]) -> BucketSignal:
    c, g = cfg.orchestrator.signal, cfg.rollout.group_size
    differ, n, wins, episodes = group_signal(groups)
    p, m = share_or_none(wins, episodes), share_or_none(differ, n)
    if p is None:
        return BucketSignal(name, 0, 0, 0, None, None, None, "unmeasured", "no held-out task of this bucket")
    v = verdict(p, c.band_low, c.band_high)
    text = advice(p, m, g, c.band_low, c.band_high)
    if v in ("no_success", "solved"):  # none seen is not none there: the rule of three bounds it
        text += f" (0 of {episodes} episodes {'succeeded' if v == 'no_success' else 'failed'}: "
        text += f"the true rate is below {min(1.0, 3 / episodes):.0%} at 95% confidence; --tasks sharpens it)"
    return BucketSignal(name, n, differ, episodes, p, m, signal_share(p, g), v, text)


def measure(
    cfg: RunConfig, policy: Policy, name: str, tasks: dict[str, list[Task]], bar: Progress | None = None
) -> PolicySignal:
    """Signal of every bucket of ``tasks`` under ``policy`` (one bar step per bucket)."""
    t0, out = time.perf_counter(), []
    job = bar.add_task(f"{name}: playing groups", total=len(tasks)) if bar is not None else None
    for bucket, ts in tasks.items():
        out.append(_bucket(cfg, bucket, play_groups(cfg, policy, ts, seed=cfg.seed) if ts else []))
        if bar is not None and job is not None:
            bar.update(job, advance=1, description=f"{name}: {bucket}")
    return PolicySignal(name, out, time.perf_counter() - t0)


def tasks_by_bucket(cfg: RunConfig, per_bucket: int) -> dict[str, list[Task]]:
    """The first ``per_bucket`` held-out tasks of each of the task source's buckets."""
    source = make_task_source(cfg.env)
    out: dict[str, list[Task]] = {b: [] for b in buckets_of_source(source)}
    for t in source.heldout():
        ts = out.setdefault(bucket_of(t), [])
        if len(ts) < per_bucket:
            ts.append(t)
    return dict(sorted(out.items()))


# -- the job --------------------------------------------------------------------------------------
def check_signal(cfg: RunConfig, *, tasks: int, progress: bool = False, name: str = "") -> SignalReport:
    """The report of the module docstring for ``cfg`` (``tasks`` held-out tasks per bucket)."""
    from asyncrl.bootstrap import pinned_threads, torch_threads
    from asyncrl.jobs.warm_start import progress_bar, warm_start
    from asyncrl.policy import Policy

    c = cfg.orchestrator.signal
    report = SignalReport(name or cfg.name, cfg.rollout.group_size, tasks, (c.band_low, c.band_high))
    buckets = tasks_by_bucket(cfg, tasks)
    steps = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).steps
    with pinned_threads(torch_threads(cfg, "warm_start")):  # nothing else computes: every core
        with progress_bar(progress) as bar:
            base = Policy.from_config(cfg.model).to(cfg.model.device)
            report.policies.append(measure(cfg, base, "base", buckets, bar))
            del base
        if not steps:
            report.warm_start = "none (trainer.sft.steps is 0): RL starts from the base policy"
            return report
        ws = warm_start(cfg, progress=progress, eval_limit=len(buckets) * tasks)  # its own bar
        report.warm_start = f"{ws.path.name} ({'cached' if ws.cached else f'trained in {ws.seconds:.0f}s'})"
        with progress_bar(progress) as bar:
            warm = Policy.load(ws.path, cfg=cfg.model).to(cfg.model.device)
            report.policies.append(measure(cfg, warm, "warm start", buckets, bar))
    return report
