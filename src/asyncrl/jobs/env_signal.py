"""``asyncrl env signal CONFIG``: can this run learn? Signal per bucket before a step is trained.

For the config's model and environment it plays, for every bucket (task type × difficulty) of the task
source, the first ``tasks`` held-out tasks of that bucket, each ``rollout.group_size`` times as one group
(the rollout sampling settings, the built-in engine, seed ``cfg.seed``; latency and faults off, as
``asyncrl eval`` plays), twice: with the **base** policy (``model.path``, or the freshly initialised
built model) and with the **warm start** the run would begin from (``trainer.sft``; cached under
``cache_dir`` and shared with ``asyncrl sft`` and ``asyncrl train``; skipped when it trains no steps).

Per bucket and policy it reports held-out success ``p``, pass@G (the share of its tasks with at least
one success in their group), the measured share of groups whose rewards differ (the groups that carry
a GRPO gradient), the expected share ``s(p, G) = 1 − p^G − (1 − p)^G`` for binary rewards
(:mod:`asyncrl.learning_signal`), the band verdict against ``orchestrator.signal.band_low`` / ``band_high`` and
what to change — knowing whether the bucket is at its task type's lowest level. Buckets are in numeric
order of level; consecutive levels of one task type with the same verdict are merged into one row with
pooled counts and one advice line (:func:`merge`). :class:`Levels` restricts the scan to some levels
(the task source and warm start stay the run's). The run can learn when at least one bucket of the
policy RL starts from has groups with a reward difference; the command exits 1 when none has, 2 on a
config error (a held-out split too small for ``env.heldout_size``, levels that select nothing).

The groups are played and counted by :mod:`asyncrl.jobs.groups` (as the warm start's rounds play theirs);
``bench/task_signal.py`` times the same groups with one learner step on them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig
from asyncrl.control.buckets import active_difficulties, bucket_of, buckets_of_source, split_bucket
from asyncrl.envs import check_heldout, make_task_source
from asyncrl.envs.mix import MixTaskSource
from asyncrl.errors import UserError
from asyncrl.jobs.groups import Counts, group_signal, play_groups
from asyncrl.learning_signal import (
    advice,
    bucket_order,
    cold,
    fmt_share,
    levels_label,
    share_or_none,
    signal_share,
    verdict,
)
from asyncrl.records import Task

if TYPE_CHECKING:
    from rich.progress import Progress

    from asyncrl.envs.base import TaskSource
    from asyncrl.policy.model import Policy


@dataclass(frozen=True)
class Levels:
    """The levels a scan plays (``--levels``, ``--max-difficulty``); ``None`` for both: every level.

    The run's task source is left as the config builds it (the warm start is the run's own, the same
    cache entry); only the buckets played are filtered."""

    only: frozenset[int] | None
    max_difficulty: int | None

    def keeps(self, difficulty: int) -> bool:
        above = self.max_difficulty is not None and difficulty > self.max_difficulty
        return not above and (self.only is None or difficulty in self.only)

    def describe(self) -> str:
        parts = [f"levels {levels_label(sorted(self.only))}"] if self.only is not None else []
        parts += [f"up to level {self.max_difficulty}"] if self.max_difficulty is not None else []
        return " and ".join(parts) or "every level"


@dataclass
class BucketSignal:
    """One bucket (or a run of a task type's levels with one verdict) under one policy: success, pass@G,
    measured and expected shares of groups with a difference, and what to change."""

    bucket: str
    """``type:level``; for merged levels ``type:0–35`` (:func:`~asyncrl.learning_signal.levels_label`)."""
    task_type: str
    levels: list[int]
    groups: int
    """Tasks played, one group of ``group_size`` each."""
    differ: int
    """Groups whose members' final rewards differ."""
    solved: int
    """Groups with at least one success."""
    successes: int
    episodes: int
    success: float | None
    """Successful episodes / episodes (``None``: the held-out split has no task of this bucket)."""
    pass_at_g: float | None
    """Share of the tasks (one group each) with at least one success in their group of ``group_size``."""
    signal_share: float | None
    """``differ / groups``."""
    expected_share: float | None
    """``s(success, group_size)``: what binary rewards would give at this success."""
    verdict: str
    cold: bool
    lowest: bool
    """It holds its task type's lowest level (no lower difficulty to advise)."""
    advice: str

    @property
    def counts(self) -> Counts:
        return Counts(self.groups, self.differ, self.solved, self.successes, self.episodes)

    @property
    def label(self) -> str:
        """``leg_counting levels 0–35`` / ``coin level 1``, as the advice lines name it."""
        word = "level" if len(self.levels) == 1 else "levels"
        return f"{self.task_type} {word} {levels_label(self.levels)}"


@dataclass
class PolicySignal:
    name: str
    """``base`` or ``warm start``."""
    buckets: list[BucketSignal]
    """Every bucket played, in numeric order of level within a task type."""
    merged: list[BucketSignal]
    """Consecutive buckets of one task type with the same verdict, as one row each (the table's rows)."""
    seconds: float

    def share(self) -> float | None:
        """Groups with a reward difference over every bucket."""
        total = sum((b.counts for b in self.buckets), Counts())
        return share_or_none(total.differ, total.groups)


@dataclass
class SignalReport:
    config: str
    group_size: int
    tasks_per_bucket: int
    band: tuple[float, float]
    levels: str
    """The levels played (``every level``, ``levels 0–3``, ``up to level 5``)."""
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
        """The table and verdict ``asyncrl env signal`` prints: one row per run of levels of a task type
        with the same verdict, then one advice line per such run for the policy RL starts from."""
        lo, hi, g = *self.band, self.group_size
        width = max([22, *(len(b.bucket) for p in self.policies for b in p.merged)])
        lines = [
            f"learning signal of {self.config}: group_size {g}, {self.tasks_per_bucket} held-out task(s) per "
            f"bucket, {self.levels}, learnable band {lo:.0%}-{hi:.0%} success; warm start {self.warm_start}",
            f"{'policy':<11} {'buckets':<{width}} {'groups':>6} {'success':>8} {f'pass@{g}':>7} {'differ':>7} "
            f"{'expected':>9}  verdict",
        ]
        for pol in self.policies:
            for b in pol.merged:
                lines.append(
                    f"{pol.name:<11} {b.bucket:<{width}} {b.groups:>6} {fmt_share(b.success):>8} "
                    f"{fmt_share(b.pass_at_g):>7} {fmt_share(b.signal_share):>7} "
                    f"{fmt_share(b.expected_share):>9}  {b.verdict}"
                )
            lines.append(
                f"{pol.name:<11} {'all':<{width}} {'':>6} {'':>8} {'':>7} {fmt_share(pol.share()):>7}"
            )
        lines.append(f"advice ({self.start.name}, where RL starts):")
        lines += [f"  {b.label}: {b.advice}" for b in self.start.merged]
        if self.ok:
            band = ", ".join(self.learnable) or "none (signal outside the band only)"
            lines.append(f"verdict: the run can learn; buckets in the learnable band: {band}")
        else:
            lines.append(
                "verdict: NO SIGNAL - no group of the starting policy had a reward difference; training "
                "would run steps of zero advantage. Change the settings above before training."
            )
        return "\n".join(lines)


def _signal(
    cfg: RunConfig, bucket: str, where: tuple[str, list[int]], counts: Counts, lowest: bool
) -> BucketSignal:
    """The verdict and advice for ``counts`` of one bucket, or of a run of levels of one task type
    (``where``: the task type and its levels)."""
    c, g = cfg.orchestrator.signal, cfg.rollout.group_size
    p, m = share_or_none(counts.successes, counts.episodes), share_or_none(counts.differ, counts.groups)
    solved = share_or_none(counts.solved, counts.groups)
    v = "unmeasured" if p is None else verdict(p, c.band_low, c.band_high)
    if p is None:
        text = "no held-out task of this bucket"
    else:
        text = advice(p, m, g, c.band_low, c.band_high, lowest=lowest, pass_at_g=solved)
    if v in ("no_success", "solved"):  # none seen is not none there: the rule of three bounds it
        n = counts.episodes
        text += f" (0 of {n} episodes {'succeeded' if v == 'no_success' else 'failed'}: "
        text += f"the true rate is below {min(1.0, 3 / n):.0%} at 95% confidence; --tasks sharpens it)"
    return BucketSignal(
        bucket=bucket,
        task_type=where[0],
        levels=where[1],
        **asdict(counts),
        success=p,
        pass_at_g=solved,
        signal_share=m,
        expected_share=None if p is None else signal_share(p, g),
        verdict=v,
        cold=p is not None and cold(m, p, g),
        lowest=lowest,
        advice=text,
    )


def _kind(b: BucketSignal) -> tuple[str, str, bool]:
    return b.task_type, b.verdict, b.cold


def merge(cfg: RunConfig, buckets: list[BucketSignal]) -> list[BucketSignal]:
    """Consecutive buckets (numeric order) of one task type with the same verdict (and the same cold
    flag) as one: counts pooled, the advice for the pool, lowest when the run holds the lowest level."""
    runs: list[list[BucketSignal]] = []
    for b in buckets:
        if runs and _kind(runs[-1][-1]) == _kind(b):
            runs[-1].append(b)
        else:
            runs.append([b])
    out = []
    for run in runs:
        levels = [d for b in run for d in b.levels]
        name = run[0].bucket if len(run) == 1 else f"{run[0].task_type}:{levels_label(levels)}"
        pooled = sum((b.counts for b in run), Counts())
        out.append(_signal(cfg, name, (run[0].task_type, levels), pooled, any(b.lowest for b in run)))
    return out


def measure(
    cfg: RunConfig,
    policy: Policy,
    name: str,
    tasks: dict[str, list[Task]],
    lowest: set[str],
    bar: Progress | None = None,
) -> PolicySignal:
    """Signal of every bucket of ``tasks`` under ``policy`` (one bar step per bucket); ``lowest``: the
    buckets at their task type's lowest level."""
    t0, out = time.perf_counter(), []
    job = bar.add_task(f"{name}: playing groups", total=len(tasks)) if bar is not None else None
    for bucket, ts in tasks.items():
        counts = group_signal(play_groups(cfg, policy, ts, seed=cfg.seed) if ts else [])
        task_type, level = split_bucket(bucket)
        out.append(_signal(cfg, bucket, (task_type, [level]), counts, bucket in lowest))
        if bar is not None and job is not None:
            bar.update(job, advance=1, description=f"{name}: {bucket}")
    return PolicySignal(name, out, merge(cfg, out), time.perf_counter() - t0)


def tasks_by_bucket(
    cfg: RunConfig, per_bucket: int, levels: Levels
) -> tuple[dict[str, list[Task]], set[str]]:
    """The first ``per_bucket`` held-out tasks of each of the task source's buckets that ``levels``
    keeps, in numeric order of level, and the buckets at their task type's lowest level. Too few
    held-out tasks for ``env.heldout_size`` is a config error (one line, as ``asyncrl train`` says it)."""
    source = make_task_source(cfg.env)
    every = buckets_of_source(source)
    out: dict[str, list[Task]] = {b: [] for b in every}
    for t in check_heldout(source, cfg.env):
        ts = out.setdefault(bucket_of(t), [])
        if len(ts) < per_bucket:
            ts.append(t)
    kept = {b: ts for b, ts in out.items() if levels.keeps(split_bucket(b)[1])}
    if not kept:
        have = levels_label(sorted({split_bucket(b)[1] for b in out}))
        raise UserError(f"env signal: {levels.describe()} keeps none of this environment's levels ({have})")
    return dict(sorted(kept.items(), key=lambda kv: bucket_order(kv[0]))), lowest_buckets(source, every)


def lowest_buckets(source: TaskSource, buckets: list[str]) -> set[str]:
    """The buckets at their task type's lowest level: the type's lowest active difficulty, unless
    ``env.min_difficulty`` cut the source's lower levels off (then a lower one may exist)."""
    if isinstance(source, MixTaskSource):
        return {
            f"{n}/{b}"
            for n, member in source.members.items()
            for b in lowest_buckets(member, [x.partition("/")[2] for x in buckets if x.startswith(n + "/")])
        }
    active = active_difficulties(source)
    cut = min(active) > min(source.difficulties)
    floor: dict[str, int] = {}
    for b in buckets:
        task_type, d = split_bucket(b)
        floor[task_type] = min(d, floor.get(task_type, d))
    return {f"{t}:{d}" for t, d in floor.items() if not (cut and d == min(active))}


# -- the job --------------------------------------------------------------------------------------
def check_signal(
    cfg: RunConfig, *, tasks: int, levels: Levels, progress: bool = False, name: str = ""
) -> SignalReport:
    """The report of the module docstring for ``cfg`` (``tasks`` held-out tasks per bucket kept by
    ``levels``)."""
    from asyncrl.bootstrap import pinned_threads, torch_threads
    from asyncrl.jobs.warm_start import progress_bar, warm_start
    from asyncrl.policy import Policy

    c = cfg.orchestrator.signal
    band = (c.band_low, c.band_high)
    report = SignalReport(name or cfg.name, cfg.rollout.group_size, tasks, band, levels.describe())
    buckets, lowest = tasks_by_bucket(cfg, tasks, levels)
    steps = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).steps
    with pinned_threads(torch_threads(cfg, "warm_start")):  # nothing else computes: every core
        with progress_bar(progress) as bar:
            base = Policy.from_config(cfg.model).to(cfg.model.device)
            report.policies.append(measure(cfg, base, "base", buckets, lowest, bar))
            del base
        if not steps:
            report.warm_start = "none (trainer.sft.steps is 0): RL starts from the base policy"
            return report
        ws = warm_start(cfg, progress=progress, eval_limit=len(buckets) * tasks)  # its own bar
        report.warm_start = f"{ws.path.name} ({'cached' if ws.cached else f'trained in {ws.seconds:.0f}s'})"
        with progress_bar(progress) as bar:
            warm = Policy.load(ws.path, cfg=cfg.model).to(cfg.model.device)
            report.policies.append(measure(cfg, warm, "warm start", buckets, lowest, bar))
    return report
