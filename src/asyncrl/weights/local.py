"""The local weight store (``weights.kind: local``): snapshots and their pointer in one directory.

Layout of ``run_dir/weights/``::

    latest                  {"version": N}: the newest published version (the pointer)
    v000007/                one immutable snapshot per version
        model.safetensors   the tensors (safetensors: data only, never code)
        manifest.json       version, sha256 + byte size of model.safetensors, step, created_at, extra
    .tmp-v000008-*/         a snapshot being written (never read)
    .trash-v000005-*/       a snapshot being deleted (never read)

Atomicity (writer)
------------------
A snapshot is written into a ``.tmp-*`` directory next to the final one, both files and the
directory are fsynced, and the directory is ``os.rename``\\ d to ``v{N:06d}`` (atomic, same
filesystem), then the parent is fsynced (:func:`asyncrl.durable.staged_dir`, the mechanism trainer
checkpoints use too). Only then is the ``latest`` pointer replaced
(temp file + fsync + ``os.replace`` + parent fsync). So a ``v*`` directory is always complete
unless its files were damaged afterwards, and the pointer never names a version whose
directory was not fully written first. Versions increase strictly. There is **one publisher
per store** (the trainer); it removes leftover ``.tmp-*``/``.trash-*`` entries of crashed
publishes. Retention keeps the newest ``keep`` versions and always the pointer's target; a
version is deleted by renaming it to ``.trash-*`` first (readers then see it vanish as a
whole, never half-deleted) and removing that.

Readers verify and fall back as :mod:`asyncrl.weights.base` states.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from asyncrl.durable import (
    discard,
    fsync_dir,
    hash_file,
    remove_stale,
    replace_file,
    staged_dir,
    to_prune,
    write_durably,
)
from asyncrl.weights.base import (
    MANIFEST_FILE,
    MODEL_FILE,
    POINTER_FILE,
    CorruptSnapshotError,
    LoadedWeights,
    SnapshotNotFoundError,
    WeightStore,
    check_version,
    version_dirname,
)

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "asyncrl-weights"
MANIFEST_FORMAT_VERSION = 1

_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_MAX_RESTARTS = 100


def _prepare_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors; tensors sharing storage (tied weights) are cloned."""
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError("tensors must be a non-empty dict[str, torch.Tensor]")
    out: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"tensor names must be non-empty strings, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"tensors[{name!r}] is a {type(tensor).__name__}, not a torch.Tensor")
        t = tensor.detach().to("cpu").contiguous()
        if t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in storages:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            storages.add(ptr)
        out[name] = t
    return out


def parse_pointer(raw: bytes) -> tuple[int | None, str | None]:
    """(version, None) of a stored pointer ``{"version": N}``, or (None, why it is corrupt)."""
    try:
        return check_version(json.loads(raw)["version"]), None
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"latest pointer is corrupt ({exc}): {bytes(raw)[:80]!r}"


