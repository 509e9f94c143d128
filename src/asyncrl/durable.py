"""Atomic directory snapshots (weight store, trainer checkpoints, saved and imported models) and
atomic file replacement (:func:`replace_file`: the latest pointer, ``run.json``, ``pids.json``, ...).

Every directory is published the same way, and this module is that one mechanism:

1. :func:`staged_dir` hands out a fresh ``<parent>/<tmp_prefix><random>`` directory next to the final
   one; the caller writes its files there (:func:`write_durably` fsyncs each; :func:`hash_file` and
   :func:`hash_tree` give the sha256 and size for the caller's manifest, fsyncing on the way) and
   writes its manifest last.
2. When the block ends normally the directory is fsynced and renamed to its final name (one
   ``os.rename``, atomic on POSIX; an existing directory of that name is first renamed away and
   removed, when the caller allows replacing), then the parent is fsynced. When the block raises, the
   temporary directory is removed and the exception propagates: a crash at any point leaves the
   complete snapshot or a temporary directory that readers ignore.
3. Retention: :func:`to_prune` picks what to delete (all but the newest ``keep`` and the pinned
   ones), :func:`discard` deletes (optionally renaming away first, so readers see the snapshot vanish
   as a whole), and :func:`remove_stale` clears temporary entries left by crashed writers.

The manifest's format, the names and the verification stay with each user (the weight store checks
the very bytes it decodes; a checkpoint lists every file).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_CHUNK = 1 << 20


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or new entry in it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync the file before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path``, replaced whole: a sibling ``.<name>.tmp-<pid>-<random>`` file, fsynced
    and renamed over ``path``, so a reader (or a crash) sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        write_durably(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def hash_file(path: Path, *, fsync: bool = False) -> tuple[str, int]:
    """sha256 (hex) and byte size of a file, read in 1 MiB chunks; with ``fsync`` the file is fsynced too."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb+" if fsync else "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return digest.hexdigest(), size


def hash_tree(directory: Path) -> dict[str, dict[str, str | int]]:
    """``{relative path: {"sha256", "bytes"}}`` of every file under ``directory``, in sorted walk order.

    Every file and every sub-directory is fsynced on the way (files written by other libraries, e.g.
    ``save_pretrained``, become durable here).
    """
    files: dict[str, dict[str, str | int]] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            digest, size = hash_file(path, fsync=True)
            files[path.relative_to(directory).as_posix()] = {"sha256": digest, "bytes": size}
        if Path(dirpath) != directory:
            fsync_dir(Path(dirpath))
    return files


def _sibling(path: Path, prefix: str) -> Path:
    return path.parent / f"{prefix}{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def staged_dir(
    final: Path, *, tmp_prefix: str, replace_prefix: str | None = None, mode: int | None = None
) -> Iterator[Path]:
    """Write the directory ``final`` atomically: yield an empty temporary directory to fill.

    On normal exit the temporary directory is fsynced, renamed to ``final`` and the parent fsynced.
    An existing ``final`` is renamed to ``<replace_prefix><random>`` and removed after the rename when
    ``replace_prefix`` is given; otherwise the rename fails (``OSError``) for a non-empty one. On an
    exception the temporary directory is removed. ``mode``: permissions of the new directory.
    """
    root = final.parent
    tmp = _sibling(final, tmp_prefix)
    tmp.mkdir()
    old: Path | None = None
    try:
        if mode is not None:
            os.chmod(tmp, mode)
        yield tmp
        fsync_dir(tmp)
        if replace_prefix is not None and final.exists():
            old = _sibling(final, replace_prefix)
            os.rename(final, old)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def to_prune(snapshots: Sequence[T], keep: int, pinned: Collection[T] = ()) -> list[T]:
    """Retention: the ``snapshots`` (oldest first) other than the newest ``keep`` and the ``pinned``."""
    keepers = set(snapshots[-keep:]) | set(pinned)
    return [s for s in snapshots if s not in keepers]


def discard(path: Path, *, trash_prefix: str | None = None) -> None:
    """Delete the directory ``path``; with ``trash_prefix`` it is renamed to ``<trash_prefix><random>``
    first, so readers see it vanish as a whole, never half-deleted. A missing ``path`` is no error."""
    if trash_prefix is not None:
        trash = _sibling(path, trash_prefix)
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        path = trash
    shutil.rmtree(path, ignore_errors=True)


def remove_stale(root: Path, prefixes: tuple[str, ...]) -> list[Path]:
    """Remove the entries of ``root`` whose names start with ``prefixes`` (left by crashed writers).

    Directories are removed with their contents, files unlinked; returns what was removed.
    """
    removed = []
    for entry in os.scandir(root):
        if not entry.name.startswith(prefixes):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
        removed.append(Path(entry.path))
    return removed
