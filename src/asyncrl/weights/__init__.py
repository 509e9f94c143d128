"""Versioned weight snapshots published by the trainer and loaded by rollout workers: the interface and
its reader semantics in :mod:`asyncrl.weights.base`, backends :mod:`asyncrl.weights.local` and
:mod:`asyncrl.weights.shared`, all in ``docs/transport.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.weights.base import (
    MANIFEST_FILE,
    MODEL_FILE,
    POINTER_FILE,
    CorruptSnapshotError,
    SnapshotNotFoundError,
    WeightStore,
    version_dirname,
)
from asyncrl.weights.local import LocalWeightStore

if TYPE_CHECKING:  # only needed for types
    from asyncrl.config import CanaryConfig, WeightsConfig
    from asyncrl.policy.model import Policy

__all__ = [
    "MANIFEST_FILE",
    "MODEL_FILE",
    "POINTER_FILE",
    "CorruptSnapshotError",
    "LocalWeightStore",
    "SnapshotNotFoundError",
    "WeightStore",
    "make_weight_store",
    "publish_policy",
    "version_dirname",
]


def make_weight_store(cfg: WeightsConfig, run_dir: Path) -> WeightStore:
    """The run's weight store; every process opens its own.

    ``local``: ``run_dir/weights``. ``shared``: ``{weights.path}/{run_dir name}`` (or ``run_dir/weights``
    when no path is set) with the pointer in Redis at ``weights.redis_url``.
    """
    if cfg.kind == "local":
        return LocalWeightStore(Path(run_dir) / "weights", keep=cfg.keep)
    if cfg.kind == "shared":
        from asyncrl.weights.shared import SharedWeightStore  # lazy: local users skip redis

        root = Path(cfg.path) / Path(run_dir).name if cfg.path else Path(run_dir) / "weights"
        return SharedWeightStore(root, cfg.redis_url, keep=cfg.keep, socket_timeout_s=cfg.socket_timeout_s)
    raise ValueError(f"unknown weights.kind {cfg.kind!r}; use 'local' or 'shared'")


def publish_policy(
    store: WeightStore, version: int, policy: Policy, *, step: int, canary: CanaryConfig
) -> Path:
    """Publish ``policy``'s weights (:meth:`Policy.state_dict_tensors`: all of them, or the LoRA adapter)
    as ``version``; with ``canary.enabled`` the manifest's ``extra.canary`` holds the weight-sync canary's
    record of exactly those tensors and of the policy's probe log-probs (:mod:`asyncrl.policy.canary`)."""
    tensors = policy.state_dict_tensors()
    extra = None
    if canary.enabled:
        from asyncrl.policy.canary import publish_record

        extra = {"canary": publish_record(policy, tensors, canary)}
    return store.publish(version, tensors, step=step, extra=extra)