class LocalWeightStore(WeightStore):
    """Snapshots under one directory on a local (POSIX) filesystem (``weights.kind: local``).

    The pointer lives in the file ``latest``; :class:`~asyncrl.weights.shared.SharedWeightStore`
    reuses everything here and only moves the pointer to Redis (``_read_pointer``/``_write_pointer``).
    """

    def __init__(self, root: str | Path, *, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        self._publish_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LocalWeightStore({str(self.root)!r}, keep={self.keep})"

    # ---- pointer ---------------------------------------------------------------------------
    def _read_pointer(self) -> tuple[int | None, str | None]:
        """(version, problem): ``(None, None)`` if there is no pointer, a problem if it is unreadable."""
        try:
            raw = (self.root / POINTER_FILE).read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"latest pointer unreadable: {exc}"
        return parse_pointer(raw)

    def _write_pointer(self, version: int) -> None:
        replace_file(self.root / POINTER_FILE, json.dumps({"version": version}).encode())
        fsync_dir(self.root)

    # ---- reading ---------------------------------------------------------------------------
    def versions(self) -> list[int]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        matches = [(e, _VERSION_DIR.match(e.name)) for e in entries]
        return sorted(int(m.group(1)) for e, m in matches if m and e.is_dir(follow_symlinks=False))

    def latest_version(self) -> int | None:
        version, problem = self._read_pointer()
        if problem is not None:
            on_disk = self.versions()
            logger.warning("weight store %s: %s; using the newest directory instead", self.root, problem)
            return on_disk[-1] if on_disk else None
        return version

    def load(self, version: int) -> LoadedWeights:
        version = check_version(version)
        path = self.root / version_dirname(version)

        def missing(what: str) -> CorruptSnapshotError:
            if not path.is_dir():
                return SnapshotNotFoundError(f"version {version}: no snapshot directory {path}")
            return CorruptSnapshotError(f"version {version}: {what} is missing (partial snapshot)")

        def read(name: str) -> bytes:
            try:
                return (path / name).read_bytes()
            except FileNotFoundError:
                raise missing(name) from None
            except OSError as exc:
                raise CorruptSnapshotError(f"version {version}: cannot read {name}: {exc}") from None

        manifest = self._parse_manifest(version, read(MANIFEST_FILE))
        data = read(MODEL_FILE)
        if len(data) != manifest["bytes"]:
            raise CorruptSnapshotError(
                f"version {version}: {MODEL_FILE} has {len(data)} bytes, the manifest says {manifest['bytes']}"
                " (truncated or partial)"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != manifest["sha256"]:
            raise CorruptSnapshotError(
                f"version {version}: sha256 of {MODEL_FILE} is {digest[:16]}..., "
                f"the manifest says {manifest['sha256'][:16]}... (corrupt)"
            )
        try:
            tensors = safetensors.torch.load(data)
        except (safetensors.SafetensorError, ValueError, RuntimeError) as exc:
            raise CorruptSnapshotError(f"version {version}: {MODEL_FILE} does not decode: {exc}") from None
        return LoadedWeights(version=version, path=path, tensors=tensors, manifest=manifest)

    @staticmethod
    def _parse_manifest(version: int, raw: bytes) -> dict[str, Any]:
        try:
            manifest = json.loads(raw)
        except ValueError as exc:
            raise CorruptSnapshotError(
                f"version {version}: {MANIFEST_FILE} is not valid JSON: {exc}"
            ) from None
        if not isinstance(manifest, dict):
            raise CorruptSnapshotError(f"version {version}: {MANIFEST_FILE} is not a JSON object")
        checks = (
            (manifest.get("format") == MANIFEST_FORMAT, "format"),
            (manifest.get("format_version") == MANIFEST_FORMAT_VERSION, "format_version"),
            (manifest.get("version") == version, "version (must match the directory name)"),
            (isinstance(manifest.get("sha256"), str) and len(manifest["sha256"]) == 64, "sha256"),
            (isinstance(manifest.get("bytes"), int) and manifest["bytes"] >= 0, "bytes"),
            (manifest.get("file") == MODEL_FILE, "file"),
        )
        for ok, name in checks:
            if not ok:
                raise CorruptSnapshotError(f"version {version}: {MANIFEST_FILE} has a bad or missing {name}")
        return manifest

    def load_latest(self) -> LoadedWeights | None:
        problems: list[str] = []
        for _ in range(_MAX_RESTARTS):
            target, pointer_problem = self._read_pointer()
            problems = [pointer_problem] if pointer_problem else []
            on_disk = self.versions()
            if target is None:
                candidates = sorted(on_disk, reverse=True)
            else:
                candidates = [target, *sorted((v for v in on_disk if v < target), reverse=True)]
            restart = False
            for version in candidates:
                try:
                    loaded = self.load(version)
                except SnapshotNotFoundError as exc:
                    if self._read_pointer()[0] != target:
                        restart = True  # the writer moved on and retention removed it: not a fault
                        break
                    problems.append(str(exc))
                    continue
                except CorruptSnapshotError as exc:
                    problems.append(str(exc))
                    continue
                if problems:
                    loaded.problems = problems
                    loaded.fell_back_from = target if target != version else None
                    logger.warning(
                        "weight store %s: loaded version %d instead of %s: %s",
                        self.root,
                        version,
                        "the newest" if target is None else target,
                        "; ".join(problems),
                    )
                return loaded
            if not restart:
                break
        if problems:
            logger.warning("weight store %s: no valid snapshot: %s", self.root, "; ".join(problems))
        return None

    # ---- writing ---------------------------------------------------------------------------
    def publish(
        self,
        version: int,
        tensors: dict[str, torch.Tensor],
        *,
        step: int,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        version = check_version(version)
        step = check_version(step, "step")
        extra = dict(extra or {})
        try:
            json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra must be JSON-serialisable (finite numbers): {exc}") from None
        prepared = _prepare_tensors(tensors)
        with self._publish_lock:
            newest = self.newest_version()
            if newest is not None and version <= newest:
                raise ValueError(
                    f"weight versions must increase strictly: cannot publish {version}, "
                    f"version {newest} already exists in {self.root}"
                )
            remove_stale(self.root, (".tmp-", ".trash-", ".latest.tmp-"))  # crashed publishes' leftovers
            final = self.root / version_dirname(version)
            with staged_dir(final, tmp_prefix=f".tmp-{version_dirname(version)}-", mode=0o755) as tmp:
                model_path = tmp / MODEL_FILE
                safetensors.torch.save_file(prepared, model_path, metadata={"asyncrl_version": str(version)})
                digest, size = hash_file(model_path, fsync=True)
                manifest = {
                    "format": MANIFEST_FORMAT,
                    "format_version": MANIFEST_FORMAT_VERSION,
                    "version": version,
                    "step": step,
                    "created_at": time.time(),
                    "file": MODEL_FILE,
                    "sha256": digest,
                    "bytes": size,
                    "num_tensors": len(prepared),
                    "num_parameters": sum(t.numel() for t in prepared.values()),
                    "extra": extra,
                }
                write_durably(tmp / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
            self._write_pointer(version)
            self._apply_retention(version)
        return final

    def _apply_retention(self, pointer: int) -> None:
        """Keep the newest ``keep`` versions and the pointer's; delete the rest by rename-then-remove."""
        for version in to_prune(self.versions(), self.keep, {pointer}):
            name = version_dirname(version)
            discard(self.root / name, trash_prefix=f".trash-{name}-")
