"""The run configuration: one pydantic model tree, the only place defaults live.

A run is a YAML file whose top level is :class:`RunConfig`, plus dotted ``--set trainer.lr=1e-5``
overrides. Every model forbids unknown keys, constrains every number and documents every field
(``asyncrl config explain``); :func:`load_config` turns any user mistake into one :class:`ConfigError`
naming the field path, the bad value and what is allowed. One module per role's section, named after
the package that reads it, on :mod:`.base`; :mod:`.run` assembles them (docs/configuration.md). Every
public name is re-exported here: ``from asyncrl.config import X``.
"""

from __future__ import annotations

from asyncrl.config.aliases import RENAMED
from asyncrl.config.base import Section, default_of, variants
from asyncrl.config.control import ControlConfig, RedisStateConfig, SQLiteStateConfig, StateStoreConfig
from asyncrl.config.cost import CostAssumptionsConfig, CostConfig, PriceConfig
from asyncrl.config.credit import (
    CreditConfig,
    HeadValueModelConfig,
    SeparateValueModelConfig,
    ValueModelConfig,
)
from asyncrl.config.env import (
    ConstantLatencyConfig,
    DatasetConfig,
    EnvConfig,
    FaultConfig,
    GuardConfig,
    LatencyConfig,
    LognormalLatencyConfig,
    NoLatencyConfig,
    ParetoLatencyConfig,
    ReasoningGymConfig,
    ReasoningGymDatasetConfig,
    SandboxConfig,
)
from asyncrl.config.env_class import ClassEnvConfig
from asyncrl.config.explain import explain
from asyncrl.config.launch import (
    ExternalLauncherConfig,
    LauncherConfig,
    LocalLauncherConfig,
    RayLauncherConfig,
)
from asyncrl.config.loader import ConfigError, apply_overrides, config_hash, dump_yaml, load_config
from asyncrl.config.model import LoraConfig, ModelConfig
from asyncrl.config.orchestrator import (
    BreakerConfig,
    CurriculumConfig,
    DriftConfig,
    ElasticConfig,
    ExplorationConfig,
    GovernorConfig,
    OrchestratorConfig,
    SignalConfig,
)
from asyncrl.config.rollout import (
    EngineConfig,
    GatewayConfig,
    HFEngineConfig,
    RolloutConfig,
    SamplingConfig,
    TreeConfig,
    VLLMEngineConfig,
)
from asyncrl.config.run import (
    SECTIONS,
    RolloutSettings,
    RunConfig,
    TrainerSettings,
    max_trainer_held,
    min_queue_capacity,
    quiet_env,
)
from asyncrl.config.telemetry import TelemetryConfig
from asyncrl.config.trainer import AlgoConfig, ResolvedSFT, SFTConfig, TrainerConfig
from asyncrl.config.transport import EmbeddedTransportConfig, RedisTransportConfig, TransportConfig
from asyncrl.config.weights import CanaryConfig, LocalWeightsConfig, SharedWeightsConfig, WeightsConfig

__all__ = [
    "RENAMED",
    "SECTIONS",
    "AlgoConfig",
    "BreakerConfig",
    "CanaryConfig",
    "ClassEnvConfig",
    "ConfigError",
    "ConstantLatencyConfig",
    "ControlConfig",
    "CostAssumptionsConfig",
    "CostConfig",
    "CreditConfig",
    "CurriculumConfig",
    "DatasetConfig",
    "DriftConfig",
    "ElasticConfig",
    "EmbeddedTransportConfig",
    "EngineConfig",
    "EnvConfig",
    "ExplorationConfig",
    "ExternalLauncherConfig",
    "FaultConfig",
    "GatewayConfig",
    "GovernorConfig",
    "GuardConfig",
    "HFEngineConfig",
    "HeadValueModelConfig",
    "LatencyConfig",
    "LauncherConfig",
    "LocalLauncherConfig",
    "LocalWeightsConfig",
    "LognormalLatencyConfig",
    "LoraConfig",
    "ModelConfig",
    "NoLatencyConfig",
    "OrchestratorConfig",
    "ParetoLatencyConfig",
    "PriceConfig",
    "RayLauncherConfig",
    "ReasoningGymConfig",
    "ReasoningGymDatasetConfig",
    "RedisStateConfig",
    "RedisTransportConfig",
    "ResolvedSFT",
    "RolloutConfig",
    "RolloutSettings",
    "RunConfig",
    "SFTConfig",
    "SQLiteStateConfig",
    "SamplingConfig",
    "SandboxConfig",
    "Section",
    "SeparateValueModelConfig",
    "SharedWeightsConfig",
    "SignalConfig",
    "StateStoreConfig",
    "TelemetryConfig",
    "TrainerConfig",
    "TrainerSettings",
    "TransportConfig",
    "TreeConfig",
    "VLLMEngineConfig",
    "ValueModelConfig",
    "WeightsConfig",
    "apply_overrides",
    "config_hash",
    "default_of",
    "dump_yaml",
    "explain",
    "load_config",
    "max_trainer_held",
    "min_queue_capacity",
    "quiet_env",
    "variants",
]
