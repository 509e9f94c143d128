"""The weight-store interface: numbered weight versions, one publisher, readers in any process.

Backends: :class:`~asyncrl.weights.local.LocalWeightStore` (``weights.kind: local``, a directory) and
:class:`~asyncrl.weights.shared.SharedWeightStore` (``shared``: a shared filesystem, the pointer in
Redis); :func:`asyncrl.weights.make_weight_store` picks one. Layout and atomic publish:
:mod:`asyncrl.weights.local`.

Verification and fallback (readers)
-----------------------------------
:meth:`WeightStore.load` reads ``manifest.json`` (it must parse and name the directory's
version) and the whole ``model.safetensors`` into memory once, checks byte size and sha256 of
those very bytes, and only then decodes them: the tensors returned are exactly the verified
bytes, even if the version is deleted meanwhile. Any failure raises
:class:`CorruptSnapshotError` (:class:`SnapshotNotFoundError` if the version is absent).

:meth:`WeightStore.load_latest` never raises for a bad snapshot: it loads the pointer's target,
and if that is corrupt or partial it **falls back** to the newest older valid version,
reporting ``fell_back_from`` (the version it wanted), ``problems`` and a ``logging`` warning.
If a version vanished because the writer published newer ones and retention removed it, the
pointer is re-read and loading restarts from the new target (that is not a fallback). With no
valid version at all it returns ``None``. Directories newer than the pointer are snapshots
whose publish did not finish; readers ignore them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

MODEL_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
POINTER_FILE = "latest"


class CorruptSnapshotError(RuntimeError):
    """A weight snapshot is missing, partial, or fails verification."""


class SnapshotNotFoundError(CorruptSnapshotError):
    """The requested version has no snapshot directory (never published, or deleted by retention)."""


@dataclass
class LoadedWeights:
    """A verified snapshot, loaded on CPU."""

    version: int
    path: Path
    tensors: dict[str, torch.Tensor]
    manifest: dict[str, Any]
    fell_back_from: int | None = None
    """The version :meth:`WeightStore.load_latest` wanted when it had to return an older one."""
    problems: list[str] = field(default_factory=list)
    """What was wrong with the versions skipped on the way (empty on a clean load)."""


class WeightStore(ABC):
    """Numbered weight versions: one publisher, any number of readers in any process."""

    @abstractmethod
    def publish(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        *,
        step: int,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Atomically publish ``tensors`` as ``version`` (> every existing version) and return its path."""

    @abstractmethod
    def latest_version(self) -> int | None:
        """The pointer's version (cheap: one small file read); ``None`` before the first publish."""

    @abstractmethod
    def load_latest(self) -> LoadedWeights | None:
        """The newest valid snapshot, falling back past corrupt ones; ``None`` if there is none."""

    @abstractmethod
    def load(self, version: int) -> LoadedWeights:
        """One verified snapshot, or :class:`CorruptSnapshotError`."""

    @abstractmethod
    def versions(self) -> list[int]:
        """Versions that have a snapshot directory, ascending (not verified)."""

    def newest_version(self) -> int | None:
        """The newest version of the pointer and the snapshot directories: the one a publish must exceed.
        A publisher killed between renaming its snapshot into place and moving the pointer leaves a
        directory newer than the pointer; a resumed publisher that counted the pointer alone would try
        to publish that version again."""
        found = [*self.versions(), self.latest_version()]
        return max((v for v in found if v is not None), default=None)


def version_dirname(version: int) -> str:
    """Directory name of a version's snapshot (``v000007``)."""
    return f"v{version:06d}"


def check_version(version: object, what: str = "version") -> int:
    """``version`` as a version number (an int >= 0), or ``ValueError`` naming ``what``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{what} must be an int >= 0, got {version!r}")
    return version
