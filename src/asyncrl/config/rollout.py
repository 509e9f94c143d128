"""``rollout``: workers, sampling, the generation engine, the agent gateway and tree groups
(:mod:`asyncrl.rollout`, :mod:`asyncrl.engine`, :mod:`asyncrl.gateway`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag, field_validator

from asyncrl.config.base import Section, kind_of


class SamplingConfig(Section):
    """How the rollout engine samples model turns."""

    temperature: float = Field(1.0, gt=0, le=10)
    """Softmax temperature. Behaviour log-probs are those of this tempered distribution."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass. Log-probs are of the renormalised nucleus distribution."""
    max_new_tokens: int = Field(48, ge=1, le=32768)
    """Tokens per model turn at most."""


class _EngineBase(Section):
    """The generation engine behind the rollout workers."""

    kind: str = "hf"
    """``hf``: batched sampling with transformers on the worker's own device; ``vllm``: vLLM in
    processes of its own (optional install: ``make test-vllm``; see docs/engines.md). With ``vllm``
    the policy loss defaults to ``decoupled_ppo`` (PPO with truncated importance sampling) unless
    ``algo.policy_loss.kind`` is set explicitly."""
    max_batch: int = Field(64, ge=1, le=4096)
    """Sequences generated together at most."""
    batch_wait_ms: float = Field(20.0, ge=0, le=10000)
    """How long a model turn may wait for others to join its batch (never when every live episode is
    already waiting)."""


class HFEngineConfig(_EngineBase):
    """The built-in engine: batched sampling with transformers on the worker's own device."""

    kind: Literal["hf"] = "hf"
    static_cache: Literal["auto", "on", "off"] = "auto"
    """Decode with a preallocated (static) KV cache and fixed batch buckets instead
    of a growing cache. ``auto``: on where the model runs on a CUDA GPU, off on CPU (where it
    brings nothing). Required for ``cuda_graphs``."""
    cuda_graphs: bool = True
    """With the static cache on a CUDA GPU: capture one decode step per batch bucket
    as a CUDA graph and replay it, so a step costs one launch instead of hundreds (falls back to
    eager decoding, with a warning, if capture fails)."""
    prefix_sharing: bool = True
    """Prefill each distinct prefix of a generation call's prompts once (a token trie); same samples and
    log-probs as an unshared prefill up to float rounding. See docs/engines.md."""
    prefix_cache: bool = True
    """Keep each sequence's KV after a model turn and prefill only the new tokens of a later prompt that
    extends it (the next turn); dropped at every weight load. See docs/engines.md."""
    prefix_cache_mb: float = Field(1024.0, gt=0, le=1_048_576)
    """Memory bound of the prefix cache in MiB (least recently used entries are evicted first).
    SmolLM2-135M in float32 holds 45 KiB of KV per token, so 1 GiB is about 23k tokens."""
    merge_lora: bool = True
    """With ``model.lora``: sample from a merged copy of the policy (``W + (alpha/r) B A``, refolded at
    every weight load) instead of through the adapter layers; costs the adapted weights once more in
    memory, log-probs equal to float32 rounding. See docs/engines.md."""
    packed_linear: bool = True
    """With ``merge_lora`` on a CPU: the merged copy's linear layers compute through weights packed by
    oneDNN (repacked at every load); costs those weights once more in memory, log-probs equal to float32
    rounding. The CPU fast path (this and the two below, :mod:`asyncrl.engine.cpu`) runs only under the
    torch and transformers releases it was written for (else one log line, and the model's own forward).
    See docs/engines.md."""
    fused_decode: bool = True
    """With ``packed_linear`` and a Llama-layout model (llama, qwen2, mistral without a sliding window):
    growing-cache decode steps run a written-out one-token forward over the packed weights
    (:mod:`asyncrl.engine.cpu.fused`); costs the q/k/v and gate/up weights once more in memory, log-probs
    equal to float32 rounding. See docs/engines.md."""
    fused_prefill: bool = True
    """With ``fused_decode``: prefills run the same written-out forward, ``n`` tokens a row (grouped-query
    attention without copying each key and value per query head; the LM head at each row's last token);
    log-probs equal to float32 rounding. See docs/engines.md."""
    compact_fraction: float = Field(0.25, ge=0, le=1)
    """Growing cache: drop finished rows from the decoding batch once they are at least this share of it
    (and at least one row). Lower: fewer wasted rows per step, more re-packing of the KV cache; 0 compacts
    at every finished row. The static cache never compacts (its shapes are fixed)."""

    @field_validator("static_cache", mode="before")
    @classmethod
    def _yaml_on_off(cls, v: Any) -> Any:
        """YAML reads a bare ``on`` / ``off`` as a boolean; take it as meant."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


class VLLMEngineConfig(_EngineBase):
    """vLLM in processes of its own (optional install; docs/engines.md)."""

    kind: Literal["vllm"] = "vllm"
    vllm_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype of the vllm engine (float32 keeps behaviour log-probs closest to the trainer's)."""
    vllm_kv_cache_gb: int = Field(1, ge=1, le=4096)
    """KV-cache memory of the vllm engine on CPU, in GiB (sets VLLM_CPU_KVCACHE_SPACE)."""


EngineConfig: TypeAlias = Annotated[
    Annotated[HFEngineConfig, Tag("hf")] | Annotated[VLLMEngineConfig, Tag("vllm")],
    Discriminator(kind_of("hf")),
]
"""``rollout.engine``: one model per ``kind``."""


