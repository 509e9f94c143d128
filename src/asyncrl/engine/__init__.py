"""Generation engines: turn token prompts into sampled continuations with behaviour log-probs.

The interface, the behaviour log-prob definition and the one weight-load method:
:mod:`asyncrl.engine.base`; backends: :mod:`asyncrl.engine.hf` (built in) and
:mod:`asyncrl.engine.vllm_backend` (optional dependency, imported only when
``rollout.engine.kind: vllm`` is used); :func:`make_engine` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.engine.base import GenerationEngine, Sample, check_requests, read_weights
from asyncrl.engine.hf import HFEngine

if TYPE_CHECKING:
    from asyncrl.config import EngineConfig
    from asyncrl.policy.model import Policy

__all__ = ["GenerationEngine", "HFEngine", "Sample", "check_requests", "make_engine", "read_weights"]


def make_engine(
    cfg: EngineConfig, policy: Policy, stop_token_ids: list[int], *, seed: int | None = None
) -> GenerationEngine:
    """The engine ``cfg.kind`` names, sampling from ``policy``."""
    if cfg.kind == "hf":
        return HFEngine(policy, cfg, stop_token_ids, seed=seed)
    if cfg.kind == "vllm":  # optional dependency: imported only when chosen
        from asyncrl.engine.vllm_backend import VLLMEngine

        return VLLMEngine.from_policy(policy, stop_token_ids, cfg, seed=seed)
    raise ValueError(f"unknown engine kind {cfg.kind!r}; allowed: 'hf', 'vllm'")  # pragma: no cover
