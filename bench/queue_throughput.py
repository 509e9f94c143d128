"""Trajectory-queue throughput: several producer processes, one consumer, embedded and redis side by side.

    .venv/bin/python bench/queue_throughput.py [--producers 4] [--seconds 10] [--backends embedded redis]
        [--redis-url redis://127.0.0.1:6379/0] [--bytes 20000] [--from-run RUN]

Each producer process puts real :class:`~asyncrl.records.Trajectory` records of about ``--bytes``
encoded bytes (a 4-turn calculator-like episode: prompt, model turns with behaviour log-probs and
versions, tool observations, tool calls) as fast as the queue takes them, with fresh ids. One
consumer leases batches of 256 with ``get_batch``, decodes and validates them (the queue does), and
acknowledges them, as the trainer does. The figure is the **sustained** rate: trajectories acked
per second over the measurement window, after a one-second warm-up. The queue's per-trajectory
cost is reported as producer CPU-side put latency and consumer time per trajectory; with
``--from-run RUN`` it is set against the time a rollout worker of that run needed per trajectory
(its alive seconds / episodes). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BATCH = 256


def make_trajectory(traj_id: str, target_bytes: int) -> Any:
    """A realistic multi-turn trajectory of about ``target_bytes`` encoded bytes."""
    from asyncrl.records import encode

    first = _trajectory(traj_id, 400)
    per_turn = max(8, int(400 * target_bytes / len(encode(first))))  # size grows linearly with tokens
    return _trajectory(traj_id, per_turn)


def _trajectory(traj_id: str, per_turn: int) -> Any:
    from asyncrl.records import Task, ToolCall, Trajectory, Turn, encode

    turns_n = 4
    turns = [Turn(role="env", token_ids=[33 + (i % 90) for i in range(120)])]
    for k in range(turns_n):
        turns.append(
            Turn(
                role="model",
                token_ids=[33 + ((i * 7 + k) % 90) for i in range(per_turn)],
                logprobs=[-0.01 - ((i * 13 + k) % 997) / 997 for i in range(per_turn)],
                version=k // 2,
                tool_call=ToolCall(name="calc", arguments=f"{k}*{k + 3}", ok=True, result=str(k * (k + 3))),
            )
        )
        turns.append(Turn(role="tool", token_ids=[33 + (i % 90) for i in range(24)]))
    traj = Trajectory(
        id=traj_id,
        task=Task(
            id=f"task-{traj_id[:8]}", task_type="arithmetic", difficulty=3, payload={"question": "2*3+4"}
        ),
        turns=turns,
        final_reward=1.0,
        outcome="success",
        worker_id="bench",
        group_id="g-bench",
    )
    traj.validate()
    encode(traj)  # must encode
    return traj


def _open(kind: str, run_dir: str, url: str, capacity: int) -> Any:
    if kind == "redis":
        from asyncrl.transport.redis_backend import RedisQueue

        return RedisQueue(url, run_dir, capacity=capacity, lease_seconds=60)
    from asyncrl.transport.embedded import EmbeddedQueue

    return EmbeddedQueue(Path(run_dir) / "queue.sqlite", capacity=capacity, lease_seconds=60)


def _producer(
    kind: str, run_dir: str, url: str, capacity: int, nbytes: int, stop_at: float, out: Any
) -> None:
    q = _open(kind, run_dir, url, capacity)
    template = make_trajectory(uuid.uuid4().hex, nbytes)
    n, put_s = 0, 0.0
    while time.time() < stop_at:
        template.id = uuid.uuid4().hex
        t0 = time.perf_counter()
        if q.put(template, timeout=1.0):
            n += 1
        put_s += time.perf_counter() - t0
    q.close()
    out.put((n, put_s))


def run_backend(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    from asyncrl.records import encode

    size = len(encode(make_trajectory(uuid.uuid4().hex, args.bytes)))
    with tempfile.TemporaryDirectory(prefix="qbench-") as tmp:
        run_dir = str(Path(tmp) / "run")
        Path(run_dir).mkdir()
        consumer = _open(kind, run_dir, args.redis_url, args.capacity)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start = time.time() + 3.0  # producers' start-up (imports) happens before the window
        stop_at = start + 1.0 + args.seconds
        procs = [
            ctx.Process(
                target=_producer,
                args=(kind, run_dir, args.redis_url, args.capacity, args.bytes, stop_at, out),
            )
            for _ in range(args.producers)
        ]
        for p in procs:
            p.start()
        acked = 0
        window_start_count = None
        window_t0 = 0.0
        busy = 0.0
        window_busy0 = 0.0
        while time.time() < stop_at:
            t0 = time.perf_counter()
            batch = consumer.get_batch(BATCH, timeout=0.1)
            if batch:
                consumer.ack([d.entry_id for d in batch])
                acked += len(batch)
                busy += time.perf_counter() - t0
            now = time.time()
            if window_start_count is None and now >= start + 1.0:  # one second of warm-up
                window_start_count, window_t0, window_busy0 = acked, now, busy
        window_end = time.time()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
        # drain what the producers left behind (not counted in the window)
        while batch := consumer.get_batch(BATCH, timeout=0.2):
            consumer.ack([d.entry_id for d in batch])
        stats = consumer.stats()
        consumer.close()
        if kind == "redis":
            import redis

            from asyncrl.transport.redis_backend import key_prefix

            r = redis.Redis.from_url(args.redis_url)
            keys = list(r.scan_iter(match=f"{key_prefix(run_dir)}*"))
            if keys:
                r.delete(*keys)
            r.close()
    counted = acked - (window_start_count or 0)
    seconds = window_end - window_t0
    produced = sum(n for n, _ in results)
    put_seconds = sum(s for _, s in results)
    return {
        "trajectory_bytes": size,
        "producers": args.producers,
        "window_seconds": round(seconds, 2),
        "sustained_traj_per_s": round(counted / seconds, 1) if seconds > 0 else 0.0,
        "sustained_mb_per_s": round(counted * size / seconds / 1e6, 1) if seconds > 0 else 0.0,
        "produced": produced,
        "put_ms_per_traj": round(1000 * put_seconds / max(produced, 1), 3),
        "consumer_ms_per_traj": round(1000 * (busy - window_busy0) / max(counted, 1), 3),
        "dead_letters": int(stats["queue/dead_letters"]),
        "left_in_queue": int(stats["queue/depth"]),
    }


def generation_seconds_per_trajectory(run: Path) -> float | None:
    """A rollout worker's alive seconds per finished episode in an earlier run (last metric row)."""
    rates = []
    for f in sorted((run / "metrics").glob("rollout-*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "rollout/episodes" in r]
        if rows and rows[-1]["rollout/episodes"]:
            rates.append(float(rows[-1]["alive_s"]) / float(rows[-1]["rollout/episodes"]))
    return sum(rates) / len(rates) if rates else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--bytes", type=int, default=20000)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--backends", nargs="+", default=["embedded", "redis"], choices=["embedded", "redis"])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--from-run", type=Path, default=None, help="run directory to take generation time from")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    for kind in args.backends:
        out[kind] = run_backend(kind, args)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    if args.from_run is not None:
        gen = generation_seconds_per_trajectory(args.from_run)
        out["generation_ms_per_traj"] = round(1000 * gen, 2) if gen else None
        if gen:
            for kind in args.backends:
                cost = (out[kind]["put_ms_per_traj"] + out[kind]["consumer_ms_per_traj"]) / 1000
                out[kind]["queue_overhead_share_of_generation"] = round(cost / gen, 4)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