class GatewayConfig(Section):
    """The OpenAI-compatible endpoint inside each rollout worker (``env.kind: agent``; docs/agents.md)."""

    host: str = "127.0.0.1"
    """Bind address. Loopback by default; any other address exposes the policy (a warning is logged)."""
    port: int = Field(0, ge=0, le=65535)
    """Port of worker 0 (worker ``i`` binds ``port + i``); 0: a free port chosen by the system."""
    model_name: str = "asyncrl-policy"
    """The one model name ``/v1/models`` lists and requests must name."""
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    """Largest request body accepted; larger ones are answered 413."""
    honor_sampling: bool = False
    """Use the request's ``temperature``/``top_p``. Off: the run's ``rollout.sampling`` is used for
    every call, so behaviour log-probs are those the trainer recomputes."""
    stale_calls: Literal["hold", "reject"] = "hold"
    """A call arriving while the worker's weights lag the newest by more than the staleness bound:
    ``hold`` it up to ``hold_s`` for new weights, then answer 429; ``reject``: answer 429 at once."""
    hold_s: float = Field(5.0, ge=0, le=600)
    """How long a stale call is held before it is answered 429 (stale_calls: hold)."""
    retry_after_s: int = Field(1, ge=1, le=3600)
    """``Retry-After`` of a 429 answer (the openai client waits this long and retries)."""
    max_pending_calls: int = Field(1024, ge=1, le=1_000_000)
    """Calls waiting for generation at most; more are answered 429."""
    agent_timeout_s: float = Field(300.0, gt=0, le=86400)
    """An agent program running longer is cancelled; its episode ends with outcome ``timeout``."""


TREE_TOKEN_BUDGET_FACTOR = 2
"""A token-budget tree group delivers at most this many times ``group_size`` episodes."""


class TreeConfig(Section):
    """Tree groups (``rollout.tree``): a group is a tree of episodes that branch at turn boundaries.

    ``roots`` independent episodes start the tree; then, round by round, chosen nodes (the state
    after a model turn of an existing episode) branch: ``branch − 1`` new episodes replay the
    prefix's model turns into a fresh environment and continue from there with fresh samples,
    until the budget is spent. Replayed turns are context, not trained again (docs/credit.md)."""

    enabled: bool = False
    """Build each group as a tree (off: ``group_size`` independent episodes)."""
    roots: int = Field(2, ge=1, le=1024)
    """Independent episodes at the root of each tree."""
    branch: int = Field(2, ge=2, le=64)
    """Children of a branching node (the episode already there counts as one)."""
    points: Literal["every_turn", "first_k", "entropy"] = "entropy"
    """Where to branch: ``every_turn`` (shallowest nodes first), ``first_k`` (only after the first
    ``first_k`` model turns) or ``entropy`` (where the next turn's sampled tokens were most
    surprising: mean −log p, an estimate of the policy's entropy there)."""
    first_k: int = Field(2, ge=1, le=1000)
    """``points: first_k``: the deepest turn after which a node may branch."""
    budget: Literal["leaves", "tokens"] = "leaves"
    """``leaves``: ``group_size`` finished episodes, as a flat group; ``tokens``: as many generated
    (not replayed) tokens as ``group_size`` flat episodes of the roots' mean length, at most
    ``2 × group_size`` episodes."""


class RolloutConfig(Section):
    """Rollout workers: how many, how many concurrent episodes, how they sample."""

    num_workers: int = Field(1, ge=1, le=1024)
    """Rollout worker processes."""
    concurrent_episodes: int = Field(32, ge=1, le=4096)
    """Episodes each worker runs at once (their model turns are batched together)."""
    group_size: int = Field(8, ge=1, le=1024)
    """Trajectories sampled per task (a group, for group baselines)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    engine: EngineConfig = Field(default_factory=HFEngineConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    temperature_jitter: float = Field(0.0, ge=0, le=1)
    """Per-episode temperature is drawn uniformly from temperature·(1 ± jitter)."""
    exploration_rate: float = Field(0.0, ge=0, le=1)
    """Share of episodes drawn from the hardest difficulty regardless of curriculum."""
    tree: TreeConfig = Field(default_factory=TreeConfig)
    adaptive_group_size: bool = False
    """Give a bucket (task type × difficulty) of rare success larger groups: with ``p`` its success over
    the curriculum window (once it holds ``orchestrator.curriculum.min_episodes`` episodes) and ``0 < p <
    orchestrator.signal.band_low``, its training groups get the smallest size ``G`` with ``s(p, G) = 1 −
    p^G − (1 − p)^G ≥ 1/2`` (half the groups carry a reward difference, :func:`asyncrl.learning_signal.group_size_for`),
    at least ``group_size`` and at most ``max_group_size``. Other buckets, held-out probes and tree groups
    keep ``group_size``. A group still travels whole as one record; a batch takes whole groups until it
    holds ``trainer.batch_size`` samples, so with larger groups a batch may hold up to
    ``max_group_size − 1`` samples more."""
    max_group_size: int = Field(32, ge=2, le=1024)
    """Largest group ``adaptive_group_size`` gives a bucket (episodes; below ``group_size`` it never
    lowers a group)."""

    @property
    def tree_max_leaves(self) -> int:
        """Most episodes one tree group can deliver (a tree with a token budget may exceed ``group_size``)."""
        tree = self.tree.enabled and self.tree.budget == "tokens"
        return TREE_TOKEN_BUDGET_FACTOR * self.group_size if tree else self.group_size
