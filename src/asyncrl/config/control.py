"""``control``: the shared run state and its rules (:mod:`asyncrl.control`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from asyncrl.config.base import Section, check_redis_url, kind_of


class _StateBase(Section):
    """Where the orchestrator's state lives (counters, ledger, documents; restored on --resume)."""

    kind: str = "sqlite"
    """``sqlite``: ``run_dir/control.sqlite`` (embedded, survives a crash of any role); ``redis``: the same
    counters, ledger and documents in Redis (``redis_url``), so roles on several machines need no shared
    SQLite file."""
    snapshot_every_s: float = Field(1.0, gt=0, le=3600)
    """Seconds between snapshots of the orchestrator's rule states into the store."""


class SQLiteStateConfig(_StateBase):
    """``run_dir/control.sqlite``."""

    kind: Literal["sqlite"] = "sqlite"


class RedisStateConfig(_StateBase):
    """The run's state in Redis."""

    kind: Literal["redis"] = "redis"
    redis_url: str | None = None
    """The Redis server (same URL rules as transport.redis_url; masked in the run directory, a masked or
    absent password is read from $ASYNCRL_REDIS_PASSWORD). Required."""
    prefix: str | None = None
    """Key prefix of this run's state; unset: ``asyncrl:{<hash of the run directory>}:state`` (set it when
    the roles see the run directory under different absolute paths)."""

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else check_redis_url(v)

    @model_validator(mode="after")
    def _check(self) -> RedisStateConfig:
        if not self.redis_url:
            raise ValueError(
                "control.state.kind=redis needs control.state.redis_url, e.g. redis://127.0.0.1:6379/0"
            )
        if self.prefix is not None and not self.prefix.strip():
            raise ValueError("control.state.prefix must not be empty (unset it for the default)")
        return self


StateStoreConfig: TypeAlias = Annotated[
    Annotated[SQLiteStateConfig, Tag("sqlite")] | Annotated[RedisStateConfig, Tag("redis")],
    Discriminator(kind_of("sqlite")),
]
"""``control.state``: one model per ``kind``."""


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

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        if self.floor > self.ceiling:
            raise ValueError(f"floor ({self.floor}) must be at most ceiling ({self.ceiling})")
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
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) must be at most max_workers ({self.max_workers})"
            )
        return self


class ControlConfig(Section):
    """The orchestrator's rules: curriculum, breakers, drift, exploration, elastic capacity, state."""

    state: StateStoreConfig = Field(default_factory=SQLiteStateConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    exploration: ExplorationConfig = Field(default_factory=ExplorationConfig)
    elastic: ElasticConfig = Field(default_factory=ElasticConfig)
    balance: bool = True
    """Admit a group only on a worker whose in-flight load (remaining episode steps) is within one
    group of the least-loaded worker's."""
    refresh_s: float = Field(0.5, gt=0, le=60)
    """Seconds between a rollout worker's reads of the orchestrator's directives (curriculum weights,
    breakers, exploration, retirement)."""
    heartbeat_s: float = Field(5.0, gt=0, le=3600)
    """Load balancing counts only workers whose load heartbeat is at most this old (a dead worker's load
    stops counting after it)."""
