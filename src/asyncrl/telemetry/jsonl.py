"""Per-role metric files: each role appends JSON lines to ``run_dir/metrics/{role}.jsonl``.

One file per process means no cross-process locking; the orchestrator tails them all, merges
them into the run's ``metrics.jsonl`` and drives the live display from them.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any


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
        self._f.write(json.dumps({**head, **fields, **clean}) + "\n")

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
        if not self.folder.is_dir():
            return out
        for path in sorted(self.folder.glob("*.jsonl")):
            pos = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(pos)
                data = f.read()
            end = data.rfind(b"\n")
            if end < 0:
                continue
            for line in data[: end + 1].splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            self._offsets[path] = pos + end + 1
        return out
