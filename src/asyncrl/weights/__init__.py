"""Versioned weight snapshots published by the trainer and loaded by rollout workers.

Snapshots are published atomically (temp dir + fsync + rename, then the ``latest`` pointer
via ``os.replace``), verified by sha256 on load, and :meth:`WeightStore.load_latest` falls
back to the newest older valid version when the newest is corrupt or partial. Tensors are
stored with safetensors; manifests and the pointer are JSON (no pickle). Details:
:mod:`asyncrl.weights.store` and ``docs/transport.md``.
"""

from __future__ import annotations

from asyncrl.weights.store import (
    MANIFEST_FILE,
    MODEL_FILE,
    POINTER_FILE,
    CorruptSnapshotError,
    LoadedWeights,
    LocalWeightStore,
    SnapshotNotFoundError,
    WeightStore,
    make_weight_store,
    version_dirname,
)

__all__ = [
    "MANIFEST_FILE",
    "MODEL_FILE",
    "POINTER_FILE",
    "CorruptSnapshotError",
    "LoadedWeights",
    "LocalWeightStore",
    "SnapshotNotFoundError",
    "WeightStore",
    "make_weight_store",
    "version_dirname",
]
