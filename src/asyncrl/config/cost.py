"""``cost``: the cost ledger, prices and the assumptions of ``asyncrl cost estimate`` (:mod:`asyncrl.cost`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from asyncrl.config.base import Section


class PriceConfig(Section):
    """Example prices (replace with your own): dollars per unit."""

    device_hour: dict[str, float] = Field(
        default_factory=lambda: {"cpu": 0.05, "a100": 1.8, "h100": 2.5, "h200": 3.2}
    )
    """Dollars per device-hour by device type; a role process occupies one device (on CPU runs, one core)."""
    cpu_core_hour: float = Field(0.04, ge=0)
    """One CPU core for an hour (environments, reward computation)."""
    env_call: float = Field(0.00001, ge=0)
    """One environment / tool call."""
    gb_stored_month: float = Field(0.02, ge=0)
    """One GB of checkpoints, weights or queue data kept for a month."""
    gb_transferred: float = Field(0.01, ge=0)
    """One GB moved through the queue or the weight store."""


class CostAssumptionsConfig(Section):
    """Assumptions of ``asyncrl cost estimate``, the budget of a run before it starts (docs/cost.md).

    Each can also be given as a flag (``--tokens-per-trajectory 250``); ``--from-run RUN`` measures
    all of them on an earlier run instead."""

    trajectories: float = Field(10_000, ge=0)
    """N: trajectories generated."""
    tokens_per_trajectory: float = Field(100, ge=0)
    """L: model (sampled) tokens per trajectory."""
    rollout_tokens_per_s: float = Field(1_000, ge=0)
    """P_rollout: generated model tokens per rollout device-second (idle included)."""
    train_tokens_per_s: float = Field(1_000, ge=0)
    """P_train: trained model tokens per trainer device-second (idle included)."""
    env_calls_per_trajectory: float = Field(3, ge=0)
    """E: environment calls per trajectory."""
    env_seconds_per_call: float = Field(0.1, ge=0)
    """Wall time a call occupies a tool server's core."""
    reward_seconds_per_trajectory: float = Field(0.0, ge=0)
    """Seconds of answer verification per trajectory (CPU)."""
    value_model_fraction: float = Field(0.0, ge=0)
    """Value-model compute as a fraction of training compute."""
    transfer_bytes_per_trajectory: float = Field(20_000, ge=0)
    """Queue plus weight-store traffic per trajectory."""
    stored_bytes: float = Field(1e8, ge=0)
    """Bytes kept (checkpoints, weights, queue) during the run."""
    wall_seconds: float = Field(3600, ge=0)
    """Run duration (for storage months and the cost rate)."""
    startup_device_seconds: float = Field(0.0, ge=0)
    """Fixed device time before the roles produce anything (interpreter and model start-up)."""


class CostConfig(Section):
    """Cost ledger settings."""

    enabled: bool = True
    """Keep a cost ledger for the run."""
    device: str = "cpu"
    """Device type the roles run on; its hourly price is ``prices.device_hour[device]``."""
    prices: PriceConfig = Field(default_factory=PriceConfig)
    reward_cache: bool = True
    """Cache verdicts of deterministic answer verifiers by (environment, task, answer) (a cost lever)."""
    reward_cache_entries: int = Field(100_000, ge=1, le=100_000_000)
    """Verdicts the reward cache keeps in each rollout worker; the least recently used go first."""
    assumptions: CostAssumptionsConfig = Field(default_factory=CostAssumptionsConfig)

    @model_validator(mode="after")
    def _priced(self) -> CostConfig:
        if self.device not in self.prices.device_hour:
            raise ValueError(
                f"cost.device {self.device!r} has no price; cost.prices.device_hour has {sorted(self.prices.device_hour)}"
            )
        return self
