"""Data-parallel trainer ranks: one trainer, ``trainer.world_size`` processes, one torch.distributed group.

Roles
    Rank 0 is the trainer role (:class:`~asyncrl.trainer.process.TrainerRole`): it alone touches the
    queue (lease, ack), the ledger, the replay buffer, the weight store and the checkpoint directory.
    Ranks 1..N-1 are followers (:func:`asyncrl.trainer.ranks.follow`): a replica of the policy and its
    optimiser that does what rank 0 broadcasts, one :data:`Command` at a time (a msgspec tagged union
    on msgpack, never pickle): :class:`Init`, :class:`Step`, :class:`Checkpoint`, :class:`Gather`,
    :class:`Beat`, :class:`Stop`.

Exactly the one-rank update
    Within each minibatch the learner cuts micro-batches exactly as one rank would (same rows, same
    token budget) and :func:`assign` gives each to one rank — largest first, to the rank with the
    fewest padded tokens so far, ties to the lowest rank: deterministic and balanced. Every rank
    computes the normalisers (``microbatch_weights``) over the WHOLE minibatch, so the SUM over ranks
    of the weighted micro-batch gradients is the one-rank gradient (DDP's or FSDP2's reduction, set to
    sum: :mod:`asyncrl.trainer.parallel`); clipping, the finiteness check and the optimiser step then
    see identical gradients on every rank — the replicas stay identical. Log-prob passes (proximal,
    reference, KL early stop) are split the same way and summed (each entry is computed by one rank,
    zero elsewhere). Metrics are gathered so that every rank merges the same list of micro-batch
    metrics one rank would have.

Faults
    Every collective, and the rendezvous, has ``trainer.dist_timeout_s``: a rank that died makes the
    others' next collective fail (closed connection, or the timeout), a rank that hangs makes them time
    out; each then raises and its process exits non-zero, and the supervisor stops the rest of the group
    and starts a new one from the newest checkpoint (:mod:`asyncrl.orchestrator.run`). Rank 0 acknowledges
    queue entries only after a checkpoint covers them, so a lost group loses nothing and trains nothing
    twice. Rank 0 sends :class:`Beat` when idle for a quarter of the timeout.
"""

from __future__ import annotations

import datetime
import os
import time

import msgspec
import torch
import torch.distributed as dist

from asyncrl.config import RunConfig
from asyncrl.records import Group, encode

_BEAT_FRACTION = 0.25
"""An idle rank 0 sends :class:`Beat` after this fraction of ``trainer.dist_timeout_s`` without a command."""


class Init(msgspec.Struct, tag=True):
    """Load this checkpoint (``""``: the initial policy): the one rank 0 resumed from."""

    ckpt: str


class Step(msgspec.Struct, tag=True):
    """Take the learner step on this batch (its wire-encoded groups) at this weight version, from
    rank 0's torch RNG state (the minibatch permutation draws from it)."""

    groups: list[bytes]
    version: int
    rng: bytes

    @classmethod
    def of(cls, batch: list[Group], version: int) -> Step:
        return cls([encode(g) for g in batch], version, torch.get_rng_state().numpy().tobytes())


class Checkpoint(msgspec.Struct, tag=True):
    """Write your shard of the optimiser state into this directory (collective)."""

    dir: str


class Gather(msgspec.Struct, tag=True):
    """All-gather the sharded policy's full state for rank 0 (collective)."""


class Beat(msgspec.Struct, tag=True):
    """Nothing: rank 0 is alive and waiting for data."""


class Stop(msgspec.Struct, tag=True):
    """The run is over."""


Command = Init | Step | Checkpoint | Gather | Beat | Stop
"""What rank 0 tells the followers: one msgspec tagged union (msgpack on the wire, never pickle)."""

_encode = msgspec.msgpack.Encoder().encode
_commands: msgspec.msgpack.Decoder[Command] = msgspec.msgpack.Decoder(Command)
_decode_parts = msgspec.msgpack.Decoder(list[tuple[dict[str, float], float, float]]).decode


def assign(sizes: list[int], world: int) -> list[int]:
    """The rank of each micro-batch (``sizes``: padded tokens of each, in the learner's order).

    Longest processing time first: micro-batches by decreasing size (ties: lower index first), each to
    the rank with the least work so far (ties: lower rank). Deterministic; with fewer micro-batches
    than ranks some ranks get none (their gradient contribution is zero).
    """
    load = [0] * world
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


