"""The rollout side of the weight-sync canary: after a load, ask the engine and compare with the manifest.

What is recorded and compared, and why: :mod:`asyncrl.policy.canary`. What happens on a mismatch
(:class:`~asyncrl.rollout.worker.WeightFollower`): the version is refused — the engine goes back to
the previous good version before any generation runs, so no trajectory is produced under the bad
one — a ``weights/canary_failed`` event carries the evidence (the orchestrator turns it into a
``weight_canary`` alert, ``alerts.jsonl``), and the version is reported like a corrupt one
(``RunState.report_corrupt``): the trainer publishes its weights again as a new version.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from asyncrl.config import VLLMEngineConfig
from asyncrl.policy.canary import CanaryRecord, Verdict, check, expected_fingerprint, probe_tolerance
from asyncrl.telemetry.reports import CanaryFigures

if TYPE_CHECKING:
    from asyncrl.config import CanaryConfig, RunConfig
    from asyncrl.engine.base import GenerationEngine
    from asyncrl.weights.base import LoadedWeights


class WeightCanaryError(RuntimeError):
    """A refused version could not be undone: no earlier good version, or that one fails too."""


class WeightCanary:
    """Checks an engine against a loaded version's canary record, and counts the checks."""

    def __init__(self, cfg: CanaryConfig, dtypes: tuple[str, ...]) -> None:
        """``dtypes``: the trainer's and the engine's compute dtypes (they set the probe's tolerance)."""
        self.cfg, self.tolerance = cfg, probe_tolerance(cfg, dtypes)
        self.checked = self.failed = self.unverified = 0
        self.seconds = 0.0
        self.last: Verdict | None = None

    @classmethod
    def of(cls, cfg: RunConfig) -> WeightCanary | None:
        """The canary of a run's workers (``None`` when ``weights.canary.enabled`` is off)."""

        if not cfg.weights.canary.enabled:
            return None
        engine = cfg.rollout.engine
        served = engine.vllm_dtype if isinstance(engine, VLLMEngineConfig) else cfg.model.dtype
        return cls(cfg.weights.canary, (cfg.model.dtype, served))

    def verify(
        self, engine: GenerationEngine, loaded: LoadedWeights, *, count: bool = True
    ) -> Verdict | None:
        """The engine (just loaded with ``loaded``) against the version's record; ``None`` when there is
        nothing to compare (a version published without a canary, or an engine that reports neither part)."""
        record = CanaryRecord.from_manifest(loaded.manifest)
        t0 = time.perf_counter()
        got_fp = engine.fingerprint(sorted(record.fingerprint.tensors)) if record else None
        got_probe = engine.probe(record.probe_ids) if record else None
        if record is None or (got_fp is None and got_probe is None):
            self.unverified += count
            return None
        want = expected_fingerprint(record, got_fp.dtype, loaded.tensors) if got_fp else record.fingerprint
        verdict = check(
            record, got_fp, want, got_probe, rtol=self.cfg.fingerprint_rtol, tolerance=self.tolerance
        )
        if count:
            self.seconds += time.perf_counter() - t0
            self.checked += 1
            self.failed += not verdict.ok
            self.last = verdict
        return verdict

    def figures(self) -> CanaryFigures:
        """The canary's counts for the worker's report (``weights/canary_*``)."""
        last = self.last.probe_mean_abs_diff if self.last is not None else None
        return CanaryFigures(
            canary_checked=float(self.checked),
            canary_failed=float(self.failed),
            canary_unverified=float(self.unverified),
            canary_seconds=self.seconds,
            canary_probe_diff=float(last) if last is not None else 0.0,
        )
