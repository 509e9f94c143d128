"""What the trainer records about every trained batch besides its loss: the archive, the lifecycle
traces, and the batch's data-quality figures (see :mod:`asyncrl.telemetry.lifecycle`)."""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path

from asyncrl.config import RunConfig
from asyncrl.records import Group, members
from asyncrl.telemetry.archive import ArchiveWriter
from asyncrl.telemetry.lifecycle import batch_stats, trace

SUCCESS_WINDOW = 10
"""Batches in the moving average ``reward/success_rate_ma``."""


class TrainerTelemetry:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        tc = cfg.telemetry
        self.archive = ArchiveWriter(run_dir / "archive", os.getpid()) if tc.archive else None
        self._traces = None
        if tc.traces:
            (run_dir / "traces").mkdir(exist_ok=True)
            self._traces = (run_dir / "traces" / "trained.jsonl").open("a", buffering=1)
        self.success: deque[float] = deque(maxlen=SUCCESS_WINDOW)
        self._last = time.time()

    def on_trained(self, groups: list[Group], ages: list[int], step: int, version: int) -> dict[str, float]:
        """Archive and trace a batch that was just trained at ``version`` (``ages``: per member, group by
        group); returns its metrics."""
        if self.archive is not None:
            self.archive.append(step, version, groups)
        batch = members(groups)
        traces = [trace(t, age, step + 1) for t, age in zip(batch, ages, strict=True)]
        if self._traces is not None:
            self._traces.write("".join(json.dumps(tr) + "\n" for tr in traces))
        now = time.time()
        dt, self._last = max(now - self._last, 1e-9), now
        self.success.append(sum(t.outcome == "success" for t in batch) / max(len(batch), 1))
        return {
            **batch_stats(traces, batch),
            "reward/success_rate_ma": sum(self.success) / len(self.success),
            "trainer/samples_per_s": len(batch) / dt,
            "trainer/tokens_per_s": sum(t.num_model_tokens() for t in batch) / dt,
        }
