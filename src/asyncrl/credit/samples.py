"""Credit sample files: a few trained trajectories with the credit each segment received.

The trainer writes ``{run_dir}/credit/samples-{step:08d}.msgpack`` every ``credit.sample_every``
steps: one MessagePack-encoded :class:`CreditSampleFile` (schema-versioned, never pickle).
``asyncrl credit show`` and ``asyncrl credit ablate`` read them; so does the run report.

The file holds the batch's groups as groups (:class:`CreditGroup`), as the group travelled from the
worker to the trainer: a reader never rebuilds a group from its members' ``group_id``. Schema 1 (the
members flat) is refused with one line saying which asyncrl wrote it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from asyncrl.durable import replace_file
from asyncrl.errors import UserError
from asyncrl.records import Trajectory

SAMPLES_SCHEMA = 2
"""2: groups whole (:class:`CreditGroup`); 1: the samples flat, the group read off each one."""
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


class CreditGroup(msgspec.Struct, kw_only=True):
    """The sampled members of one training group, in batch order."""

    id: str
    """The group's id (``records.Group.id``)."""
    samples: list[CreditSample]
    """All its members when the file's ``whole`` is set, else the ones drawn at random."""


class CreditSampleFile(msgspec.Struct, kw_only=True):
    step: int
    strategy: str
    groups: list[CreditGroup]
    whole: bool
    """Each group holds every member it trained with (tree credit and tree rollouts: ``credit show``
    draws the tree, ``credit ablate --siblings`` compares branches); else members drawn at random."""
    schema_version: int = SAMPLES_SCHEMA

    @property
    def samples(self) -> list[CreditSample]:
        """Every sampled trajectory, group by group."""
        return [s for g in self.groups for s in g.samples]


class _Schema(msgspec.Struct):
    """What every schema of the file has: read first, so an old file gets its own message."""

    schema_version: int


def write_samples(run_dir: Path, data: CreditSampleFile) -> Path:
    out = Path(run_dir) / SAMPLES_DIR / f"samples-{data.step:08d}.msgpack"
    out.parent.mkdir(parents=True, exist_ok=True)
    replace_file(out, msgspec.msgpack.encode(data))
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
        raw = f.read_bytes()
        try:
            version = msgspec.msgpack.decode(raw, type=_Schema).schema_version
            if version != SAMPLES_SCHEMA:
                raise UserError(
                    f"credit sample file {str(f)!r} has schema {version} and this asyncrl reads "
                    f"schema {SAMPLES_SCHEMA} (groups whole); read it with the asyncrl version that wrote it"
                )
            out.append(msgspec.msgpack.decode(raw, type=CreditSampleFile))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise UserError(f"credit sample file {str(f)!r} is not readable: {exc}") from None
    return out
