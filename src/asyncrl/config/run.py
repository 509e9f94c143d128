"""``RunConfig``: the root of a run's configuration, assembled from every role's section, and its
cross-section rules."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field, model_validator

from asyncrl.config.aliases import drop_retired, move_renamed
from asyncrl.config.base import Section, drop_stale_defaults
from asyncrl.config.control import ControlConfig
from asyncrl.config.cost import CostConfig
from asyncrl.config.credit import CreditConfig
from asyncrl.config.env import EnvConfig, NoLatencyConfig
from asyncrl.config.launch import LauncherConfig, LocalLauncherConfig
from asyncrl.config.model import ModelConfig
from asyncrl.config.orchestrator import OrchestratorConfig
from asyncrl.config.rollout import EngineConfig, HFEngineConfig, RolloutConfig, SamplingConfig
from asyncrl.config.telemetry import TelemetryConfig
from asyncrl.config.trainer import AlgoConfig, TrainerConfig
from asyncrl.config.transport import EmbeddedTransportConfig, TransportConfig
from asyncrl.config.weights import LocalWeightsConfig, WeightsConfig
from asyncrl.staleness import StalenessPolicy


@dataclass(frozen=True)
class RolloutSettings:
    """What episodes are played from, in a rollout worker (:meth:`RunConfig.rollout_settings`) and in
    held-out evaluation (:meth:`RunConfig.eval_settings`): derived once, the values other roles' sections
    decide for the rollout role included, so that it reads no other role's section."""

    env: EnvConfig
    """The environment (evaluation: without simulated latency or faults, :func:`quiet_env`)."""
    engine: EngineConfig
    """The generation engine (evaluation: always the built-in one, with the run's batching; docs/engines.md)."""
    sampling: SamplingConfig
    concurrent_episodes: int
    early_stop_invalid: int
    """``orchestrator.exploration.early_stop_invalid`` (evaluation: 0, it plays every episode to its end)."""
    reward_bounds: tuple[float, float]
    """``orchestrator.breaker.reward_min`` / ``reward_max``, the range a group's report checks rewards against."""
    curriculum: bool
    """``orchestrator.curriculum.enabled``: training tasks are drawn by the curriculum's bucket weights."""


@dataclass(frozen=True)
class TrainerSettings:
    """The values other roles' sections decide for the trainer (:meth:`RunConfig.trainer_settings`)."""

    steer_buffer: bool
    """``orchestrator.curriculum.steer_buffer``: batch composition follows the curriculum's weights."""


def quiet_env(env: EnvConfig) -> EnvConfig:
    """``env`` without simulated latency or injected faults (in every member of an ``env.kind: mix``)."""
    faults = env.faults.model_copy(update={"exception_rate": 0.0, "hang_rate": 0.0, "malformed_rate": 0.0})
    update: dict[str, object] = {"latency": NoLatencyConfig(), "faults": faults}
    if env.mix:
        update["mix"] = [m.model_copy(update={"env": quiet_env(m.env)}) for m in env.mix]
    return env.model_copy(update=update)


