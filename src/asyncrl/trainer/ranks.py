"""The processes of a trainer group (``trainer.world_size > 1``; the protocol: :mod:`asyncrl.trainer.distributed`).

:func:`trainer_rank_main` is every rank's entry point (a launcher starts N of them with the same
rendezvous address): rank 0 runs the ordinary trainer role, the others :func:`follow` it. Any
failure of a collective — a peer that died, or one past ``trainer.dist_timeout_s`` — raises out of
here, so the process exits non-zero and the supervisor restarts the whole group.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from asyncrl.config import RunConfig
from asyncrl.records import decode_trajectory
from asyncrl.trainer.distributed import Group

ENV_RENDEZVOUS = "env://"
"""The rendezvous address meaning "from MASTER_ADDR / MASTER_PORT" (``asyncrl role trainer``; under
torchrun, its agent's store)."""


def trainer_rank_main(cfg_json: str, run_dir: str, resume: bool, rank: int, addr: str, port: int) -> None:
    """Process entry point of rank ``rank`` (spawned by the launcher; rank 0 listens on ``addr:port``)."""
    started = time.time()
    from asyncrl.bootstrap import init_role_process

    cfg = init_role_process(cfg_json, "trainer")
    group = Group.join(cfg, rank, addr, port)
    if rank == 0:
        from asyncrl.trainer.process import TrainerRole

        TrainerRole(cfg, Path(run_dir), resume=resume, started=started, group=group).run()
    else:
        follow(cfg, Path(run_dir), group)
    group.close()


def follow(cfg: RunConfig, run_dir: Path, group: Group) -> None:
    """A rank other than 0: a replica of the policy and optimiser that does what rank 0 says."""
    from asyncrl.trainer.checkpoint import write_optimizer_shards
    from asyncrl.trainer.process import load_learner

    torch.manual_seed(cfg.seed)
    hello = group.receive()
    if hello["op"] != "init":
        raise RuntimeError(f"trainer rank {group.rank}: expected 'init' from rank 0, got {hello['op']!r}")
    learner, _ = load_learner(
        cfg, run_dir, Path(hello["ckpt"]) if hello["ckpt"] else None, random.Random(cfg.seed), group
    )
    while True:
        cmd = group.receive()
        op = cmd["op"]
        if op == "step":
            torch.set_rng_state(torch.frombuffer(bytearray(cmd["rng"]), dtype=torch.uint8))
            learner.step([decode_trajectory(b) for b in cmd["trajs"]], int(cmd["version"]))
        elif op == "ckpt":
            write_optimizer_shards(Path(cmd["dir"]), learner.optimizer)
        elif op == "gather" and learner.sharded is not None:  # rank 0 publishes or checkpoints
            learner.sharded.gather()
        elif op == "stop":
            return
        elif op != "beat":
            raise RuntimeError(f"trainer rank {group.rank}: unknown command {op!r} from rank 0")
