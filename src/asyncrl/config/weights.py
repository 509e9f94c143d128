"""``weights``: the versioned weight store and its weight-sync canary (:mod:`asyncrl.weights`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag

from asyncrl.config.base import RedisUrl, Section, kind_of


class CanaryConfig(Section):
    """The weight-sync canary: after every weight load a rollout worker checks that its engine serves the
    version the trainer published (a fingerprint of the tensors and the log-probs of a fixed probe prompt,
    against the version's manifest), and refuses it on a mismatch (docs/reliability.md#weight-sync-canary)."""

    enabled: bool = True
    """Record the canary at every publish and check it at every load. Off: versions are loaded unchecked."""
    probe_tokens: int = Field(32, ge=2, le=4096)
    """Length of the probe prompt in tokens (capped by the context). Its cost per load is one forward
    pass of this many tokens in the engine and, in the built-in engine, a prefill of half of them and
    a decode step per token of the other half (its generation path); one forward in the trainer per
    publish."""
    probe_tolerance: float | None = Field(None, gt=0)
    """Largest ``mean |Δ log p|`` over the probe tokens between the engine and the trainer. Unset: by
    dtype, ``probe_tolerance_float32`` when the trainer and the engine both compute in float32, else
    ``probe_tolerance_half``."""
    probe_tolerance_float32: float = Field(1e-4, gt=0)
    """Default tolerance in float32, where engine and trainer differ by rounding only, while one LoRA step
    moves the probe further (figures: docs/reliability.md#weight-sync-canary)."""
    probe_tolerance_half: float = Field(0.2, gt=0)
    """Default tolerance when either side computes in bfloat16 or float16: it catches only gross failures;
    version identity then rests on the fingerprint."""
    ride_along: bool = True
    """In a rollout worker, run the probe inside the first generation call after a load: the built-in
    engine teacher-forces its rows beside the call's own, so its decode steps cost a few rows of the call's
    steps rather than steps of their own (~1 s a load on SmolLM2-135M, docs/benchmarks.md). The call's
    samples are held until the verdict; a refused version's are generated again under the version kept.
    The fingerprint is still checked at the load. Off: the whole check runs at the load."""
    fingerprint_rtol: float = Field(1e-6, gt=0, le=1)
    """Tolerance of each fingerprint statistic relative to its scale (``sqrt(Σx²)`` for sums, ``Σx²`` for
    sums of squares): only reduction order differs in a bitwise copy (docs/reliability.md)."""


class _WeightsBase(Section):
    """The versioned weight store."""

    kind: str = "local"
    """``local``: snapshots under the run directory; ``shared``: snapshots on a shared filesystem (``path``)
    with the latest-version pointer in Redis (``redis_url``), for roles on several machines."""
    keep: int = Field(3, ge=1, le=10000)
    """Snapshots kept (older ones are deleted)."""
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    """The weight-sync canary: every load is checked against what the trainer published."""


class LocalWeightsConfig(_WeightsBase):
    """Snapshots under the run directory."""

    kind: Literal["local"] = "local"


class SharedWeightsConfig(_WeightsBase):
    """Snapshots on a shared filesystem, the latest-version pointer in Redis."""

    kind: Literal["shared"] = "shared"
    path: str | None = None
    """Directory on a filesystem every machine mounts (at the same path); the run's snapshots
    go to ``{path}/{run directory name}/``. Unset: ``{run_dir}/weights`` (the run directory is shared)."""
    redis_url: RedisUrl = "redis://127.0.0.1:6379/0"
    """Redis holding the latest-version pointer (same URL rules as transport.redis_url)."""
    socket_timeout_s: float = Field(10.0, gt=0, le=3600)
    """A pointer read or write without an answer for this long fails and is retried under the one retry
    policy."""


WeightsConfig: TypeAlias = Annotated[
    Annotated[LocalWeightsConfig, Tag("local")] | Annotated[SharedWeightsConfig, Tag("shared")],
    Discriminator(kind_of("local")),
]
"""``weights``: one model per ``kind``."""
