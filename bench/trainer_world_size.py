"""Trainer throughput at world size 1 vs 2 (one torch thread per rank), side by side in one run.

The same batch of synthetic trajectories and the same model (a built qwen2-family model of the given
size, full fine-tuning) are trained for ``--steps`` learner steps, first by one process, then by a
two-rank gloo group (rank 0 broadcasts each batch as the trainer does, both ranks step). Reported:
trained model tokens per second of each, their ratio, and the time rank 0 takes to publish a weight
version to the local weight store (rank 0 alone publishes; the other ranks never wait for it).
Prints one JSON object.

    PYTHONPATH=src python bench/trainer_world_size.py [--steps 4] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def config(args: argparse.Namespace, world: int) -> Any:
    from asyncrl.config import load_config

    return load_config(
        None,
        [
            f"model.hidden_size={args.hidden}",
            f"model.num_layers={args.layers}",
            "model.num_heads=4",
            "model.num_kv_heads=2",
            f"model.intermediate_size={3 * args.hidden}",
            "model.max_context=512",
            f"trainer.batch_size={args.batch}",
            "rollout.group_size=8",
            f"trainer.max_tokens_per_microbatch={args.microbatch_tokens}",
            f"trainer.world_size={world}",
        ],
    )


def batch(n: int, length: int) -> list[Any]:
    from asyncrl.records import Task, Trajectory, Turn

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        k = int(length * (0.5 + 0.5 * torch.rand((), generator=g)))
        ids = torch.randint(3, 40, (k,), generator=g).tolist()  # inside the char vocabulary
        turns = [
            Turn(role="env", token_ids=ids[: k // 4]),
            Turn(role="model", token_ids=ids[k // 4 :], logprobs=[-1.0] * (k - k // 4), version=0),
        ]
        out.append(
            Trajectory(
                id=f"t{i}",
                task=Task(id=f"g{i // 8}", task_type="calc"),
                turns=turns,
                final_reward=float(i % 2),
                group_id=f"g{i // 8}",
            )
        )
    return out


def train(cfg: Any, group: Any, trajs: list[Any], steps: int) -> tuple[float, int]:
    """Seconds for ``steps`` learner steps (after one warm-up step) and model tokens per step."""
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner
    from asyncrl.trainer.process import step_command

    torch.manual_seed(0)
    learner = Learner(cfg, Policy.build(cfg.model))
    learner.group = group
    tokens = sum(t.num_model_tokens() for t in trajs)
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        if group is not None and group.leader:
            group.send("step", **step_command(trajs, s))
        elif group is not None:
            group.receive()
        learner.step(trajs, s)
    return time.perf_counter() - t0, tokens


def publish_seconds(cfg: Any, versions: int) -> float:
    from asyncrl.config import LocalWeightsConfig
    from asyncrl.policy import Policy
    from asyncrl.weights import make_weight_store

    policy = Policy.build(cfg.model)
    with tempfile.TemporaryDirectory() as run_dir:
        store = make_weight_store(LocalWeightsConfig(keep=2), Path(run_dir))
        t0 = time.perf_counter()
        for v in range(1, versions + 1):
            store.publish(v, policy.state_dict_tensors(), step=v)
        return (time.perf_counter() - t0) / versions


def rank(r: int, port: int, args: argparse.Namespace, out: str) -> None:
    from asyncrl.trainer.distributed import Group

    torch.set_num_threads(1)
    cfg = config(args, 2)
    group = Group.join(cfg, r, "127.0.0.1", port)
    seconds, tokens = train(cfg, group, batch(args.batch, args.length), args.steps)
    if r == 0:
        Path(out).write_text(
            json.dumps({"seconds": seconds, "tokens": tokens, "publish_s": publish_seconds(cfg, 3)})
        )
    group.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--microbatch-tokens", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(1)
    seconds1, tokens = train(config(args, 1), None, batch(args.batch, args.length), args.steps)
    publish1 = publish_seconds(config(args, 1), 3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rank0.json"
        procs = [mp.get_context("spawn").Process(target=rank, args=(r, port, args, out)) for r in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            sys.exit("a rank failed")
        two = json.loads(Path(out).read_text())
    tps1 = tokens * args.steps / seconds1
    tps2 = two["tokens"] * args.steps / two["seconds"]
    from asyncrl.policy import Policy

    params = sum(p.numel() for p in Policy.build(config(args, 1).model).model.parameters())
    print(
        json.dumps(
            {
                "model_params": params,
                "model_tokens_per_step": tokens,
                "steps": args.steps,
                "tokens_per_s_world1": round(tps1, 1),
                "tokens_per_s_world2": round(tps2, 1),
                "speedup_world2": round(tps2 / tps1, 2),
                "publish_s_world1": round(publish1, 4),
                "publish_s_world2_rank0": round(two["publish_s"], 4),
                "cpu_threads_per_rank": 1,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
