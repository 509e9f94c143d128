"""Where each training step's wall time went, per role, from a run's metric rows (the report's
"Wall time per step" section and ``docs/benchmarks.md``).

The trainer writes one row per optimiser step with cumulative seconds (``trainer/learn_seconds``,
``trainer/publish_seconds``, ``trainer/busy_seconds``, ``trainer/idle_seconds``); a rollout worker
writes a row every ``telemetry.log_every_s`` with cumulative generation seconds
(``rollout/gen_busy_seconds``, ``rollout/prefill_seconds``, ``rollout/decode_seconds``). Step ``k``'s
interval runs from the trainer's row of step ``k − 1`` (its launch, for the first) to its row of
step ``k``; each cumulative counter is differenced over it — a worker's counters linearly
interpolated at the two instants, summed over the workers. A process that restarted starts its
counters again from 0 (the difference is taken within one process id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TRAINER_KEYS = {
    "train": "trainer/learn_seconds",
    "publish": "trainer/publish_seconds",
    "busy": "trainer/busy_seconds",
    "idle": "trainer/idle_seconds",
}
ROLLOUT_KEYS = {
    "generate": "rollout/gen_busy_seconds",
    "prefill": "rollout/prefill_seconds",
    "decode": "rollout/decode_seconds",
}
BORROWED = "cores/borrowed_thread_seconds"


@dataclass(frozen=True)
class StepWall:
    """Seconds of one training step's interval (module docstring)."""

    step: int
    wall: float
    train: float
    """Inside the learner's step (forward, backward, optimiser)."""
    publish: float
    """Writing the new weight version (and its canary record)."""
    other: float
    """The trainer's remaining busy time: taking the batch, checkpoints, bookkeeping."""
    idle: float
    """The trainer waiting for a batch."""
    generate: float
    """Rollout workers generating (summed over workers), of which ``prefill`` and ``decode``."""
    prefill: float
    decode: float
    borrowed: float
    """Thread-seconds the roles borrowed from waiting ones (core lending)."""


Series = dict[tuple[str, int], list[tuple[float, dict[str, float]]]]
"""(role, pid) -> [(time, cumulative counters)]."""


def _series(rows: Iterable[dict[str, Any]], role_prefix: str, keys: list[str]) -> Series:
    out: Series = {}
    for r in rows:
        role = str(r.get("role", ""))
        if "event" in r or not role.startswith(role_prefix) or "time" not in r:
            continue
        vals = {k: float(r[k]) for k in keys if isinstance(r.get(k), (int, float))}
        if vals:
            out.setdefault((role, int(r.get("pid") or 0)), []).append((float(r["time"]), vals))
    return out


def _at(points: list[tuple[float, dict[str, float]]], t: float, key: str) -> float:
    """A cumulative counter at time ``t``: 0 before the process's first row, linear between rows."""
    prev_t, prev_v = points[0][0], 0.0
    if t < prev_t:
        return 0.0
    for pt, vals in points:
        v = vals.get(key, prev_v)
        if pt >= t:
            return prev_v + (v - prev_v) * ((t - prev_t) / (pt - prev_t) if pt > prev_t else 1.0)
        prev_t, prev_v = pt, v
    return prev_v


def _rollout_delta(workers: Series, key: str, a: float, b: float) -> float:
    return sum(max(0.0, _at(pts, b, key) - _at(pts, a, key)) for pts in workers.values())


def step_walls(rows: list[dict[str, Any]]) -> list[StepWall]:
    """One :class:`StepWall` per trainer step, in step order (the final row that repeats the last
    step is skipped)."""
    rows = sorted((r for r in rows if "event" not in r), key=lambda r: float(r.get("time") or 0.0))
    trainer = [
        r for r in rows if r.get("role") == "trainer" and isinstance(r.get("trainer/step"), (int, float))
    ]
    workers = _series(rows, "rollout", [*ROLLOUT_KEYS.values(), BORROWED])
    everyone = _series(rows, "", [BORROWED])
    out: list[StepWall] = []
    prev: dict[str, Any] | None = None
    for r in trainer:
        step = int(r["trainer/step"])
        if prev is not None and step <= int(prev["trainer/step"]):
            continue
        a = float(prev["time"]) if prev is not None else float(r["time"]) - float(r.get("alive_s") or 0.0)
        b = float(r["time"])
        # the trainer's own counters, differenced within one process (a restarted one counts from 0)
        before = prev if prev is not None and prev.get("pid") == r.get("pid") else {}
        own = {
            n: max(0.0, float(r.get(k) or 0.0) - float(before.get(k) or 0.0)) for n, k in TRAINER_KEYS.items()
        }
        gen = {n: _rollout_delta(workers, k, a, b) for n, k in ROLLOUT_KEYS.items()}
        other = max(0.0, own["busy"] - own["train"] - own["publish"])
        borrowed = _rollout_delta(everyone, BORROWED, a, b)
        out.append(
            StepWall(step, b - a, own["train"], own["publish"], other, own["idle"], **gen, borrowed=borrowed)
        )
        prev = r
    return out
