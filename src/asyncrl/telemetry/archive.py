"""The trajectory archive: every trained batch, as the trainer saw it, in ``run_dir/archive/``.

Format: one file per trainer process, ``trained-{pid}.msgpack.gz``, a gzip stream (one gzip member per
batch, so an append never rewrites earlier data) of frames ``uint32 length | msgpack ArchivedBatch``.
The batch is the wire record itself — its groups (:class:`~asyncrl.records.Group`, schema-versioned,
no pickle); decoding validates them like the queue does. A crash can leave a truncated last member:
readers stop at it and keep everything before.

If a trainer crashed and resumed from its checkpoint, the steps after that checkpoint were trained
again (possibly on other batches); :func:`read_batches` keeps, for each step, the batch written last
— the one the surviving weights descend from.
"""

from __future__ import annotations

import gzip
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import msgspec

from asyncrl.records import Group, RecordDecodeError, encode


class ArchivedBatch(msgspec.Struct, kw_only=True):
    step: int
    """Optimiser steps taken before this batch (the batch produced step ``step + 1``)."""
    version: int
    """Weight version the batch was trained at (what the staleness ages were measured against)."""
    written: float
    groups: list[Group]


_decoder = msgspec.msgpack.Decoder(ArchivedBatch)


class ArchiveWriter:
    def __init__(self, folder: Path, pid: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"trained-{pid}.msgpack.gz"

    def append(self, step: int, version: int, batch: list[Group]) -> None:
        data = encode(ArchivedBatch(step=step, version=version, written=time.time(), groups=batch))
        with self.path.open("ab") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as gz:
            gz.write(struct.pack("<I", len(data)) + data)


def _frames(path: Path) -> Iterator[bytes]:
    """The frames of every complete gzip member (its CRC checked); stops at a truncated or corrupt one."""
    data = path.read_bytes()
    while data:
        d = zlib.decompressobj(wbits=31)  # one gzip member
        try:
            out = d.decompress(data)
        except zlib.error:
            return
        if not d.eof:
            return  # a truncated last member (crash mid-append): keep what came before
        pos = 0
        while pos + 4 <= len(out):
            (n,) = struct.unpack("<I", out[pos : pos + 4])
            yield out[pos + 4 : pos + 4 + n]
            pos += 4 + n
        data = d.unused_data


def read_batches(run_dir: Path) -> list[ArchivedBatch]:
    """Every archived batch of the run, one per step (the last written wins), in step order."""
    folder = run_dir / "archive"
    by_step: dict[int, ArchivedBatch] = {}
    for path in sorted(folder.glob("trained-*.msgpack.gz")):
        for data in _frames(path):
            try:
                b = _decoder.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise RecordDecodeError(f"{path}: not a valid archived batch: {exc}") from None
            for g in b.groups:
                g.validate()
            if b.step not in by_step or b.written >= by_step[b.step].written:
                by_step[b.step] = b
    return [by_step[k] for k in sorted(by_step)]
