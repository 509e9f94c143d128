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
from asyncrl.records import decode_group
from asyncrl.trainer.distributed import Beat, Checkpoint, Gather, Init, RankGroup, Step, Stop

ENV_RENDEZVOUS = "env://"
"""The rendezvous address meaning "from MASTER_ADDR / MASTER_PORT" (``asyncrl role trainer``; under
torchrun, its agent's store)."""


def trainer_rank_main(cfg_json: str, run_dir: str, resume: bool, rank: int, addr: str, port: int) -> None:
    """Process entry point of rank ``rank`` (spawned by the launcher; rank 0 listens on ``addr:port``)."""
    started = time.time()
    from asyncrl.bootstrap import init_role_process

    cfg = init_role_process(cfg_json, "trainer")
    group = RankGroup.join(cfg, rank, addr, port)
    if rank == 0:
        from asyncrl.trainer.process import TrainerRole

        TrainerRole(cfg, Path(run_dir), resume=resume, started=started, group=group).run()
    else:
        follow(cfg, Path(run_dir), group)
    group.close()


def follow(cfg: RunConfig, run_dir: Path, group: RankGroup) -> None:
    """A rank other than 0: a replica of the policy and optimiser that does what rank 0 says."""
    from asyncrl.trainer.checkpoint import write_optimizer_shards
    from asyncrl.trainer.process import load_learner

    torch.manual_seed(cfg.seed)
    hello = group.receive()
    if not isinstance(hello, Init):
        raise RuntimeError(f"trainer rank {group.rank}: expected Init from rank 0, got {hello!r}")
    ckpt = Path(hello.ckpt) if hello.ckpt else None
    learner, _ = load_learner(cfg, run_dir, ckpt, random.Random(cfg.seed), group)
    while True:
        match group.receive():
            case Step(groups, version, rng):
                torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
                learner.step([decode_group(b) for b in groups], version)
            case Checkpoint(dir):
                write_optimizer_shards(Path(dir), learner.optimizer)
            case Gather():  # rank 0 publishes or checkpoints a sharded policy
                learner.parallel.gather()
            case Beat():
                pass
            case Stop():
                return
            case other:
                raise RuntimeError(f"trainer rank {group.rank}: unexpected command {other!r} from rank 0")
