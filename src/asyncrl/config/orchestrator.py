"""``orchestrator``: what the orchestrator process decides (:mod:`asyncrl.orchestrator`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from asyncrl.config.base import Section, ordered


class CurriculumConfig(Section):
    """Task buckets (task type x difficulty) and their adaptive sampling weights."""

    enabled: bool = True
    """Sample tasks by bucket weight (False: the task source's own uniform sampling)."""
    window: int = Field(64, ge=1, le=100000)
    """Recent episodes per bucket whose success rate sets its weight."""
    min_episodes: int = Field(16, ge=1, le=100000)
    """Episodes a bucket needs in its window before its weight moves off the ceiling."""
    floor: float = Field(0.1, gt=0, le=1)
    """Weight of hopeless (success 0) and converged (success 1) buckets."""
    ceiling: float = Field(1.0, gt=0, le=100)
    """Weight of a bucket at success 0.5 (weight = floor + (ceiling - floor) * 4p(1-p))."""
    steer_buffer: bool = False
    """Also steer the replay buffer's batch composition to the bucket weights."""
    start_from_eval: bool = True
    """Start where the signal is: each bucket's success in the initial held-out evaluation (the policy RL
    starts from) sets its weight until its own window holds ``min_episodes`` episodes; buckets outside
    the learnable band (``orchestrator.signal.band_low``–``band_high``) start at ``start_floor``, and the
    run says in one line which it starts on and which it left out (docs/orchestrator.md)."""
    start_floor: float = Field(0.02, gt=0, le=100)
    """Weight, at the start, of a bucket the initial evaluation put outside the learnable band."""

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        ordered("floor", self.floor, "ceiling", self.ceiling)
        return self


class BreakerConfig(Section):
    """Circuit breakers per environment and bucket."""

    enabled: bool = True
    """Open a bucket's breaker after ``consecutive`` anomalies of one kind."""
    consecutive: int = Field(5, ge=1, le=10000)
    """Consecutive episodes with the same anomaly kind that open the breaker."""
    backoff_s: float = Field(10.0, gt=0, le=86400)
    """Seconds an opened breaker waits before its first half-open probe."""
    backoff_factor: float = Field(2.0, ge=1, le=100)
    """Each failed probe multiplies the wait by this."""
    max_backoff_s: float = Field(300.0, gt=0, le=86400)
    """Upper bound of the wait between probes."""
    probes: int = Field(2, ge=1, le=1000)
    """Healthy probe episodes in a row that close a half-open breaker."""
    reward_min: float = Field(-10.0, ge=-1e9, le=1e9)
    """Final rewards below this are an anomaly (``reward_range``)."""
    reward_max: float = Field(10.0, ge=-1e9, le=1e9)
    """Final rewards above this are an anomaly (``reward_range``)."""
    fault_rate_alert: float = Field(0.1, ge=0, le=1)
    """Raise an ``env_faults`` alert when more than this share of environment call attempts fail
    (raise, hang or return garbage; retried attempts included), measured over windows of
    ``fault_rate_window`` attempts across all workers; one alert per excursion above it; 0 disables."""
    fault_rate_window: int = Field(50, ge=1, le=1_000_000)
    """Environment call attempts per fault-rate measurement."""


class DriftConfig(Section):
    """Reward-drift (two-sided CUSUM per bucket) and reward-hacking alarms."""

    enabled: bool = True
    """Run the drift detector on every bucket's group-mean rewards."""
    warmup: int = Field(30, ge=2, le=100000)
    """Group means that set a bucket's reference mean and standard deviation."""
    k: float = Field(0.75, ge=0, le=100)
    """CUSUM slack in reference standard deviations (half the smallest shift worth detecting)."""
    h: float = Field(10.0, gt=0, le=1000)
    """CUSUM decision threshold in reference standard deviations."""
    min_std: float = Field(0.05, gt=0, le=100)
    """Floor on the reference standard deviation (a constant history is not infinitely sensitive)."""
    downweight: float = Field(0.5, gt=0, le=1)
    """Curriculum weight multiplier of a bucket after a drift alarm."""
    hold_s: float = Field(60.0, ge=0, le=86400)
    """Seconds the down-weighting lasts."""
    hacking_window: int = Field(6, ge=3, le=10000)
    """Points of training reward and held-out success compared by the reward-hacking rule."""
    hacking_rise: float = Field(0.1, gt=0, le=100)
    """Rise of training reward over the window (with held-out success not rising) that is flagged."""
    heldout_rate: float = Field(0.0, ge=0, le=1)
    """Share of groups rollout workers run on held-out tasks (not trained) to track held-out success."""


class ExplorationConfig(Section):
    """Temperature jitter, exploration-task rate and early termination of failing episodes."""

    adaptive: bool = False
    """Raise jitter and exploration rate while most groups carry no signal, lower them when they do."""
    max_temperature_jitter: float = Field(0.3, ge=0, le=1)
    """Upper bound of the adapted ``rollout.temperature_jitter``."""
    max_exploration_rate: float = Field(0.2, ge=0, le=1)
    """Upper bound of the adapted ``rollout.exploration_rate``."""
    step: float = Field(0.05, gt=0, le=1)
    """Change of both knobs per decision."""
    zero_signal_high: float = Field(0.7, ge=0, le=1)
    """Share of zero-advantage groups above which exploration rises."""
    zero_signal_low: float = Field(0.3, ge=0, le=1)
    """Share of zero-advantage groups below which exploration falls back."""
    window: int = Field(16, ge=1, le=100_000)
    """Groups per adaptive decision (the zero-signal share is measured over this many)."""
    early_stop_invalid: int = Field(0, ge=0, le=1000)
    """End an episode after this many consecutive invalid actions (outcome ``early_stopped``); 0: never."""


class SignalConfig(Section):
    """The learning-signal rule (:mod:`asyncrl.orchestrator.no_signal`, a ``no_signal`` alert) and the success
    band ``asyncrl env signal`` checks buckets against (:mod:`asyncrl.learning_signal`)."""

    enabled: bool = True
    """Raise ``no_signal`` alerts while training groups carry no reward difference."""
    no_signal_share: float = Field(0.9, gt=0, le=1)
    """Alert when at least this share of the last window's training groups (of one bucket, or of the whole
    run) had no reward difference (all members rewarded alike: zero advantage, no gradient)."""
    window_steps: int = Field(4, ge=1, le=10_000)
    """Window of the rule, in trainer steps' worth of groups: ``window_steps × max(1, trainer.batch_size //
    rollout.group_size)`` groups (32 groups for configs/demo.yaml)."""
    band_low: float = Field(0.15, ge=0, le=1)
    """Lower edge of the learnable band of success (below: success is rare, few groups differ)."""
    band_high: float = Field(0.5, ge=0, le=1)
    """Upper edge of the learnable band of success (above: mostly solved, little left to gain)."""
    raise_temperature: bool = False
    """Off by default: measured on SmolLM2 it never helped and once hurt (letter_counting: 37.5 % on, 35.9 %
    off; rg-answer: training success fell 0.47 -> 0.05-0.20 as the factor rose to 1.5, docs/benchmarks.md
    "rg-answer with the levers") — there the groups stop differing because the policy gives each task one
    answer, not because sampling went cold. On: counter entropy collapse per bucket
    (:mod:`asyncrl.orchestrator.temperature`): after every window of
    a bucket's training groups, when the share of them with a reward difference is under half of what
    its success ``p`` predicts (``s(p, G)``: the policy solves some tasks always and others never), raise
    the bucket's sampling temperature by ``temperature_step`` × ``rollout.sampling.temperature`` (up to
    ``max_temperature_factor`` × it), with a ``temperature`` alert; lower it a step after a window that
    is not cold."""
    temperature_step: float = Field(0.1, gt=0, le=1)
    """Change of a bucket's temperature factor per decision (a share of ``rollout.sampling.temperature``)."""
    max_temperature_factor: float = Field(1.5, ge=1, le=10)
    """Highest factor ``raise_temperature`` puts on ``rollout.sampling.temperature`` for a bucket."""

    @model_validator(mode="after")
    def _check(self) -> SignalConfig:
        ordered("band_low", self.band_low, "band_high", self.band_high)
        return self


class ElasticConfig(Section):
    """Elastic rollout capacity: add or remove rollout workers within [min_workers, max_workers]."""

    enabled: bool = False
    """Let the orchestrator start and stop rollout workers."""
    min_workers: int = Field(1, ge=1, le=1024)
    """Never fewer rollout workers than this."""
    max_workers: int = Field(4, ge=1, le=1024)
    """Never more rollout workers than this."""
    cooldown_s: float = Field(20.0, ge=0, le=86400)
    """Seconds between two scaling decisions."""
    window: int = Field(6, ge=1, le=10000)
    """Ticks of evidence (every ``telemetry.log_every_s``) a decision needs."""
    starve_busy: float = Field(0.6, ge=0, le=1)
    """Trainer busy fraction below which (with a near-empty queue) it is starving."""
    starve_fill: float = Field(0.1, ge=0, le=1)
    """Queue fill at or below which the trainer may be starving."""
    overflow_fill: float = Field(0.8, ge=0, le=1)
    """Queue fill at or above which production outruns consumption."""

    @model_validator(mode="after")
    def _check(self) -> ElasticConfig:
        ordered("min_workers", self.min_workers, "max_workers", self.max_workers)
        return self


class GovernorConfig(Section):
    """The staleness governor (rule 6 of :mod:`asyncrl.staleness`, ``control.mode: async``;
    :mod:`asyncrl.orchestrator.governor`): lowers the effective ``control.max_staleness`` and ``sync_every``
    while samples run old or the queue is under-used, and relaxes them back."""

    window: int = Field(5, ge=1, le=1000)
    """Trainer reports in a row whose mean sample age is above ``control.max_staleness`` before the
    effective bound is lowered by one."""
    fill_window: int = Field(10, ge=1, le=10000)
    """Orchestrator ticks in a row of queue fill under ``low_fill`` before the effective ``sync_every`` is
    lowered by one (or at or above it before it is raised back)."""
    low_fill: float = Field(0.3, ge=0, le=1)
    """A queue filled below this fraction is under-used — publish weights more often."""


class OrchestratorConfig(Section):
    """What the orchestrator process decides (:mod:`asyncrl.orchestrator`): admission watermarks, the stall
    watchdog, the staleness governor, and the rules it runs — curriculum, circuit breakers, drift,
    exploration, learning signal, elastic capacity."""

    watchdog_s: float = Field(600.0, ge=0, le=86400)
    """Stall watchdog: a ``stall`` alert (and a printed message) when neither a new weight version nor a
    newly accepted trajectory was seen for this many seconds (docs/configuration.md); 0: off."""
    high_watermark: float = Field(0.9, gt=0, le=1)
    """Queue fill fraction at which admission of new episodes pauses."""
    low_watermark: float = Field(0.5, ge=0, lt=1)
    """Queue fill fraction at which admission resumes."""
    governor: GovernorConfig = Field(default_factory=GovernorConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    exploration: ExplorationConfig = Field(default_factory=ExplorationConfig)
    signal: SignalConfig = Field(default_factory=SignalConfig)
    elastic: ElasticConfig = Field(default_factory=ElasticConfig)

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        ordered("low_watermark", self.low_watermark, "high_watermark", self.high_watermark, strict=True)
        return self