class RankGroup:
    """This process's place in the trainer group, and the collectives the trainer needs."""

    def __init__(self, rank: int, world: int, timeout_s: float, device: torch.device) -> None:
        self.rank, self.world, self.timeout_s, self.device = rank, world, timeout_s, device
        self._sent = time.monotonic()

    @classmethod
    def join(cls, cfg: RunConfig, rank: int, addr: str, port: int) -> RankGroup:
        """Rendezvous at ``tcp://addr:port`` (rank 0 listens there), or ``addr = "env://"``: at
        ``MASTER_ADDR:MASTER_PORT`` (torchrun's store when torchrun started us); gloo on CPU, nccl on CUDA."""
        from asyncrl.policy.model import resolve_device

        if cfg.model.device != "cpu" and torch.cuda.is_available():  # one device per rank on a node
            local = os.environ.get("LOCAL_RANK")  # torchrun's; else ranks fill a node's devices in order
            torch.cuda.set_device(int(local) if local else rank % torch.cuda.device_count())
        device = resolve_device(cfg.model.device)
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = cfg.trainer.dist_timeout_s
        dist.init_process_group(
            backend,
            init_method=addr if addr == "env://" else f"tcp://{addr}:{port}",
            rank=rank,
            world_size=cfg.trainer.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        return cls(rank, cfg.trainer.world_size, timeout, device)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- the learner's hooks ----------------------------------------------------------------------
    def mine(self, sizes: list[int]) -> list[int]:
        """Indices of the micro-batches (``sizes`` in padded tokens) this rank runs."""
        return [i for i, r in enumerate(assign(sizes, self.world)) if r == self.rank]

    def most(self, sizes: list[int]) -> int:
        """The most micro-batches any rank runs (a sharded rank pads its share to this many passes)."""
        owners = assign(sizes, self.world)
        return max((owners.count(r) for r in range(self.world)), default=0)

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks, in place (returned for chaining)."""
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def per_rank(self, count: int) -> list[int]:
        """Every rank's ``count``, in rank order (one all-reduce of a ``world``-long vector)."""
        counts = torch.zeros(self.world, dtype=torch.long, device=self._comm)
        counts[self.rank] = count
        return [int(c) for c in self.sum_(counts).tolist()]

    def gather_parts(
        self, parts: list[tuple[dict[str, float], float, float]]
    ) -> list[tuple[dict[str, float], float, float]]:
        """Every rank's micro-batch metrics, in rank order (so each rank merges the same list)."""
        return [p for blob in self._all_gather_bytes(_encode(parts)) for p in _decode_parts(blob)]

    # -- commands from rank 0 ------------------------------------------------------------------------
    def send(self, cmd: Command) -> None:
        """Rank 0: broadcast one command to the followers."""
        self._broadcast_bytes(_encode(cmd))
        self._sent = time.monotonic()

    def receive(self) -> Command:
        """A follower: the next command from rank 0 (raises when rank 0 is gone or past the timeout)."""
        return _commands.decode(self._broadcast_bytes(b""))

    def beat(self) -> None:
        """Rank 0, idle: tell the followers it is alive, at most every quarter of the timeout."""
        if time.monotonic() - self._sent > _BEAT_FRACTION * self.timeout_s:
            self.send(Beat())

    # -- bytes over the group --------------------------------------------------------------------
    def _bytes_tensor(self, data: bytes) -> torch.Tensor:
        if not data:
            return torch.empty(0, dtype=torch.uint8, device=self._comm)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._comm)

    @property
    def _comm(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _broadcast_bytes(self, data: bytes) -> bytes:
        size = torch.tensor([len(data)], dtype=torch.long, device=self._comm)
        dist.broadcast(size, src=0)
        buf = (
            self._bytes_tensor(data)
            if self.leader
            else torch.empty(int(size), dtype=torch.uint8, device=self._comm)
        )
        dist.broadcast(buf, src=0)
        return bytes(buf.cpu().numpy())

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        size = torch.tensor([len(data)], dtype=torch.long, device=self._comm)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        dist.all_gather(sizes, size)
        width = max(int(s) for s in sizes)
        buf = torch.zeros(width, dtype=torch.uint8, device=self._comm)
        buf[: len(data)] = self._bytes_tensor(data)
        out = [torch.empty_like(buf) for _ in range(self.world)]
        dist.all_gather(out, buf)
        return [bytes(o[: int(s)].cpu().numpy()) for o, s in zip(out, sizes, strict=True)]
