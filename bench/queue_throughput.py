"""Trajectory-queue throughput: several producer processes, one consumer, embedded and redis side by side.

    .venv/bin/python bench/queue_throughput.py [--producers 4] [--seconds 10] [--backends embedded redis]
        [--bytes 20000] [--from-run RUN] [--shared-redis --redis-url redis://127.0.0.1:6379/0]

Each producer process puts real :class:`~asyncrl.records.Trajectory` records of about ``--bytes``
encoded bytes (a 4-turn calculator-like episode: prompt, model turns with behaviour log-probs and
versions, tool observations, tool calls) as fast as the queue takes them, with fresh ids. One
consumer leases batches of 256 with ``get_batch``, decodes and validates them (the queue does), and
acknowledges them, as the trainer does. The figure is the **sustained** rate: trajectories acked
per second over the measurement window, after a one-second warm-up. The queue's per-trajectory
cost is reported as producer CPU-side put latency and consumer time per trajectory; with
``--from-run RUN`` it is set against the time a rollout worker of that run needed per trajectory
(its alive seconds / episodes). On a shared, loaded machine the sustained rate says more about the
load than about the queue, so the script also adds up the CPU time every process spent — producers,
consumer and the redis-server (a private one, AOF on, unless ``--shared-redis``) — per trajectory,
and reports the rate that CPU cost allows on this many idle cores. Prints one JSON object.
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
    """A queue entry: a group of one realistic multi-turn trajectory, about ``target_bytes`` encoded bytes."""
    from asyncrl.records import Group, encode

    first = _trajectory(traj_id, 400)
    per_turn = max(8, int(400 * target_bytes / len(encode(first))))  # size grows linearly with tokens
    traj = _trajectory(traj_id, per_turn)
    return Group.of(traj.task, [traj], id=traj_id)


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

        return RedisQueue(url, run_dir, capacity=capacity, lease_seconds=60, socket_timeout_s=30.0)
    from asyncrl.transport.embedded import EmbeddedQueue

    return EmbeddedQueue(
        Path(run_dir) / "queue.sqlite", capacity=capacity, lease_seconds=60, busy_timeout_s=30.0
    )


def _producer(
    kind: str, run_dir: str, url: str, capacity: int, nbytes: int, stop_at: float, out: Any
) -> None:
    q = _open(kind, run_dir, url, capacity)
    template = make_trajectory(uuid.uuid4().hex, nbytes)
    n, put_s = 0, 0.0
    cpu0 = time.process_time()
    while time.time() < stop_at:
        template.id = template.members[0].id = template.members[0].group_id = uuid.uuid4().hex
        t0 = time.perf_counter()
        if q.put(template, timeout=1.0):
            n += 1
        put_s += time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    q.close()
    out.put((n, put_s, cpu))


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
        server_cpu0 = _server_cpu(kind, args.redis_url)
        consumer_cpu0 = time.process_time()
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
            acked += len(batch)
        consumer_cpu = time.process_time() - consumer_cpu0
        server_cpu = _server_cpu(kind, args.redis_url) - server_cpu0
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
    produced = sum(r[0] for r in results)
    put_seconds = sum(r[1] for r in results)
    cpu_s_per_traj = (sum(r[2] for r in results) + consumer_cpu + server_cpu) / max(acked, 1)
    return {
        "trajectory_bytes": size,
        "producers": args.producers,
        "window_seconds": round(seconds, 2),
        "sustained_traj_per_s": round(counted / seconds, 1) if seconds > 0 else 0.0,
        "sustained_mb_per_s": round(counted * size / seconds / 1e6, 1) if seconds > 0 else 0.0,
        "produced": produced,
        "put_ms_per_traj": round(1000 * put_seconds / max(produced, 1), 3),
        "consumer_ms_per_traj": round(1000 * (busy - window_busy0) / max(counted, 1), 3),
        "cpu_ms_per_traj": round(1000 * cpu_s_per_traj, 3),
        "cpu_bound_traj_per_s_on_idle_cores": round((os.cpu_count() or 1) / cpu_s_per_traj, 0),
        "server_cpu_ms_per_traj": round(1000 * server_cpu / max(acked, 1), 3),
        "dead_letters": int(stats.dead_letters),
        "left_in_queue": int(stats.depth),
    }


def _server_cpu(kind: str, url: str) -> float:
    """CPU seconds the Redis server has used so far (0 for the embedded queue: no server)."""
    if kind != "redis":
        return 0.0
    import redis

    r = redis.Redis.from_url(url)
    info = r.info("cpu")
    r.close()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def generation_seconds_per_trajectory(run: Path) -> float | None:
    """A rollout worker's alive seconds per finished episode in an earlier run (last metric row)."""
    rates = []
    for f in sorted((run / "metrics").glob("rollout-*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "rollout/episodes" in r]
        if rows and rows[-1]["rollout/episodes"]:
            rates.append(float(rows[-1]["alive_s"]) / float(rows[-1]["rollout/episodes"]))
    return sum(rates) / len(rates) if rates else None


def _private_redis() -> tuple[Any, int]:
    """A redis-server of our own (AOF on, fsync every second) on a free port: its CPU is ours alone."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    data = tempfile.mkdtemp(prefix="qbench-redis-")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data, "--save", "",
         "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    import redis

    for _ in range(200):
        try:
            if redis.Redis(port=port).ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--bytes", type=int, default=20000)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--backends", nargs="+", default=["embedded", "redis"], choices=["embedded", "redis"])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--from-run", type=Path, default=None, help="run directory to take generation time from")
    ap.add_argument(
        "--shared-redis", action="store_true", help="use --redis-url instead of a private redis-server"
    )
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    server = None
    if "redis" in args.backends and not args.shared_redis:
        server = _private_redis()
        args.redis_url = f"redis://127.0.0.1:{server[1]}/0"
    out: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    for kind in args.backends:
        out[kind] = run_backend(kind, args)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    if server is not None:
        server[0].terminate()
        server[0].wait(30)
        out["redis_server"] = "private redis-server, appendonly yes, appendfsync everysec"
    if args.from_run is not None:
        gen = generation_seconds_per_trajectory(args.from_run)
        out["generation_ms_per_traj"] = round(1000 * gen, 2) if gen else None
        if gen:
            for kind in args.backends:
                wall = (out[kind]["put_ms_per_traj"] + out[kind]["consumer_ms_per_traj"]) / 1000
                out[kind]["queue_cpu_share_of_generation"] = round(
                    out[kind]["cpu_ms_per_traj"] / 1000 / gen, 4
                )
                out[kind]["queue_wall_share_of_generation"] = round(wall / gen, 4)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