class RunConfig(Section):
    """Root of a run's configuration."""

    name: str = "run"
    """Run name; the run directory is ``{run_root}/{name}``."""
    run_root: str = "runs"
    """Folder holding run directories."""
    cache_dir: str = ".cache/asyncrl"
    """Cache of warm-start checkpoints, keyed by config hash."""
    seed: int = Field(0, ge=0)
    """Global seed."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    credit: CreditConfig = Field(default_factory=CreditConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    transport: TransportConfig = Field(default_factory=EmbeddedTransportConfig)
    weights: WeightsConfig = Field(default_factory=LocalWeightsConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    launcher: LauncherConfig = Field(default_factory=LocalLauncherConfig)

    @model_validator(mode="before")
    @classmethod
    def _older_dumps(cls, data: Any) -> Any:
        return drop_stale_defaults(cls, drop_retired(move_renamed(data)))

    def staleness_policy(self) -> StalenessPolicy:
        """The staleness rules in force for this run (:mod:`asyncrl.staleness`; rule 5 sets the lag)."""
        c = self.control
        return StalenessPolicy.from_config(c.mode, c.max_staleness, self.trainer.batch_size, c.stale_policy)

    def rollout_settings(self) -> RolloutSettings:
        """A rollout worker's settings."""
        o, rc = self.orchestrator, self.rollout
        bounds = (o.breaker.reward_min, o.breaker.reward_max)
        return RolloutSettings(
            self.env, rc.engine, rc.sampling, rc.concurrent_episodes, o.exploration.early_stop_invalid, bounds,
            o.curriculum.enabled,
        )  # fmt: skip

    def eval_settings(self) -> RolloutSettings:
        """Held-out evaluation's settings: it measures the policy, not the tools, comparably across engines."""
        engine = self.rollout.engine
        if engine.kind != "hf":  # the built-in engine's defaults, with the run's batching
            engine = HFEngineConfig(max_batch=engine.max_batch, batch_wait_ms=engine.batch_wait_ms)
        return replace(self.rollout_settings(), env=quiet_env(self.env), engine=engine, early_stop_invalid=0)

    def trainer_settings(self) -> TrainerSettings:
        return TrainerSettings(steer_buffer=self.orchestrator.curriculum.steer_buffer)

    def signal_window(self) -> int:
        """Training groups per window of the no-signal rule (:mod:`asyncrl.orchestrator.no_signal`) and of the
        report's signal chart: ``orchestrator.signal.window_steps`` trainer steps' worth of groups."""
        per_step = max(1, self.trainer.batch_size // self.rollout.group_size)
        return self.orchestrator.signal.window_steps * per_step

    @model_validator(mode="after")
    def _cross_section(self) -> RunConfig:
        if self.rollout.engine.kind == "vllm" and "kind" not in self.algo.policy_loss.model_fields_set:
            # vLLM's log-probs differ from the trainer's: correct with truncated IS (docs/engines.md).
            self.algo.policy_loss = self.algo.policy_loss.model_copy(update={"kind": "decoupled_ppo"})
        if self.trainer.batch_size % self.rollout.group_size:
            raise ValueError(
                f"trainer.batch_size ({self.trainer.batch_size}) must be a multiple of rollout.group_size "
                f"({self.rollout.group_size}) so that batches hold whole groups"
            )
        most = self.staleness_policy().max_sync_every
        if self.trainer.sync_every > most:
            raise ValueError(
                f"trainer.sync_every ({self.trainer.sync_every}) may be at most max_staleness + 1 ({most}) in "
                f"mode {self.control.mode!r}: samples from one published version are trained up to "
                "sync_every - 1 steps later"
            )
        if self.rollout.tree.enabled and self.env.kind == "agent":
            raise ValueError(
                "rollout.tree needs environment episodes it can replay; env.kind 'agent' runs your own "
                "program (set rollout.tree.enabled: false, or use an environment)"
            )
        need = min_queue_capacity(
            self.trainer.checkpoint_every, self.trainer.buffer_steps, self.trainer.batch_size
        )
        if self.transport.capacity < need:
            raise ValueError(
                f"transport.capacity ({self.transport.capacity} groups) must be at least "
                f"(trainer.checkpoint_every + trainer.buffer_steps + 1) x trainer.batch_size = {need}: the trainer "
                "holds entries (groups) un-acknowledged until a checkpoint covers them (trained) or it has a "
                "buffer slot for them (buffered); with less, a full queue can hold only entries waiting for a "
                "checkpoint that needs new entries"
            )
        return self

    @model_validator(mode="after")
    def _class_env_demos(self) -> RunConfig:
        """``env.kind: class`` demonstrates only from ``env.class_env.demo_field`` or ``demonstrator``: without
        either, a warm start from demonstrations alone (``trainer.sft.source: demos``) has nothing to train on."""
        c, sft = self.env.class_env, self.trainer.sft
        no_demos = c is not None and c.demo_field is None and c.demonstrator is None
        if no_demos and sft.steps != 0 and sft.source == "demos":
            raise ValueError(
                "env.kind 'class' has no demonstrations for the warm start: set trainer.sft.source: rollouts "
                "(the policy's own successful episodes), env.class_env.demo_field to a column holding each "
                "row's gold answer, env.class_env.demonstrator to a function 'module:function' returning the "
                "model turns, or trainer.sft.steps: 0 (RL from the base policy)"
            )
        return self

    @model_validator(mode="after")
    def _fsdp_fits(self) -> RunConfig:
        """What a sharded policy (``trainer.parallel: fsdp``) cannot do: run it outside the learner's
        scoring pass (which gathers its weights), on rank 0 alone or as a value model's backbone."""
        if self.trainer.parallel != "fsdp" or self.trainer.world_size == 1:
            return self
        if self.trainer.buffer_sampling == "behaviour_kl":
            raise ValueError(
                "trainer.buffer_sampling=behaviour_kl scores groups with the policy on rank 0 alone, which a "
                "sharded policy (trainer.parallel=fsdp) cannot do; use parallel=ddp or another buffer_sampling"
            )
        if self.credit.strategy in ("gae", "value_delta") and self.credit.value.kind == "head":
            raise ValueError(
                f"credit.strategy={self.credit.strategy} with credit.value.kind=head reads the policy's "
                "decoder as the value model's backbone, which a sharded policy (trainer.parallel=fsdp) cannot "
                "lend; use credit.value.kind=separate or parallel=ddp"
            )
        return self


def max_trainer_held(checkpoint_every: int, buffer_steps: int, batch_size: int) -> int:
    """Most queue entries (groups) a live trainer holds un-acknowledged between two loop iterations.

    ``checkpoint_every − 1`` steps trained since the last checkpoint (the step that reaches
    ``checkpoint_every`` checkpoints in the same iteration), each of at most ``batch_size`` groups (a
    batch takes whole groups until it has ``batch_size`` samples, and a group holds at least one), plus
    a replay buffer of at most ``buffer_steps × batch_size`` samples, so as many groups (it evicts
    beyond). See :mod:`asyncrl.trainer.intake` for why this bounds back-pressure.
    """
    return (checkpoint_every - 1 + buffer_steps) * batch_size


def min_queue_capacity(checkpoint_every: int, buffer_steps: int, batch_size: int) -> int:
    """Smallest ``transport.capacity`` (in groups) accepted: :func:`max_trainer_held` plus ``2 ×
    batch_size`` — room for one pull of fresh entries beyond everything the trainer can hold, so a
    full queue always holds an entry the trainer can take."""
    return max_trainer_held(checkpoint_every, buffer_steps, batch_size) + 2 * batch_size


SECTIONS: tuple[str, ...] = tuple(
    name for name, f in RunConfig.model_fields.items() if isinstance(f.default_factory, type)
)
