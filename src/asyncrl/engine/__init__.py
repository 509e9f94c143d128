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

__all__ = [
    "GenerationEngine",
    "HFEngine",
    "Sample",
    "check_requests",
    "make_engine",
    "read_weights",
]


def make_engine(
    cfg: EngineConfig, policy: Policy, stop_token_ids: list[int], *, seed: int | None = None
) -> GenerationEngine:
    """The engine ``cfg.kind`` names, sampling from ``policy``."""
    if cfg.kind == "hf":
        static = {"auto": None, "on": True, "off": False}[cfg.static_cache]
        return HFEngine(
            policy,
            stop_token_ids,
            max_batch=cfg.max_batch,
            seed=seed,
            static_cache=static,
            cuda_graphs=cfg.cuda_graphs,
            prefix_cache_mb=cfg.prefix_cache_mb if cfg.prefix_cache else 0.0,
            prefix_sharing=cfg.prefix_sharing,
            compact_fraction=cfg.compact_fraction,
            merge_lora=cfg.merge_lora,
            packed_linear=cfg.packed_linear,
            fused_decode=cfg.fused_decode,
            fused_prefill=cfg.fused_prefill,
        )
    if cfg.kind == "vllm":  # optional dependency: imported only when chosen
        from asyncrl.engine.vllm_backend import VLLMEngine

        return VLLMEngine.from_policy(policy, stop_token_ids, cfg, seed=seed)
    raise ValueError(f"unknown engine kind {cfg.kind!r}; allowed: 'hf', 'vllm'")  # pragma: no cover
