"""Trainer throughput and memory at world size 1 vs 2 ddp vs 2 fsdp (one torch thread per rank), in one run.

The same batch of synthetic trajectories and the same model (a built qwen2-family model of the given
size, full fine-tuning) are trained for ``--steps`` learner steps by one process, by a two-rank gloo
group with replicated weights (``trainer.parallel: ddp``) and by one with FSDP2-sharded weights
(``fsdp``); rank 0 broadcasts each batch as the trainer does. Each setting runs in fresh processes,
``--rounds`` times in rotating order (contention on a shared machine then hits every setting alike;
the median is reported). Reported per setting: trained model tokens per second; the training state
one rank holds (parameters, gradients, AdamW moments: this rank's slices with fsdp), a figure load
does not change; each rank's resident memory after the steps and its peak over the whole process
(which includes loading the whole model before sharding it, and the gathered state at publishing); and the time rank 0 takes to publish a weight version to the
local store (fsdp: gathering the full state from both ranks first). Prints one JSON object.

    PYTHONPATH=src python bench/trainer_world_size.py [--steps 4] [--hidden 256] [--layers 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def config(args: argparse.Namespace, world: int, parallel: str = "ddp") -> Any:
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
            f"trainer.parallel={parallel}",
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


def _state_bytes(learner: Any) -> int:
    """Bytes of this rank's parameters, gradients and optimiser state (local slices of sharded ones)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    tensors = [local(p) for p in learner.model.parameters()]
    tensors += [local(p.grad) for p in learner.model.parameters() if p.grad is not None]
    for entries in learner.optimizer.state.values():
        tensors += [local(v) for v in entries.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def train(cfg: Any, group: Any, trajs: list[Any], steps: int) -> tuple[Any, float, int]:
    """The learner, seconds for ``steps`` learner steps (after one warm-up step), model tokens per step."""
    from asyncrl.policy import Policy
    from asyncrl.records import groups_of
    from asyncrl.trainer.distributed import Step
    from asyncrl.trainer.learner import Learner
    from asyncrl.trainer.parallel import make_parallel

    torch.manual_seed(0)
    learner = Learner(cfg, Policy.build(cfg.model))
    learner.parallelize(make_parallel(cfg, group))
    tokens = sum(t.num_model_tokens() for t in trajs)
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        if group is not None and group.leader:
            group.send(Step.of(groups_of(trajs), s))
        elif group is not None:
            group.receive()
        learner.step(groups_of(trajs), s)
    return learner, time.perf_counter() - t0, tokens


def _rss_mb() -> float:
    """This process's resident memory now (Linux ``/proc``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def publish_seconds(learner: Any, versions: int, leader: bool) -> float:
    """Rank 0's seconds per published version (with a sharded policy: the gather on every rank first)."""
    from asyncrl.config import LocalWeightsConfig
    from asyncrl.weights import make_weight_store

    with tempfile.TemporaryDirectory() as run_dir:
        store = make_weight_store(LocalWeightsConfig(keep=2), Path(run_dir))
        t0 = time.perf_counter()
        for v in range(1, versions + 1):
            learner.parallel.release()
            policy = learner.parallel.gather() or learner.policy  # sharded: the full state (collective)
            if leader:
                store.publish(v, policy.state_dict_tensors(), step=v)
        return (time.perf_counter() - t0) / versions


def rank(r: int, world: int, parallel: str, port: int, args: argparse.Namespace, out: str) -> None:
    from asyncrl.policy.memory import set_mmap_threshold
    from asyncrl.trainer.distributed import RankGroup

    torch.set_num_threads(1)
    set_mmap_threshold(args.mmap_threshold_kb)  # as the roles do: freed tensors leave the RSS
    cfg = config(args, world, parallel)
    group = RankGroup.join(cfg, r, "127.0.0.1", port) if world > 1 else None
    learner, seconds, tokens = train(cfg, group, batch(args.batch, args.length), args.steps)
    state = _state_bytes(learner)
    rss_now = _rss_mb()  # after the steps, before publishing: the training-time footprint
    publish = publish_seconds(learner, 3, r == 0)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    Path(f"{out}-{r}.json").write_text(
        json.dumps(
            {
                "seconds": seconds,
                "tokens": tokens,
                "publish_s": publish,
                "state": state,
                "rss": rss_mb,
                "rss_training": rss_now,
            }
        )
    )
    if group is not None:
        group.close()


def run_setting(world: int, parallel: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One setting in fresh processes (one per rank); every rank's report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/report"
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=rank, args=(r, world, parallel, port, args, out)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            sys.exit(f"a rank failed (world {world}, {parallel})")
        return [json.loads(Path(f"{out}-{r}.json").read_text()) for r in range(world)]


SETTINGS = {"world1": (1, "ddp"), "world2_ddp": (2, "ddp"), "world2_fsdp": (2, "fsdp")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--microbatch-tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mmap-threshold-kb", type=int, default=1024, help="launcher.malloc_mmap_threshold_kb")
    args = ap.parse_args()
    names = list(SETTINGS)
    runs: dict[str, list[list[dict[str, Any]]]] = {n: [] for n in names}
    for i in range(args.rounds):  # rotate the order: no setting always runs first
        for name in names[i % len(names) :] + names[: i % len(names)]:
            runs[name].append(run_setting(*SETTINGS[name], args))
    from asyncrl.policy import Policy

    params = sum(p.numel() for p in Policy.build(config(args, 1).model).model.parameters())
    result: dict[str, Any] = {"model_params": params, "steps": args.steps, "rounds": args.rounds}
    for name, reports in runs.items():
        tps = [r[0]["tokens"] * args.steps / r[0]["seconds"] for r in reports]
        result[name] = {
            "tokens_per_s": round(statistics.median(tps), 1),
            "tokens_per_s_rounds": [round(t, 1) for t in tps],
            "state_mb_per_rank": [round(r["state"] / 2**20, 2) for r in reports[0]],
            "rss_after_steps_mb_per_rank": [round(r["rss_training"], 1) for r in reports[0]],
            "peak_rss_mb_per_rank": [
                round(max(rr[k]["rss"] for rr in reports), 1) for k in range(len(reports[0]))
            ],
            "publish_s_rank0": round(statistics.median(r[0]["publish_s"] for r in reports), 4),
        }
    result["model_tokens_per_step"] = runs["world1"][0][0]["tokens"]
    result["cpu_threads_per_rank"] = 1
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
