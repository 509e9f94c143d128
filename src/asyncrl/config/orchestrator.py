"""``orchestrator``: what the orchestrator process decides (:mod:`asyncrl.orchestrator`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from asyncrl.config.base import Section


class OrchestratorConfig(Section):
    """Flow control: training mode and the staleness budget."""

    mode: Literal["async", "one_step_off", "sync"] = "async"
    """``sync``: generate one batch, train, publish; ``one_step_off``: overlap one batch;
    ``async``: fully asynchronous within ``max_staleness``."""
    max_staleness: int = Field(2, ge=0, le=1000)
    """Largest allowed version lag of the oldest token of a trained sample."""
    stale_policy: Literal["drop", "downweight"] = "drop"
    """What happens to a sample older than ``max_staleness``."""
    watchdog_s: float = Field(600.0, ge=0, le=86400)
    """Stall watchdog: when neither a new weight version (a trainer step or publish) nor a newly accepted
    trajectory has been seen for this many seconds, the orchestrator raises a ``stall`` alert and prints
    what it last saw (versions, queue depth, leases, fates), again every period while it lasts, instead of
    hanging silently. 0 turns it off. Set it well above the slowest step plus a trainer restart."""
    high_watermark: float = Field(0.9, gt=0, le=1)
    """Queue fill fraction at which admission of new episodes pauses."""
    low_watermark: float = Field(0.5, ge=0, lt=1)
    """Queue fill fraction at which admission resumes."""
    governor_window: int = Field(5, ge=1, le=1000)
    """Staleness governor (rule 6, ``mode: async``): trainer reports in a row whose mean sample age is above
    ``max_staleness`` before the effective lag is lowered by one."""
    governor_fill_window: int = Field(10, ge=1, le=10000)
    """Staleness governor: orchestrator ticks in a row of queue fill under ``governor_low_fill`` before the
    effective ``sync_every`` is lowered by one (or at or above it before it is raised back)."""
    governor_low_fill: float = Field(0.3, ge=0, le=1)
    """Staleness governor: a queue filled below this fraction is under-used — publish weights more often."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark})"
            )
        return self
