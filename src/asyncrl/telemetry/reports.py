"""Typed role reports: what each role tells the orchestrator, as structs with fields.

A role builds its report (:class:`WorkerReport`, :class:`TrainerReport`, :class:`EvaluatorReport`)
and writes it through :meth:`asyncrl.telemetry.jsonl.MetricWriter.report`; every finished group is a
:class:`GroupReport` event (:meth:`~asyncrl.telemetry.jsonl.MetricWriter.group`). The orchestrator,
its rules, the summary and the cost ledger read the rows back with :func:`decode_row` and use
attributes, never metric names.

The flat metric names of ``metrics.jsonl``, TensorBoard and ``docs/metrics.md`` come from one place:
a report is made of sections (:class:`Figures`), each with a namespace ``NS``, and field ``x`` of a
section is the metric ``{NS}/x`` (:meth:`Figures.flat`). A field that is ``None`` is not written (a
figure the role did not have this time, e.g. the batch figures of a skipped step); decoding a row
leaves the figures it lacks at their defaults. ``tests/test_telemetry_reports.py`` checks that the
flat names of every report are exactly the documented ones.

The trainer's row also carries the learner's own figures (losses, ratios, KL, advantages: the metric
dicts :mod:`asyncrl.algo` returns, convention 14); they travel as :attr:`TrainerReport.learner`, under
the namespaces of :data:`LEARNER_NAMESPACES`, and no control-plane decision reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeVar, get_args

import msgspec

F = TypeVar("F", bound="Figures")
R = TypeVar("R", bound="Report")

GROUP_EVENT = "rollout/group"
"""The event a worker writes for every finished group (a :class:`GroupReport`)."""
CANARY_FAILED = "weights/canary_failed"
"""The event a worker writes when it refuses a weight version (the orchestrator alerts)."""
LEARNER_NAMESPACES = ("loss", "policy", "kl", "entropy", "adv", "group", "train", "credit", "tree", "value")
"""Namespaces of the learner's figures in the trainer's row (:attr:`TrainerReport.learner`)."""


class Figures(msgspec.Struct, kw_only=True):
    """One namespace of a report: field ``x`` is the metric ``{NS}/x``."""

    NS: ClassVar[str]

    def flat(self) -> dict[str, float]:
        """The metric names and values of this section (``None`` fields are not written)."""
        return {f"{self.NS}/{k}": float(v) for k, v in msgspec.structs.asdict(self).items() if v is not None}

    @classmethod
    def names(cls) -> list[str]:
        """Every metric name this section can write."""
        return [f"{cls.NS}/{f.name}" for f in msgspec.structs.fields(cls)]

    @classmethod
    def total(cls: type[F], items: Iterable[F]) -> F:
        """The field-wise sum of ``items`` (counters over several processes); ``None`` counts as 0."""
        sums: dict[str, float] = {}
        for item in items:
            for k, v in msgspec.structs.asdict(item).items():
                sums[k] = sums.get(k, 0.0) + float(v or 0.0)
        return cls(**sums)


class Memory(Figures):
    """Resident memory of the process, MB (added to every row by the writer)."""

    NS = "mem"
    rss_mb: float = 0.0
    peak_rss_mb: float = 0.0


class Report(msgspec.Struct, kw_only=True):
    """A role's metric row: the head the writer adds (``role``, ``pid``, ``time``, ``alive_s``, memory)
    and the role's sections (every field whose type is a :class:`Figures`)."""

    role: str = ""
    pid: int | None = None
    time: float = 0.0
    alive_s: float = 0.0
    mem: Memory | None = None

    def flat(self) -> dict[str, float]:
        """Every figure under its metric name: what TensorBoard, ``metrics.jsonl`` and the docs show."""
        sections = msgspec.structs.asdict(self).values()
        return {k: v for s in sections if isinstance(s, Figures) for k, v in s.flat().items()}

    @classmethod
    @functools.cache
    def sections(cls) -> dict[str, type[Figures]]:
        """{field name: section type} of this report."""
        types = ((f.name, t) for f in msgspec.structs.fields(cls) for t in (f.type, *get_args(f.type)))
        return {name: t for name, t in types if isinstance(t, type) and issubclass(t, Figures)}

    @classmethod
    def names(cls) -> list[str]:
        """Every metric name this report can write (the writer's memory figures excluded)."""
        return [n for name, s in cls.sections().items() if name != "mem" for n in s.names()]

    @classmethod
    def of_row(cls: type[R], row: Mapping[str, Any]) -> R:
        """The report a metric row holds (figures it lacks keep their defaults)."""
        return msgspec.convert({**_head(row), **_sections(cls, _numbers(row))}, cls, strict=False)


