"""The rollout side of the weight-sync canary: after a load, ask the engine and compare with the manifest.

What is recorded and compared, and why: :mod:`asyncrl.policy.canary`. What happens on a mismatch
(:class:`~asyncrl.rollout.worker.WeightFollower`): the version is refused — the engine goes back to
the previous good version, so no trajectory is produced under the bad one — a ``weights/canary_failed``
event carries the evidence (the orchestrator turns it into a ``weight_canary`` alert, ``alerts.jsonl``),
and the version is reported like a corrupt one (``RunState.report_corrupt``): the trainer publishes its
weights again as a new version.

A check has two parts (:meth:`WeightCanary.begin`, :meth:`WeightCanary.finish`). The fingerprint is read
right after the load and refuses the version before anything runs on it. The probe either runs at once
(:meth:`WeightCanary.verify`), or, in a rollout worker, rides along the first generation call after the load
(:meth:`~asyncrl.engine.base.GenerationEngine.generate_probed`; :class:`~asyncrl.engine.batcher.TurnBatcher`
holds the call's samples until the verdict and, on a refusal, generates them again under the good version).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncrl.config import VLLMEngineConfig
from asyncrl.policy.canary import (
    CanaryRecord,
    Fingerprint,
    Verdict,
    check,
    expected_fingerprint,
    probe_tolerance,
)
from asyncrl.telemetry.reports import CanaryFigures

if TYPE_CHECKING:
    from asyncrl.config import CanaryConfig, RunConfig
    from asyncrl.engine.base import GenerationEngine
    from asyncrl.weights.base import LoadedWeights


@dataclass
class PendingCheck:
    """A check begun (:meth:`WeightCanary.begin`): the version, its record, the fingerprint read from the
    engine and the one expected, and the seconds spent so far; its probe still to come."""

    loaded: LoadedWeights
    record: CanaryRecord
    fingerprint: Fingerprint | None
    want: Fingerprint
    seconds: float


class WeightCanaryError(RuntimeError):
    """A refused version could not be undone: no earlier good version, or that one fails too."""


class WeightCanary:
    """Checks an engine against a loaded version's canary record, and counts the checks."""

    def __init__(self, cfg: CanaryConfig, dtypes: tuple[str, ...]) -> None:
        """``dtypes``: the trainer's and the engine's compute dtypes (they set the probe's tolerance)."""
        self.cfg, self.tolerance = cfg, probe_tolerance(cfg, dtypes)
        self.checked = self.failed = self.unverified = self.rode = 0
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
        pending = self.begin(engine, loaded, count=count)
        if pending is None:
            return None
        t0 = time.perf_counter()
        probe = engine.probe(pending.record.probe_ids)
        pending.seconds += time.perf_counter() - t0
        return self.finish(pending, probe, count=count)

    def begin(
        self, engine: GenerationEngine, loaded: LoadedWeights, *, count: bool = True
    ) -> PendingCheck | None:
        """The first part of :meth:`verify`: the fingerprint read from the engine now, the probe to come
        (:meth:`finish`); ``None`` for a version published without a record (counted unverified)."""
        record = CanaryRecord.from_manifest(loaded.manifest)
        if record is None:
            self.unverified += count
            return None
        t0 = time.perf_counter()
        got = engine.fingerprint(sorted(record.fingerprint.tensors))
        want = expected_fingerprint(record, got.dtype, loaded.tensors) if got else record.fingerprint
        return PendingCheck(loaded, record, got, want, time.perf_counter() - t0)

    def early(self, pending: PendingCheck) -> Verdict:
        """The fingerprint's verdict alone (nothing counted): what refuses a load before its probe runs."""
        return self._check(pending, None)

    def finish(
        self, pending: PendingCheck, probe: list[float] | None, *, count: bool = True, rode: bool = False
    ) -> Verdict | None:
        """The verdict with the engine's ``probe`` of the record's ids (``None``: it has none; with no
        fingerprint either, the load is counted unverified and ``None`` returned); ``rode``: the probe ran
        inside a generation call."""
        if pending.fingerprint is None and probe is None:
            self.unverified += count
            return None
        t0 = time.perf_counter()
        verdict = self._check(pending, probe)
        if count:
            self.seconds += pending.seconds + time.perf_counter() - t0
            self.checked += 1
            self.rode += rode
            self.failed += not verdict.ok
            self.last = verdict
        return verdict

    def _check(self, pending: PendingCheck, probe: list[float] | None) -> Verdict:
        return check(
            pending.record,
            pending.fingerprint,
            pending.want,
            probe,
            rtol=self.cfg.fingerprint_rtol,
            tolerance=self.tolerance,
        )

    def figures(self) -> CanaryFigures:
        """The canary's counts for the worker's report (``weights/canary_*``)."""
        last = self.last.probe_mean_abs_diff if self.last is not None else None
        return CanaryFigures(
            canary_checked=float(self.checked),
            canary_failed=float(self.failed),
            canary_unverified=float(self.unverified),
            canary_rode=float(self.rode),
            canary_seconds=self.seconds,
            canary_probe_diff=float(last) if last is not None else 0.0,
        )
