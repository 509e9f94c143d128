"""JSON-lines files: the one reader (and the one reader of a run's JSON records), and the per-role metric files.

Each role appends JSON lines to ``run_dir/metrics/{role}.jsonl``. One file per process means no
cross-process locking; the orchestrator tails them all, merges them into the run's
``metrics.jsonl`` and drives the live display from them. Every JSONL file of a run (metrics,
``evals.jsonl``, ``alerts.jsonl``, traces) is read with :func:`read_jsonl` / :func:`read_jsonl_dir`.
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from asyncrl.telemetry.reports import GROUP_EVENT, GroupReport, Memory, Report


def parse_lines(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects of ``lines``; blank, partial (a writer died mid-line) or non-object lines are skipped."""
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON object of one JSONL file, in order (``[]`` if the file does not exist)."""
    return parse_lines(path.read_text().splitlines()) if path.is_file() else []


def read_jsonl_dir(folder: Path) -> list[dict[str, Any]]:
    """Every JSON object of every ``*.jsonl`` file in ``folder`` (files in name order)."""
    return [row for path in sorted(folder.glob("*.jsonl")) for row in read_jsonl(path)]


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object of one file (``run.json``, ``summary.json``, ...); ``{}`` if it is missing or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def memory() -> Memory:
    """This process's resident memory now and its peak so far, in MB: every metric row carries them, so each role's memory is on TensorBoard
    and its peak in ``summary.json``.

    The peak is ``VmHWM`` of ``/proc/self/status``: the high-water mark of this program image.
    ``getrusage``'s ``ru_maxrss`` is not used where ``/proc`` exists: Linux keeps it across ``execve``,
    so a role process spawned (fork + exec) by a launcher that had just run the warm start would
    report the launcher's peak as its own."""
    mb: dict[bytes, float] = {}
    try:
        with open("/proc/self/status", "rb") as f:
            mb = {
                k: int(v.split()[0]) / 1024
                for k, _, v in (ln.partition(b":") for ln in f)
                if k in (b"VmRSS", b"VmHWM")
            }
    except (OSError, ValueError, IndexError):  # not Linux
        pass
    peak = mb.get(b"VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # kB on Linux
    rss = mb.get(b"VmRSS", peak)
    return Memory(rss_mb=round(rss, 1), peak_rss_mb=round(max(peak, rss), 1))


class MetricWriter:
    """Appends metric rows for one role process; every row carries the process id and how long the
    process has been alive (``alive_s``, from ``started``), so the cost ledger can add up every
    incarnation of a role that was restarted."""

    def __init__(self, path: Path, role: str, started: float | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role
        self.started = started if started is not None else time.time()
        self.pid = os.getpid()
        self._f = path.open("a", buffering=1)

    def write(self, metrics: dict[str, float], **fields: Any) -> None:
        clean = {
            k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None) for k, v in metrics.items()
        }
        now = time.time()
        head = {"time": now, "role": self.role, "pid": self.pid, "alive_s": now - self.started}
        self._f.write(json.dumps({**head, **fields, **clean, **memory().flat()}) + "\n")

    def report(self, report: Report, step: int | None = None) -> None:
        """Write a role's typed report (:mod:`asyncrl.telemetry.reports`) as one flat metric row
        (with the trainer's ``step`` for the sinks' x-axis)."""
        self.write(report.flat(), **({"step": step} if step is not None else {}))

    def group(self, report: GroupReport) -> None:
        """Write a finished group as its ``rollout/group`` event row."""
        self.event(GROUP_EVENT, msgspec.to_builtins(report))

    def event(self, name: str, data: dict[str, Any]) -> None:
        self._f.write(json.dumps({"time": time.time(), "role": self.role, "event": name, **data}) + "\n")

    def close(self) -> None:
        self._f.close()


class MetricTail:
    """Reads new complete lines from a set of JSONL files (tolerates partial last lines)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._offsets: dict[Path, int] = {}

    def poll(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.folder.glob("*.jsonl")):
            pos = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(pos)
                data = f.read()
            end = data.rfind(b"\n")
            if end < 0:
                continue
            out += parse_lines(data[: end + 1].splitlines())
            self._offsets[path] = pos + end + 1
        return out
