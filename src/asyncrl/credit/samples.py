"""Credit sample files: a few trained trajectories with the credit each segment received.

The trainer writes ``{run_dir}/credit/samples-{step:08d}.msgpack`` every ``credit.sample_every``
steps: one MessagePack-encoded :class:`CreditSampleFile` (schema-versioned, never pickle).
``asyncrl credit show`` and ``asyncrl credit ablate`` read them; so does the run report.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from asyncrl.errors import UserError
from asyncrl.records import Trajectory

SAMPLES_SCHEMA = 1
SAMPLES_DIR = "credit"


class SegmentCredit(msgspec.Struct, kw_only=True):
    """One segment (model turn + the observation it caused) and what the credit step made of it."""

    start: int
    end: int
    """Token span ``[start, end)`` in the trajectory's flat token sequence."""
    process_reward: float
    v_before: float | None = None
    """Value model's estimate at the boundary before the segment (None without a value model)."""
    v_after: float | None = None
    """Estimate after the segment; for the last segment, the observed final reward."""
    credit: float
    """The segment's advantage: the mean per-token advantage over its model tokens."""


class CreditSample(msgspec.Struct, kw_only=True):
    trajectory: Trajectory
    segments: list[SegmentCredit]
    outcome_advantage: float
    """The trajectory's outcome (group-baseline) advantage."""


class CreditSampleFile(msgspec.Struct, kw_only=True):
    step: int
    strategy: str
    samples: list[CreditSample]
    schema_version: int = SAMPLES_SCHEMA


def write_samples(run_dir: Path, data: CreditSampleFile) -> Path:
    out = Path(run_dir) / SAMPLES_DIR / f"samples-{data.step:08d}.msgpack"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(msgspec.msgpack.encode(data))
    tmp.replace(out)
    return out


def read_samples(run_dir: Path) -> list[CreditSampleFile]:
    """Every sample file of a run, oldest step first; a clear error when there are none."""
    folder = Path(run_dir) / SAMPLES_DIR
    if not Path(run_dir).is_dir():
        raise UserError(f"run directory {str(run_dir)!r} does not exist")
    files = sorted(folder.glob("samples-*.msgpack"))
    if not files:
        raise UserError(
            f"{str(run_dir)!r} has no credit samples ({SAMPLES_DIR}/samples-*.msgpack); they are written "
            "by the trainer every credit.sample_every steps (0 disables them)"
        )
    out: list[CreditSampleFile] = []
    for f in files:
        try:
            data = msgspec.msgpack.decode(f.read_bytes(), type=CreditSampleFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UserError(f"credit sample file {str(f)!r} is not readable: {exc}") from None
        if data.schema_version != SAMPLES_SCHEMA:
            raise UserError(
                f"{str(f)!r} has schema {data.schema_version}, this asyncrl reads {SAMPLES_SCHEMA}"
            )
        out.append(data)
    return out
