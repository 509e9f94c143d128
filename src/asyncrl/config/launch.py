"""``launcher``: how role processes are placed (:mod:`asyncrl.launch`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag

from asyncrl.config.base import Section, kind_of


class _LauncherBase(Section):
    """How role processes are placed."""

    kind: str = "local"
    """``local``: OS processes on this machine; ``ray``: Ray actors; ``external``: the roles are started
    elsewhere (``asyncrl role ...`` as services) and the orchestrator only watches their heartbeats."""
    torch_threads: int = Field(1, ge=1, le=1024)
    """torch threads per role process while the roles compute at the same time (1 avoids
    oversubscription on small machines)."""
    solo_threads: int = Field(0, ge=0, le=1024)
    """torch threads where one compute role runs alone: the warm start (``asyncrl sft``, and the
    launcher's before the roles start), the job's held-out evaluations before the roles start and
    after they stop, and the trainer in ``control.mode: sync`` (rollout waits for its step). 0: every
    core the process may use, or ``OMP_NUM_THREADS`` where the environment sets it. See
    ``asyncrl.bootstrap.torch_threads``."""
    stop_grace_s: float = Field(30.0, ge=0, le=3600)
    """A stop (SIGINT, SIGTERM, SIGHUP to the orchestrator, or ``asyncrl stop RUN``) asks every role to
    stop at its next safe point (the trainer writes a checkpoint) and waits this long for them; what is
    still running then is killed, as is everything at a second signal. 30 s sits inside Slurm's and
    Kubernetes' default grace periods (``KillWait`` 30 s, ``terminationGracePeriodSeconds`` 30 s):
    give the scheduler a longer grace when raising it."""
    orphan_timeout_s: float = Field(60.0, gt=0, le=86400)
    """No orphans: a role whose orchestrator has not beaten (the heartbeat in the control state, every
    tick) for this long stops by itself, as if the run had been stopped. A ``--resume`` that attaches
    sooner takes the run over (it reaps the old roles and starts its own)."""
    malloc_mmap_threshold_kb: int = Field(0, ge=0, le=1_048_576)
    """glibc only: allocations of at least this many KiB get their own pages (``mallopt
    M_MMAP_THRESHOLD``) and go back to the OS when freed, in every role process and the launcher. 0 keeps
    glibc's dynamic threshold; 1024–4096 trades some speed for a peak close to the live memory
    (docs/benchmarks.md, "The allocator, not the tensors")."""


class LocalLauncherConfig(_LauncherBase):
    """OS processes on this machine."""

    kind: Literal["local"] = "local"
    start: Literal["forkserver", "spawn"] = "forkserver"
    """How role processes start: ``forkserver``, forked from one server process that imported torch and
    transformers once, each with the launcher's environment of the moment it starts; ``spawn``, a fresh
    interpreter each, which imports them again (~5 s of CPU a role; start-up measured in docs/reliability.md)."""
    lend_threads: bool = False
    """Core lending (CPU models, one trainer rank): a waiting compute role lends its cores to the roles
    still computing, which raise their torch threads until it computes again. Off by default: no clear
    gain so far (docs/orchestrator.md, "Core lending")."""
    lend_after_ms: int = Field(250, ge=0, le=60_000)
    """A role's cores are lent only once it has waited this long: the short gaps between two model
    turns or two training steps are not worth a switch (each switch costs the borrower a moment of
    oversubscription when the lender comes back)."""
    lend_poll_ms: int = Field(50, ge=1, le=10_000)
    """Longest time between two reads of the lending board while a role computes (it reads it before
    a decoder layer's forward, at most this often): a returning lender has its cores back within it."""


class RayLauncherConfig(_LauncherBase):
    """Ray actors."""

    kind: Literal["ray"] = "ray"
    address: str | None = None
    """Cluster to join: ``auto`` (the cluster of ``ray start`` on this machine), ``ray://host:10001``
    (Ray Client), or unset for a local cluster started (and stopped) by the launcher."""
    rollout_cpus: float = Field(1.0, ge=0, le=1024)
    """CPUs requested by each rollout-worker actor."""
    rollout_gpus: float = Field(0.0, ge=0, le=64)
    """GPUs requested by each rollout-worker actor (fractions share a device)."""
    trainer_cpus: float = Field(1.0, ge=0, le=1024)
    """CPUs requested by the trainer actor."""
    trainer_gpus: float = Field(0.0, ge=0, le=64)
    """GPUs requested by the trainer actor (by each rank's, with ``trainer.world_size > 1``)."""
    trainer_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each trainer rank asks for (e.g. ``{trainer_node: 1}`` to keep the trainer
    on the nodes started with that resource)."""
    rollout_resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each rollout worker asks for."""
    place_timeout_s: float = Field(300.0, gt=0, le=86400)
    """How long an actor (or the trainer group's placement group) may take to be placed AND to start its
    Python process before the launch fails with an error naming the resources asked for. Starting a
    worker process takes seconds on an idle node but minutes on a loaded one."""
    trainer_placement: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """Ray placement-group strategy of the trainer ranks (one bundle per rank): ``PACK`` as few nodes as
    possible, ``STRICT_SPREAD`` one rank per node, ... (Ray's placement-group strategies)."""


class ExternalLauncherConfig(_LauncherBase):
    """Roles started elsewhere as services; the orchestrator watches their heartbeats."""

    kind: Literal["external"] = "external"
    heartbeat_timeout_s: float = Field(120.0, gt=0, le=86400)
    """A role whose metrics file has not changed for this long is reported as silent."""


LauncherConfig: TypeAlias = Annotated[
    Annotated[LocalLauncherConfig, Tag("local")]
    | Annotated[RayLauncherConfig, Tag("ray")]
    | Annotated[ExternalLauncherConfig, Tag("external")],
    Discriminator(kind_of("local")),
]
"""``launcher``: one model per ``kind``."""
