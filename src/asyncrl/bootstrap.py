"""Role start-up: what every role process (trainer, rollout worker, evaluator) does first, whichever
launcher started it (a local process, a Ray actor, or ``asyncrl role ...`` as a service), and the
one decision of how many torch threads a compute role gets (:func:`torch_threads`)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Literal

from asyncrl.config import RunConfig
from asyncrl.policy.memory import set_mmap_threshold

ComputeRole = Literal["trainer", "rollout", "evaluator", "warm_start", "evaluation"]


def usable_cores() -> int:
    """CPU cores this process may use: ``OMP_NUM_THREADS`` where the environment sets it (a shared
    machine's way of saying how many), else the cores of its affinity mask."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # pragma: no cover - macOS, Windows


def torch_threads(cfg: RunConfig, role: ComputeRole) -> int:
    """Torch threads of ``role``'s process: ``launcher.solo_threads`` where its compute runs alone,
    ``launcher.torch_threads`` where it shares the machine with the other roles.

    Alone: the warm start (``asyncrl sft``, and the launcher's before any role starts), the job's
    held-out ``evaluation`` before the roles start and after they stop, and the
    trainer in ``control.mode: sync`` (rollout waits for the step, so the trainer may take every
    core while it trains; it waits, idle, while the batch is generated). In ``async`` and
    ``one_step_off`` modes the trainer and the rollout workers compute at the same time and keep
    ``torch_threads`` each, so they do not fight over cores. ``solo_threads: 0`` is
    :func:`usable_cores`.
    """
    lc = cfg.launcher
    # rule 5's barrier (sync): generating and training take turns, so the trainer computes alone
    alone = role in ("warm_start", "evaluation") or (role == "trainer" and cfg.staleness_policy().barrier)
    if not alone:
        return lc.torch_threads
    return lc.solo_threads or usable_cores()


@contextlib.contextmanager
def pinned_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads, then restore the process's previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def init_role_process(cfg_json: str, role: ComputeRole) -> RunConfig:
    """First thing every role process does: parse its config, pin torch threads, set the allocator."""
    cfg = RunConfig.model_validate_json(cfg_json)
    threads = torch_threads(cfg, role)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return cfg
