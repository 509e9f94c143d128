"""TensorBoard event files without TensorBoard: scalar summaries written in the standard format.

An event file is a sequence of TFRecords; each record is

    uint64 length | uint32 masked_crc32c(length) | bytes event | uint32 masked_crc32c(event)

and each ``event`` is a serialised ``tensorflow.Event`` protocol buffer:
``wall_time`` (field 1, double), ``step`` (2, int64), ``file_version`` (3, string) or
``summary`` (5, message ``Summary{repeated Value value = 1}`` with ``Value{string tag = 1;
float simple_value = 2}``). Only these few fields are needed for scalars, so they are encoded by
hand here instead of pulling in ``tensorboard`` (and protobuf, grpc, ...) as a dependency.
``tensorboard --logdir RUN/tensorboard`` reads the files; :func:`read_scalars` reads them back (with
checksums verified) for tests and tools.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any


def _crc_of_byte(c: int) -> int:
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c


_TABLE = [_crc_of_byte(i) for i in range(256)]


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as used by TFRecord framing."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while n > 0x7F:  # seven bits a byte, low first; the high bit says another byte follows
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field_bytes(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float, step: int, scalars: dict[str, float] | None = None, version: str = ""
) -> bytes:
    """One serialised ``Event`` with either ``file_version`` or a summary of scalar values."""
    out = bytearray(b"\x09" + struct.pack("<d", wall_time))
    out += _varint(2 << 3) + _varint(step)
    if version:
        out += _field_bytes(3, version.encode())
    if scalars:
        summary = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, summary)
    return bytes(out)


def frame(record: bytes) -> bytes:
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", masked_crc(header)) + record + struct.pack("<I", masked_crc(record))


class EventFileWriter:
    """Appends scalar events to one ``events.out.tfevents.*`` file in ``logdir``."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.asyncrl"
        self.path = logdir / name
        self._f = self.path.open("ab")
        self._f.write(frame(encode_event(time.time(), 0, version="brain.Event:2")))

    def add_scalars(self, step: int, scalars: dict[str, float], wall_time: float | None = None) -> None:
        if scalars:
            self._f.write(frame(encode_event(wall_time or time.time(), step, scalars)))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


# ---- reading (tests, tools) ------------------------------------------------------------------
def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        num, wire = key >> 3, key & 7
        val: Any
        if wire == 0:
            val, pos = _read_varint(buf, pos)
        elif wire == 1:
            val, pos = struct.unpack("<d", buf[pos : pos + 8])[0], pos + 8
        elif wire == 5:
            val, pos = struct.unpack("<f", buf[pos : pos + 4])[0], pos + 4
        elif wire == 2:
            n, pos = _read_varint(buf, pos)
            val, pos = buf[pos : pos + n], pos + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((num, wire, val))
    return out


def read_scalars(path: Path) -> list[tuple[int, str, float]]:
    """``(step, tag, value)`` of every scalar in an event file; raises ``ValueError`` on a bad checksum."""
    data = path.read_bytes()
    pos, out = 0, []
    while pos + 12 <= len(data):
        header = data[pos : pos + 8]
        (n,) = struct.unpack("<Q", header)
        if struct.unpack("<I", data[pos + 8 : pos + 12])[0] != masked_crc(header):
            raise ValueError(f"{path}: bad length checksum at byte {pos}")
        record = data[pos + 12 : pos + 12 + n]
        if struct.unpack("<I", data[pos + 12 + n : pos + 16 + n])[0] != masked_crc(record):
            raise ValueError(f"{path}: bad record checksum at byte {pos}")
        pos += 16 + n
        step = 0
        for num, _, val in _fields(record):
            if num == 2:
                step = int(val)
            elif num == 5:
                for _, _, value in _fields(val):
                    f = {k: v for k, _, v in _fields(value)}
                    out.append((step, bytes(f[1]).decode(), float(f[2])))
    return out