def _head(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the writer put in every row besides the figures: ``role``, ``pid``, ``time``, ``alive_s``."""
    return {k: row[k] for k in ("role", "pid", "time", "alive_s") if row.get(k) is not None}


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _sections(cls: type[Report], figures: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """``figures`` (flat names) sorted into ``cls``'s sections: {field: {figure: value}}; a section
    none of whose figures is present is left out (its default: zeros, or ``None``)."""
    by_ns = {s.NS: name for name, s in cls.sections().items()}
    out: dict[str, dict[str, float]] = {}
    for key, value in figures.items():
        ns, sep, name = key.partition("/")
        if sep and ns in by_ns:
            out.setdefault(by_ns[ns], {})[name] = value
    return out


# -- the rollout worker -------------------------------------------------------------------------------
class RolloutFigures(Figures):
    """A worker's counters (cumulative for the process) and gauges; docs/metrics.md says what each is."""

    NS = "rollout"
    episodes: float = 0.0
    tokens: float = 0.0
    groups: float = 0.0
    put_seconds: float = 0.0
    faults: float = 0.0
    success: float = 0.0
    env_calls: float = 0.0
    env_seconds: float = 0.0
    env_retries: float = 0.0
    truncated_tokens: float = 0.0
    early_stopped: float = 0.0
    heldout_episodes: float = 0.0
    token_exact_checked: float = 0.0
    token_exact_unchecked: float = 0.0
    token_inexact: float = 0.0
    retokenization_inexact: float = 0.0
    retokenization_diff_tokens: float = 0.0
    tree_roots: float = 0.0
    tree_branch_points: float = 0.0
    tree_replayed_turns: float = 0.0
    tree_replay_diverged: float = 0.0
    tree_rounds: float = 0.0
    weight_loads: float = 0.0
    weight_fallbacks: float = 0.0
    weight_bytes_loaded: float = 0.0
    weight_load_seconds: float = 0.0
    version: float = 0.0
    gen_busy_seconds: float = 0.0
    gen_batches: float = 0.0
    gen_sequences: float = 0.0
    gen_tokens: float = 0.0
    decode_steps: float = 0.0
    decode_seconds: float = 0.0
    prefill_tokens_computed: float = 0.0
    prefill_tokens_reused: float = 0.0
    prefill_tokens_shared: float = 0.0
    prefill_seconds: float = 0.0
    load_steps: float = 0.0


class GuardFigures(Figures):
    """What the environment guards of a worker absorbed (:class:`asyncrl.envs.wrappers.GuardStats`)."""

    NS = "guard"
    calls: float = 0.0
    faults: float = 0.0
    retries: float = 0.0
    timeouts: float = 0.0
    exceptions: float = 0.0
    malformed: float = 0.0
    fault_seconds: float = 0.0
    tool_faults: float = 0.0
    tool_calls_recorded: float = 0.0
    scorer_errors: float = 0.0


class RewardCostFigures(Figures):
    """The answer-verdict cache and the time spent grading (the cost ledger's ``reward`` component)."""

    NS = "cost"
    reward_cache_hits: float = 0.0
    reward_cache_misses: float = 0.0
    reward_seconds: float = 0.0


class CanaryFigures(Figures):
    """The weight-sync canary of a worker (present when ``weights.canary.enabled``)."""

    NS = "weights"
    canary_checked: float = 0.0
    canary_failed: float = 0.0
    canary_unverified: float = 0.0
    canary_rode: float = 0.0
    """Checks whose probe rode along a generation call (``weights.canary.ride_along``)."""
    canary_seconds: float = 0.0
    canary_probe_diff: float = 0.0


class GatewayFigures(Figures):
    """The agent gateway of a worker (present with ``env.kind: agent``)."""

    NS = "gateway"
    calls: float = 0.0
    rejected_429: float = 0.0
    errors_4xx: float = 0.0
    cancelled_calls: float = 0.0
    held_seconds: float = 0.0
    appended_prompts: float = 0.0
    rendered_prompts: float = 0.0
    tool_choice_unmet: float = 0.0
    episodes: float = 0.0
    stale_sessions: float = 0.0
    agent_errors: float = 0.0
    per_call: float = 0.0
    open_sessions: float = 0.0


class CoreFigures(Figures):
    """Core lending (:mod:`asyncrl.lending`): thread-seconds this role ran above its pinned
    threads on cores a waiting role lent it, and its thread count at the row."""

    NS = "cores"
    borrowed_thread_seconds: float = 0.0
    threads: float = 0.0


class WorkerReport(Report):
    """A rollout worker's row (``role: rollout-N``, every ``telemetry.log_every_s``)."""

    rollout: RolloutFigures = msgspec.field(default_factory=RolloutFigures)
    guard: GuardFigures = msgspec.field(default_factory=GuardFigures)
    cost: RewardCostFigures = msgspec.field(default_factory=RewardCostFigures)
    weights: CanaryFigures | None = None
    gateway: GatewayFigures | None = None
    cores: CoreFigures | None = None


# -- the trainer ---------------------------------------------------------------------------------------
class TrainerFigures(Figures):
    """The trainer's progress, time split and token accounting (cumulative for the process)."""

    NS = "trainer"
    step: float = 0.0
    version: float = 0.0
    busy_fraction: float = 0.0
    busy_seconds: float = 0.0
    idle_seconds: float = 0.0
    learn_seconds: float = 0.0
    buffer_size: float = 0.0
    samples_trained: float = 0.0
    tokens_trained: float = 0.0
    tokens_processed: float = 0.0
    truncated_tokens: float = 0.0
    zero_adv_samples: float = 0.0
    zero_adv_tokens: float = 0.0
    zero_adv_model_tokens: float = 0.0
    zero_adv_skipped_samples: float = 0.0
    """Of ``zero_adv_samples``: those left out of the gradient (``trainer.skip_equal_reward_groups``)."""
    zero_adv_skipped_model_tokens: float = 0.0
    """Of ``zero_adv_model_tokens``: those of samples left out of the gradient (never forwarded, so not
    in ``zero_adv_tokens`` or ``tokens_processed``)."""
    empty_steps: float = 0.0
    """Steps whose every group was left out of the gradient: no optimiser step."""
    dropped_stale_tokens: float = 0.0
    dropped_other_tokens: float = 0.0
    bytes_published: float = 0.0
    publish_seconds: float = 0.0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


class QueueStats(Figures):
    """The trajectory queue's gauges and queue-wide totals (every backend's ``stats()``)."""

    NS = "queue"
    depth: float = 0.0
    ready: float = 0.0
    leased: float = 0.0
    dead_letters: float = 0.0
    dead_letters_foreign: float = 0.0
    put_total: float = 0.0
    acked_total: float = 0.0
    redelivered_total: float = 0.0
    bytes_in: float = 0.0
    capacity: float = 0.0
    samples_in: float = 0.0
    """Samples (members of the groups) accepted by ``put``; an entry is one group."""
    samples_acked: float = 0.0
    """Samples of the entries acknowledged (every one's fate durable)."""
    samples_dead: float = 0.0
    """Samples of entries put by ``put`` and set aside as dead letters."""


class StalenessFigures(Figures):
    """Version lag of a trained batch's model tokens: the ages the staleness governor observes."""

    NS = "staleness"
    mean: float | None = None
    max: float | None = None


class RewardFigures(Figures):
    """Final rewards and success share of a trained batch."""

    NS = "reward"
    mean: float | None = None
    std: float | None = None
    success_rate: float | None = None
    min: float | None = None
    p50: float | None = None
    max: float | None = None
    success_rate_ma: float | None = None


class LengthFigures(Figures):
    NS = "length"
    mean_tokens: float | None = None
    p50_tokens: float | None = None
    p90_tokens: float | None = None
    max_tokens: float | None = None
    model_tokens_mean: float | None = None


class ToolFigures(Figures):
    NS = "tools"
    calls_per_episode: float | None = None
    success_rate: float | None = None


class DiversityFigures(Figures):
    NS = "diversity"
    distinct_2: float | None = None


class LifecycleFigures(Figures):
    """Where a trained batch's trajectories spent their time (:mod:`asyncrl.telemetry.lifecycle`)."""

    NS = "lifecycle"
    env_mean_s: float | None = None
    generation_mean_s: float | None = None
    rollout_other_mean_s: float | None = None
    queue_wait_mean_s: float | None = None
    buffer_wait_mean_s: float | None = None
    end_to_end_mean_s: float | None = None
    end_to_end_p90_s: float | None = None


class GapFigures(Figures):
    """The train–inference log-prob gap (:mod:`asyncrl.trainer.gap`): ``|log p_trainer − log p_sampler|``
    per model token the sampler drew with the weights the trainer scored it with, cumulative over the
    process's trained steps, and the last step's (``step_*``)."""

    NS = "gap"
    tokens: float = 0.0
    mean: float = 0.0
    p99: float = 0.0
    """From a histogram of 100 bins a decade: at most 2.33 % above the exact p99."""
    max: float = 0.0
    sequences: float = 0.0
    sequences_over: float = 0.0
    """Sequences whose summed log-prob differs by more than 0.1 nats."""
    k3: float = 0.0
    """Token mean of the k3 estimate of KL(sampler ‖ trainer)."""
    step_tokens: float | None = None
    step_mean: float | None = None
    step_p99: float | None = None
    step_max: float | None = None


class TrainerReport(Report):
    """The trainer's row (``role: trainer``, one per trained batch and a last one at exit)."""

    trainer: TrainerFigures = msgspec.field(default_factory=TrainerFigures)
    queue: QueueStats = msgspec.field(default_factory=QueueStats)
    staleness: StalenessFigures = msgspec.field(default_factory=StalenessFigures)
    reward: RewardFigures = msgspec.field(default_factory=RewardFigures)
    length: LengthFigures = msgspec.field(default_factory=LengthFigures)
    tools: ToolFigures = msgspec.field(default_factory=ToolFigures)
    diversity: DiversityFigures = msgspec.field(default_factory=DiversityFigures)
    lifecycle: LifecycleFigures = msgspec.field(default_factory=LifecycleFigures)
    cores: CoreFigures | None = None
    gap: GapFigures | None = None
    learner: dict[str, float] = msgspec.field(default_factory=dict)
    """The learner's figures, by metric name (:data:`LEARNER_NAMESPACES`): written, never decided on."""

    def flat(self) -> dict[str, float]:
        return {**self.learner, **super().flat()}

    @classmethod
    def of_figures(cls, figures: Mapping[str, float], **sections: Figures) -> TrainerReport:
        """A report from the learner's and the batch's flat ``figures`` and the trainer's own
        ``sections`` (their non-``None`` fields win): figures in a section's namespace fill that
        section, the rest are the learner's."""
        nested = _sections(cls, figures)
        for name, given in sections.items():
            nested[name] = {
                **nested.get(name, {}),
                **{k: v for k, v in msgspec.structs.asdict(given).items() if v is not None},
            }
        # a figure no section has a field for is kept as the learner's: nothing the learner returns is lost
        known = {n for s in cls.sections().values() for n in s.names()}
        learner = {k: v for k, v in figures.items() if k not in known}
        return msgspec.convert({**nested, "learner": learner}, cls, strict=False)

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> TrainerReport:
        figures = {k: float(v) for k, v in _numbers(row).items() if "/" in k}
        return msgspec.structs.replace(cls.of_figures(figures), **_head(row))


# -- the evaluator ------------------------------------------------------------------------------------
class EvalFigures(Figures):
    """One periodic held-out evaluation of a weight version."""

    NS = "eval"
    version: float = 0.0
    trainer_step: float = 0.0
    success_rate: float = 0.0
    mean_reward: float = 0.0
    tool_success_rate: float = 0.0
    avg_steps: float = 0.0
    distinct_2: float = 0.0
    episodes: float = 0.0
    seconds: float = 0.0


class EvaluatorReport(Report):
    """The evaluator's row (``role: evaluator``, one per evaluated version)."""

    eval: EvalFigures = msgspec.field(default_factory=EvalFigures)


# -- events -------------------------------------------------------------------------------------------
class GroupReport(msgspec.Struct, kw_only=True):
    """One finished group (the ``rollout/group`` event): everything the orchestrator's rules consume."""

    bucket: str
    """The task's curriculum bucket (``type:difficulty``)."""
    started: float
    """The earliest episode start of the group."""
    heldout: bool
    """A held-out probe: measured, never trained."""
    outcomes: list[str]
    rewards: list[float]
    anomalies: list[str | None]
    """Per episode: the circuit breakers' anomaly kind, or ``None``."""
    env: str = ""
    """``env.kind: mix``: the environment the group's task belongs to."""
    tokens: int = 0
    """Model tokens the group's episodes generated (what per-environment cost rows are apportioned by)."""
    faults: int = 0
    """Environment calls of the group's episodes that failed on every attempt (the guard's faults)."""


class Event(msgspec.Struct, kw_only=True):
    """Any other event row (``weights/fallback``, ``weights/canary_failed``, ``train/non_finite_step``, ...)."""

    name: str
    role: str
    data: dict[str, Any]
    """The whole row, as written."""


Decoded = WorkerReport | TrainerReport | EvaluatorReport | Report | GroupReport | Event


def decode_row(row: Mapping[str, Any]) -> Decoded:
    """The typed report (or event) one metric row holds, by its ``role`` (or ``event``)."""
    role = str(row.get("role", ""))
    event = row.get("event")
    if event == GROUP_EVENT:
        return msgspec.convert(row, GroupReport, strict=False)
    if event is not None:
        return Event(name=str(event), role=role, data=dict(row))
    if role == "trainer":
        return TrainerReport.of_row(row)
    if role.startswith("rollout"):
        return WorkerReport.of_row(row)
    if role == "evaluator":
        return EvaluatorReport.of_row(row)
    return Report.of_row(row)  # the orchestrator's own row, a replay's: head and memory


def decode_rows(rows: Iterable[Mapping[str, Any]]) -> list[Decoded]:
    return [decode_row(r) for r in rows]
