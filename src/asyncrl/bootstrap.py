"""Role start-up: what every role process (trainer, rollout worker, evaluator) does first, whichever
launcher started it (a local process, a Ray actor, or ``asyncrl role ...`` as a service)."""

from __future__ import annotations

import logging
import os

from asyncrl.config import RunConfig
from asyncrl.policy.memory import set_mmap_threshold


def init_role_process(cfg_json: str) -> RunConfig:
    """First thing every role process does: parse its config, pin torch threads, set the allocator."""
    cfg = RunConfig.model_validate_json(cfg_json)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.launcher.torch_threads))
    import torch

    torch.set_num_threads(cfg.launcher.torch_threads)
    set_mmap_threshold(cfg.launcher.malloc_mmap_threshold_kb)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return cfg
