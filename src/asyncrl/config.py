"""The run configuration: one pydantic model tree, the only place defaults live.

A run is described by a YAML file whose top level is :class:`RunConfig`, plus dotted
overrides from the command line (``--set trainer.lr=1e-5``). Every model forbids unknown
keys, constrains every number, and documents every field (``asyncrl config explain``
prints those docs). :func:`load_config` turns any user mistake into one
:class:`ConfigError` whose message names the field path, the bad value and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from asyncrl.algo.config import PolicyLossConfig
from asyncrl.errors import UserError
from asyncrl.staleness import StalenessPolicy


class Section(BaseModel):
    """Base for every config section: unknown keys are errors, fields carry docstrings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


def _kind_of(default: str) -> Callable[[Any], Any]:
    """Discriminator of a variant section: its ``kind``, or ``default`` where a mapping has none.

    Variant sections (``transport``, ``weights``, ``rollout.engine``, ``env.latency``,
    ``credit.value``, ``launcher``, ``control.state``) are unions of one model per ``kind``, each with only the fields that mean
    something for that kind; a field of another kind is an error (see :func:`format_validation_error`).
    """

    def kind(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return getattr(value, "kind", None)
        if isinstance(value, dict):
            return value.get("kind", default)
        return default  # not a mapping: the default kind's model reports the type error

    return kind


def variants(field: FieldInfo) -> dict[str, type[BaseModel]]:
    """``{kind: model}`` of a variant-section field; empty for any other field."""
    if not any(isinstance(m, Discriminator) for m in field.metadata):
        return {}
    out: dict[str, type[BaseModel]] = {}
    for arg in get_args(field.annotation):
        cls, *meta = get_args(arg)
        out[next(m.tag for m in meta if isinstance(m, Tag))] = cls
    return out


def drop_stale_defaults(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the fields of another kind that hold that field's default, in every variant section.

    A resolved config written before the variant sections (a run directory's ``config.yaml``) holds every
    field of every kind at its default (``transport: {kind: embedded, redis_url: redis://127.0.0.1:6379/0}``);
    those say nothing and are dropped so such a run can be resumed and reported. A field of another kind
    with any other value stays, and is refused with a message naming its kind."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, field in model.model_fields.items():
        sub = out.get(name)
        if not isinstance(sub, dict):
            continue
        kinds = variants(field)
        if kinds:
            factory = field.default_factory
            default = (
                factory.model_fields["kind"].default
                if isinstance(factory, type) and issubclass(factory, BaseModel)
                else None
            )
            cls = kinds.get(str(sub.get("kind", default)))
            if cls is None:
                continue
            stale = [
                key
                for key, value in sub.items()
                if key not in cls.model_fields
                and any(
                    key in other.model_fields and other.model_fields[key].default == value
                    for other in kinds.values()
                )
            ]
            out[name] = drop_stale_defaults(cls, {k: v for k, v in sub.items() if k not in stale})
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out[name] = drop_stale_defaults(field.annotation, sub)
    return out


def _redis_url(url: str) -> str:
    """Reject a malformed Redis URL at load time (the message shows it masked)."""
    from asyncrl.credentials import check_url_syntax

    try:
        check_url_syntax(url, "the URL")
    except UserError as exc:
        raise ValueError(str(exc)) from None
    return url


# ---------------------------------------------------------------------------------------------
class LoraConfig(Section):
    """Low-rank adapters (LoRA, via peft): the trainer trains only the adapter, and weight versions
    carry only the adapter's tensors (see docs/models.md#lora)."""

    rank: int = Field(16, ge=1, le=1024)
    """Adapter rank r."""
    alpha: int = Field(32, ge=1, le=65536)
    """Scaling numerator: the update is (alpha / rank) * B @ A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input in training. Non-zero makes the trainer's log-probs differ
    from the sampler's (train vs eval mode), so it is 0 by default."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the linear layers that get adapters (Llama/Qwen2/Mistral naming)."""


class ModelConfig(Section):
    """The policy network: built fresh from these numbers, or loaded from a local directory."""

    path: str | None = None
    """Local Hugging Face causal-LM directory (config.json, safetensors, tokenizer files with a
    chat template), e.g. one written by ``asyncrl model import``. When set, the architecture
    fields below are ignored and the tokenizer and chat template come from the same directory.
    Nothing is ever downloaded."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of a loaded model in every role. float32 is the CPU default: on CPUs
    without bf16 instructions bfloat16 is over 10x slower."""
    trust_remote_code: bool = False
    """Allow a model directory to run its own Python code (custom architectures). Off: only
    architectures that ship with transformers load."""
    family: Literal["qwen2", "llama"] = "qwen2"
    """Architecture family of a freshly built model."""
    hidden_size: int = Field(64, ge=8, le=16384)
    """Width of the residual stream."""
    num_layers: int = Field(2, ge=1, le=256)
    """Number of transformer blocks."""
    num_heads: int = Field(4, ge=1, le=256)
    """Attention heads; must divide hidden_size."""
    num_kv_heads: int = Field(2, ge=1, le=256)
    """Key/value heads (grouped-query attention); must divide num_heads."""
    intermediate_size: int = Field(192, ge=8, le=65536)
    """Width of the MLP."""
    max_context: int | None = Field(None, ge=16, le=1_048_576)
    """Context length in tokens: prompt + all turns; longer episodes end as ``truncated``. Unset:
    the loaded model's own context (``max_position_embeddings``), or 512 for a built model."""
    tokenizer: Literal["char", "byte", "hf"] | None = None
    """``char``/``byte``: a locally built tokenizer with asyncrl's text protocol (built models
    only); ``hf``: the tokenizer and chat template of ``path``. Unset: ``hf`` when ``path`` is
    set, else ``char``."""
    tool_format: Literal["auto", "hermes", "qwen25", "llama3_json", "mistral", "text"] = "auto"
    """How the model writes tool calls (see docs/models.md): ``hermes`` (``<tool_call>{json}
    </tool_call>``, Qwen2.5's and Qwen3's), ``llama3_json`` (a bare JSON object), ``mistral``
    (``[TOOL_CALLS] [...]`` with 9-character ids), ``text`` (asyncrl's ``<tool>NAME(ARGS)</tool>``
    protocol of the char models). ``auto``: ``text`` for char/byte tokenizers, else read from the
    chat template's own tool-call markers (a template whose calls asyncrl cannot read is an error
    that asks for this setting)."""
    multi_turn: Literal["auto", "bridge", "per_turn"] = "auto"
    """How a multi-turn episode becomes training samples (see docs/models.md). ``bridge``: one
    sample per episode, each prompt the previous prompt + the sampled turn + the rendered
    observation delta; ``per_turn``: each model turn is prompted with the template's own rendering
    of the chat so far (what the model sees at inference, e.g. Qwen3 without earlier reasoning)
    and is its own sample, all carrying the episode's reward. ``auto``: ``bridge`` when the
    template is prefix-stable (appending a message only appends text), else ``per_turn``."""
    observation_role: Literal["auto", "tool", "user"] = "auto"
    """Chat role of tool results and other environment feedback. ``auto``: ``tool`` when the chat
    template knows a tool role, else ``user``."""
    system_prompt: str | None = None
    """System message of every episode (HF tokenizers). Unset: a generated one that lists the
    environment's tools, the call format and how to answer."""
    lora: LoraConfig | None = None
    """Train low-rank adapters instead of every weight (pretrained models, i.e. with ``path``);
    unset: full fine-tuning."""
    stop_strings: list[str] = Field(default_factory=list)
    """Extra strings that end a model turn (besides the end-of-turn tokens of the model's
    generation config); may span several tokens. The turn keeps the tokens up to the one that
    completes the string."""
    seed: int = Field(0, ge=0)
    """Seed of the random initialisation."""
    device: str = "auto"
    """Where every role's model runs: ``auto`` (the first visible CUDA GPU, else the CPU; under
    Ray, the GPU the role was given), ``cpu``, ``cuda`` or ``cuda:N``. Weights move between roles
    as CPU tensors, so roles may differ (see docs/engines.md)."""

    @field_validator("device")
    @classmethod
    def _device_spec(cls, v: str) -> str:
        if v in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", v):
            return v
        raise ValueError(f"{v!r} is not a device; allowed: 'auto', 'cpu', 'cuda', 'cuda:N'")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.path is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size})")
            if self.num_heads % self.num_kv_heads:
                raise ValueError(
                    f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})"
                )
            if self.tokenizer == "hf":
                raise ValueError(
                    "tokenizer 'hf' needs model.path (a local Hugging Face model directory); "
                    "built models use 'char' or 'byte'"
                )
            if self.lora is not None:
                raise ValueError(
                    "model.lora adapts a pretrained model: set model.path (e.g. .cache/models/"
                    "smollm2-135m-instruct from `asyncrl model import`); a 0.1M-parameter model built "
                    "from config trains all its weights"
                )
        elif self.tokenizer in ("char", "byte"):
            raise ValueError(
                f"tokenizer {self.tokenizer!r} is for models built from config; a model loaded from "
                "model.path uses its own tokenizer: leave model.tokenizer unset or set it to 'hf'"
            )
        return self

    @property
    def is_pretrained(self) -> bool:
        """A model loaded from ``path`` (its own tokenizer and chat template)."""
        return self.path is not None

    @property
    def tokenizer_kind(self) -> Literal["char", "byte", "hf"]:
        """The tokenizer in effect (``tokenizer`` resolved against ``path``)."""
        if self.tokenizer is not None:
            return self.tokenizer
        return "hf" if self.path is not None else "char"

    @property
    def built_context(self) -> int:
        """Context of a model built from config."""
        return self.max_context if self.max_context is not None else 512


class _LatencyBase(Section):
    """Simulated tool latency added to every environment step."""

    kind: str = "none"
    """Distribution of the added delay: ``none``, ``constant``, ``lognormal`` or ``pareto``."""


class NoLatencyConfig(_LatencyBase):
    """No simulated latency."""

    kind: Literal["none"] = "none"


class _DelayBase(_LatencyBase):
    seconds: float = Field(0.0, ge=0, le=600)
    """Constant delay, or the median (lognormal) / scale x_m (pareto) of the delay."""
    max_seconds: float = Field(60.0, gt=0, le=3600)
    """Cap on any single delay."""


class ConstantLatencyConfig(_DelayBase):
    """The same delay before every step."""

    kind: Literal["constant"] = "constant"


class LognormalLatencyConfig(_DelayBase):
    """Lognormal delays (median ``seconds``, shape ``sigma``)."""

    kind: Literal["lognormal"] = "lognormal"
    sigma: float = Field(1.0, gt=0, le=10)
    """Lognormal shape (std of the log-delay)."""


class ParetoLatencyConfig(_DelayBase):
    """Pareto delays (scale ``seconds``, tail index ``alpha``)."""

    kind: Literal["pareto"] = "pareto"
    alpha: float = Field(1.5, gt=0.1, le=100)
    """Pareto tail index; smaller means heavier tail (1 < alpha < 2: infinite variance)."""


LatencyConfig: TypeAlias = Annotated[
    Annotated[NoLatencyConfig, Tag("none")]
    | Annotated[ConstantLatencyConfig, Tag("constant")]
    | Annotated[LognormalLatencyConfig, Tag("lognormal")]
    | Annotated[ParetoLatencyConfig, Tag("pareto")],
    Discriminator(_kind_of("none")),
]
"""``env.latency``: one model per ``kind``."""


class FaultConfig(Section):
    """Injected environment faults, for testing robustness."""

    exception_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step raises an exception."""
    hang_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step hangs (until the guard's timeout)."""
    malformed_rate: float = Field(0.0, ge=0, le=1)
    """Probability that a step returns a malformed observation."""
    task_types: list[str] = Field(default_factory=list)
    """Inject faults only into episodes of these task types or ``type:difficulty`` buckets (empty: all)."""
    active_from: float = Field(0.0, ge=0)
    """Unix time before which no fault is injected (0: from the start)."""
    active_until: float = Field(0.0, ge=0)
    """Unix time from which no fault is injected (0: never stops)."""
    switch_file: str | None = None
    """Inject faults only while this file exists (a chaos switch for tests and drills)."""


class GuardConfig(Section):
    """Isolation of environment faults: timeouts, retries and the fallback observation."""

    step_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Wall-clock limit of one environment call."""
    retries: int = Field(1, ge=0, le=10)
    """Extra attempts after a failed call."""
    fault_reward: float = Field(-0.1, ge=-10, le=0)
    """Process reward given to a turn whose environment call failed on every attempt."""
    fault_observation: str = "[tool error]"
    """Observation text returned after the last failed attempt."""


class SandboxConfig(Section):
    """Sandbox limits of the ``python`` environment, each enforced per run of model-written code.

    See docs/environments.md#the-python-sandbox; ``asyncrl.envs.SandboxLimits`` is this model."""

    cpu_seconds: int = Field(2, ge=1, le=3600)
    """CPU time (RLIMIT_CPU); the process gets SIGXCPU, one second later SIGKILL."""
    wall_seconds: float = Field(5.0, gt=0, le=3600)
    """Wall-clock limit enforced by the host (kills the run's processes). Keep it below
    ``env.guard.step_timeout_s``."""
    memory_bytes: int = Field(512 * 2**20, ge=2**20, le=2**40)
    """Address-space limit (RLIMIT_AS) of each process."""
    max_processes: int = Field(16, ge=1, le=4096)
    """Processes/threads of the run's uid (RLIMIT_NPROC)."""
    file_size_bytes: int = Field(8 * 2**20, ge=0, le=2**40)
    """Largest file the code may write (RLIMIT_FSIZE)."""
    disk_bytes: int = Field(16 * 2**20, ge=4096, le=2**40)
    """Size of the private tmpfs work dir."""
    max_open_files: int = Field(64, ge=4, le=65536)
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_output_bytes: int = Field(16384, ge=1, le=2**30)
    """stdout and stderr are each capped at this; writing more kills the run."""
    max_code_chars: int = Field(20000, ge=1, le=10_000_000)
    """Longer code is refused without running (``error: code longer than ...``)."""
    require_isolation: bool = True
    """Refuse to run (error result) when network or filesystem isolation is unavailable."""
    uid_base: int = Field(2_000_000, ge=1000, le=2**31 - 1)
    """First uid of the pool of dedicated uids (root mode). The pool must not overlap real users."""
    uid_count: int = Field(1000, ge=1, le=1_000_000)
    """Number of uids in the pool: concurrent runs at most (each locks one)."""
    python: str | None = None
    """Interpreter for the code; unset: this process's base interpreter."""


class EnvConfig(Section):
    """The environment the agent acts in, and its task source."""

    kind: Literal["calculator", "kb_lookup", "python", "strings", "plugin", "agent"] = "calculator"
    """Built-in environment, ``plugin`` for a user class named by ``path``, or ``agent`` for a user
    agent program ``async def run(task, client) -> reward | None`` named by ``path``, whose OpenAI
    calls go through the worker's gateway (docs/agents.md)."""
    path: str | None = None
    """kind: plugin, agent — import path ``package.module:ClassName`` of a user environment (plugin),
    or ``package.module:function`` of an agent program (agent)."""
    agent_tasks: str = "calculator"
    """kind: agent — the built-in environment kind (or plugin ``module:Class``) whose task source,
    held-out split and warm-start demonstrations the agent's episodes use."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to the environment's constructor."""
    max_turns: int = Field(6, ge=1, le=256)
    """Model turns per episode before it ends as ``truncated``."""
    min_difficulty: int = Field(2, ge=0, le=100)
    """Lowest task difficulty drawn (calculator: number of steps)."""
    max_difficulty: int = Field(3, ge=0, le=100)
    """Highest task difficulty drawn."""
    heldout_size: int = Field(64, ge=1, le=100000)
    """Number of held-out evaluation tasks (disjoint from training tasks)."""
    seed: int = Field(1234, ge=0)
    """Seed of the task generator (and knowledge base)."""
    latency: LatencyConfig = Field(default_factory=NoLatencyConfig)
    faults: FaultConfig = Field(default_factory=FaultConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if self.kind == "plugin" and not self.path:
            raise ValueError("env.kind 'plugin' needs env.path, e.g. 'my_pkg.my_env:MyEnv'")
        if self.kind == "agent" and not self.path:
            raise ValueError("env.kind 'agent' needs env.path, e.g. 'my_agents.calculator:run'")
        if self.min_difficulty > self.max_difficulty:
            raise ValueError(
                f"min_difficulty ({self.min_difficulty}) must not exceed max_difficulty ({self.max_difficulty})"
            )
        return self


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
    """Prefill each distinct prefix of a generation call once: a token trie over the call's prompts
    (GRPO group members share the whole prompt, tasks share the system prompt) computes every
    distinct prefix token once and the rows read its KV. Same samples and log-probs as an unshared
    prefill, up to float rounding. See docs/engines.md."""
    prefix_cache: bool = True
    """Keep each sequence's KV after a model turn and, when a later prompt extends it (the next turn
    of a multi-turn episode), prefill only the new tokens. Entries are dropped at every weight load.
    Both the growing and the static cache use it. See docs/engines.md."""
    prefix_cache_mb: float = Field(1024.0, gt=0, le=1_048_576)
    """Memory bound of the prefix cache in MiB (least recently used entries are evicted first).
    SmolLM2-135M in float32 holds 45 KiB of KV per token, so 1 GiB is about 23k tokens."""

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
    Discriminator(_kind_of("hf")),
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

    @property
    def max_group_size(self) -> int:
        """Most episodes one group can deliver (a tree with a token budget may exceed ``group_size``)."""
        tree = self.tree.enabled and self.tree.budget == "tokens"
        return TREE_TOKEN_BUDGET_FACTOR * self.group_size if tree else self.group_size


class SFTConfig(Section):
    """Warm start: supervised training on corrupted reference-solver demonstrations.

    Unset fields follow the model kind (:data:`SFT_DEFAULTS`): a 0.1M-parameter model built from
    config needs hundreds of steps at a high learning rate to learn the format at all; a
    pretrained model needs tens of steps at a small one (or none: ``steps: 0``)."""

    steps: int | None = Field(None, ge=0, le=1_000_000)
    """Optimiser steps (unset: 800 built, 20 pretrained; 0 skips the warm start's training)."""
    batch_size: int | None = Field(None, ge=1, le=4096)
    """Demonstrations per optimiser step (unset: 32 built, 8 pretrained)."""
    lr: float | None = Field(None, gt=0, le=1)
    """Peak AdamW learning rate, linear warm-up then cosine decay to 10% (unset: 3e-3 built,
    1e-5 pretrained, 2e-4 pretrained with LoRA)."""
    num_demos: int | None = Field(None, ge=1, le=10_000_000)
    """Demonstrations generated by the reference solver (unset: 2000 built, 200 pretrained)."""
    corruption_rate: float = Field(0.5, ge=0, le=1)
    """Share of demonstrations with a mistake (wrong operand, skipped call, wrong final copy)."""
    seed: int = Field(0, ge=0)
    """Seed of demonstration sampling and batch order."""

    def resolved(self, pretrained: bool, lora: bool = False) -> ResolvedSFT:
        """Every field concrete: unset ones from :data:`SFT_DEFAULTS` for the model kind."""
        base = SFT_DEFAULTS["lora" if lora else "pretrained" if pretrained else "built"]
        return ResolvedSFT(
            steps=base["steps"] if self.steps is None else self.steps,
            batch_size=base["batch_size"] if self.batch_size is None else self.batch_size,
            lr=base["lr"] if self.lr is None else self.lr,
            num_demos=base["num_demos"] if self.num_demos is None else self.num_demos,
            corruption_rate=self.corruption_rate,
            seed=self.seed,
        )


SFT_DEFAULTS: dict[str, dict[str, Any]] = {
    "built": {"steps": 800, "batch_size": 32, "lr": 3e-3, "num_demos": 2000},
    "pretrained": {"steps": 20, "batch_size": 8, "lr": 1e-5, "num_demos": 200},
    "lora": {"steps": 20, "batch_size": 8, "lr": 2e-4, "num_demos": 200},
}
"""Warm-start defaults per model kind (the only place they are written)."""


class ResolvedSFT(BaseModel):
    """:class:`SFTConfig` with the model kind's defaults filled in (what the warm start uses)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int
    batch_size: int
    lr: float
    num_demos: int
    corruption_rate: float
    seed: int


class TrainerConfig(Section):
    """The learner: batches, optimisation, publishing and checkpoints."""

    lr: float = Field(1e-3, gt=0, le=1)
    """Adam learning rate."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over ``total_steps`` (after warm-up)."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear learning-rate warm-up."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW weight decay."""
    batch_size: int = Field(64, ge=1, le=1_000_000)
    """Trajectories per training step (a multiple of rollout.group_size keeps groups whole)."""
    epochs: int = Field(1, ge=1, le=100)
    """Passes over each batch."""
    minibatches: int = Field(1, ge=1, le=1024)
    """Optimiser steps per epoch: each epoch splits the batch into this many minibatches and takes
    one optimiser step on each (PPO-style; more steps per batch, not less memory)."""
    max_tokens_per_microbatch: int = Field(4096, ge=0, le=100_000_000)
    """Memory bound of one forward/backward pass, in padded tokens (rows × longest row): each
    minibatch is cut into micro-batches of at most this many tokens whose gradients are accumulated
    into the minibatch's ONE optimiser step, with the loss normalised so that the accumulated
    gradient equals the whole minibatch's. A row longer than the budget is a micro-batch of its own.
    0: the whole minibatch in one pass. With ``share_prefixes`` in use, the budget counts the
    micro-batch's distinct prefix tokens (its token trie's nodes) instead."""
    share_prefixes: bool = True
    """Prefix-shared forward (tree training): rows that share a prefix (a group's prompt, the system
    prompt) are grouped into the same micro-batch and forwarded as one token trie, each shared token
    computed once, with the same log-probs and gradients as the padded batch up to float rounding. Used
    for a minibatch when its estimated decoder FLOPs are at most 0.8 of the padded layout's (the
    tree's attention is dense, so a small model with long rows keeps the padded layout) and the
    architecture is chunkable (llama, qwen2, qwen3, mistral). See docs/algorithms.md (5d)."""
    logits_chunk_tokens: int = Field(512, ge=0, le=1_000_000)
    """Token log-probs and entropies are computed from the final hidden states this many tokens at a
    time (each chunk's ``[chunk, vocab]`` logits recomputed in the backward), so the full
    ``[batch, length, vocab]`` logits never exist; 0 computes them whole (the plain path)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward instead of keeping them (HF
    ``gradient_checkpointing_enable``): less memory for about one extra forward pass per step."""
    target_kl: float | None = Field(None, gt=0)
    """Stop the epochs early when approximate KL to the batch's start exceeds this (checked after
    every epoch but the last, which has nothing left to stop; with ``epochs: 1`` it has no effect)."""
    grad_clip: float = Field(1.0, gt=0, le=1e6)
    """Global gradient-norm clip."""
    total_steps: int = Field(100, ge=1, le=10_000_000)
    """Training steps in the run."""
    sync_every: int = Field(1, ge=1, le=100000)
    """Publish weights every N steps."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a resumable checkpoint every N steps (a trained trajectory is acknowledged on the queue only
    once a checkpoint covers it, so a crash loses nothing; dropped ones are acknowledged at once)."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept on disk (older ones are deleted)."""
    buffer_steps: int = Field(4, ge=1, le=100000)
    """Replay-buffer capacity in training steps (× batch_size samples); the oldest groups beyond it
    are evicted and counted as dropped."""
    buffer_sampling: Literal["fifo", "freshness", "advantage", "behaviour_kl"] = "fifo"
    """Order in which ready groups are taken: oldest first, newest policy version first, largest
    reward spread first, or largest KL between their behaviour policy and the current one first."""
    buffer_random_fraction: float = Field(0.0, ge=0, le=1)
    """Share of each batch's groups drawn uniformly at random instead (no group starves)."""
    buffer_task_mix: dict[str, float] | None = None
    """Target share of each task type in a batch, e.g. {arithmetic: 0.7, multi_hop: 0.3}."""
    buffer_length_mix: dict[Literal["short", "long"], float] | None = None
    """Target share of short and long samples in a batch (split at buffer_length_split tokens)."""
    buffer_length_split: int = Field(128, ge=1, le=1_000_000)
    """Length in tokens above which a sample counts as long (for buffer_length_mix)."""
    world_size: int = Field(1, ge=1, le=1024)
    """Trainer ranks (data parallel, one torch.distributed process group: gloo on CPU, nccl on CUDA).
    Rank 0 owns the queue, the ledger, publishing and checkpoints; every rank holds the whole model and
    runs its share of each minibatch's micro-batches; gradients are all-reduced before the optimiser
    step, so N ranks take the same step as one (docs/trainer-group.md). 1: one process, no process group."""
    dist_timeout_s: float = Field(120.0, gt=0, le=86400)
    """Timeout of every collective of the trainer group (and of its rendezvous): a rank that died or
    hangs ends the whole group after at most this long, and the supervisor restarts it from the newest
    checkpoint. Rank 0 sends a heartbeat when idle, so waiting for data never trips it."""
    dist_port: int = Field(0, ge=0, le=65535)
    """TCP port of the trainer group's rendezvous on rank 0's host; 0: a free port chosen at each
    (re)start of the group."""
    sft: SFTConfig = Field(default_factory=SFTConfig)


class AlgoConfig(Section):
    """Loss and regularisation."""

    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    kl_coef: float = Field(0.0, ge=0, le=100)
    """Weight of the KL penalty to the reference (warm-start) policy; 0 disables."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """Estimator of the KL penalty (Schulman's k1, k2, k3; see docs/algorithms.md)."""
    entropy_coef: float = Field(0.0, ge=-1, le=1)
    """Entropy bonus weight."""


class _ValueModelBase(Section):
    """The value model of the ``gae`` and ``value_delta`` credit strategies (trained online)."""

    kind: str = "head"
    """``head``: a small MLP on the policy backbone's final hidden states (features detached, so the
    policy's optimiser is unaffected); ``separate``: its own tiny transformer of the policy's family."""
    hidden_size: int = Field(64, ge=4, le=4096)
    """Width of the head's hidden layer, and of the separate model's residual stream."""
    lr: float = Field(1e-3, gt=0, le=1)
    """AdamW learning rate of the value model's own optimiser."""
    clip: float | None = Field(0.2, gt=0, le=10)
    """Clip range of the clipped value loss around the values before the update (null: plain MSE)."""
    epochs: int = Field(2, ge=1, le=100)
    """Value-model optimiser steps per training batch."""
    grad_clip: float = Field(1.0, gt=0, le=1e6)
    """Gradient-norm clip of the value model."""


class HeadValueModelConfig(_ValueModelBase):
    """A value head on the policy backbone."""

    kind: Literal["head"] = "head"


class SeparateValueModelConfig(_ValueModelBase):
    """A value model of its own."""

    kind: Literal["separate"] = "separate"
    num_layers: int = Field(1, ge=1, le=32)
    """Transformer blocks of the separate model."""


ValueModelConfig: TypeAlias = Annotated[
    Annotated[HeadValueModelConfig, Tag("head")] | Annotated[SeparateValueModelConfig, Tag("separate")],
    Discriminator(_kind_of("head")),
]
"""``credit.value``: one model per ``kind``."""


class CreditConfig(Section):
    """Credit assignment: how a trajectory's reward becomes per-token advantages (docs/credit.md)."""

    strategy: Literal["outcome", "process", "gae", "value_delta", "turn_group", "tree"] = "outcome"
    """``outcome``: final reward with a group baseline on every model token; ``process``: plus
    per-turn rule rewards weighted by ``process_weight``; ``gae``: critic-based GAE (``gae_level``);
    ``value_delta``: segment credit V(after) − V(before) rescaled to sum to the outcome advantage;
    ``turn_group``: GiGPO-style step-relative advantages for turns that start from the same state;
    ``tree``: each segment gets the change in Monte-Carlo success probability it caused, measured over
    the group's tree of conversation states (branching groups: ``rollout.tree``)."""
    baseline: Literal["grpo", "dr_grpo", "rloo", "batch_mean"] = "grpo"
    """Outcome baseline within a group."""
    process_weight: float = Field(0.15, ge=0, le=10)
    """Weight α of process rewards relative to the outcome."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount over turns for reward-to-go of process rewards (and of GAE and step returns)."""
    gae_level: Literal["turn", "token"] = "turn"
    """``gae``: recursion over segments (one value per turn) or over model tokens."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """λ of GAE."""
    value_delta_eps: float = Field(0.05, ge=0, le=1)
    """``value_delta`` guard: when the raw credits' sum |S| is below this (or below
    ``value_delta_min_ratio`` × Σ|d|, or has the wrong sign), the outcome is spread uniformly."""
    value_delta_min_ratio: float = Field(0.25, ge=0, le=1)
    """``value_delta`` guard for cancelling deltas; bounds every credit by |advantage| / ratio."""
    turn_group_weight: float = Field(1.0, ge=0, le=10)
    """``turn_group``: weight ω of the step-relative advantage added to the episode advantage."""
    sample_every: int = Field(10, ge=0, le=1_000_000)
    """Write a few trained trajectories with their segment credits to ``credit/samples-*.msgpack``
    every N trainer steps (and at the last step), for ``asyncrl credit show``; 0 disables."""
    sample_size: int = Field(4, ge=1, le=1000)
    """Trajectories per credit sample file."""
    value: ValueModelConfig = Field(default_factory=HeadValueModelConfig)


class OrchestratorConfig(Section):
    """Flow control: training mode and the staleness budget."""

    mode: Literal["async", "one_step_off", "sync"] = "async"
    """``sync``: generate one batch, train, publish; ``one_step_off``: overlap one batch;
    ``async``: fully asynchronous within ``max_staleness``."""
    max_staleness: int = Field(2, ge=0, le=1000)
    """Largest allowed version lag of the oldest token of a trained sample."""
    stale_policy: Literal["drop", "downweight"] = "drop"
    """What happens to a sample older than ``max_staleness``."""
    watchdog_s: float = Field(600.0, ge=0, le=86400)
    """Stall watchdog: when neither a new weight version (a trainer step or publish) nor a newly accepted
    trajectory has been seen for this many seconds, the orchestrator raises a ``stall`` alert and prints
    what it last saw (versions, queue depth, leases, fates), again every period while it lasts, instead of
    hanging silently. 0 turns it off. Set it well above the slowest step plus a trainer restart."""
    high_watermark: float = Field(0.9, gt=0, le=1)
    """Queue fill fraction at which admission of new episodes pauses."""
    low_watermark: float = Field(0.5, ge=0, lt=1)
    """Queue fill fraction at which admission resumes."""
    governor_window: int = Field(5, ge=1, le=1000)
    """Staleness governor (rule 6, ``mode: async``): trainer reports in a row whose mean sample age is above
    ``max_staleness`` before the effective lag is lowered by one."""
    governor_fill_window: int = Field(10, ge=1, le=10000)
    """Staleness governor: orchestrator ticks in a row of queue fill under ``governor_low_fill`` before the
    effective ``sync_every`` is lowered by one (or at or above it before it is raised back)."""
    governor_low_fill: float = Field(0.3, ge=0, le=1)
    """Staleness governor: a queue filled below this fraction is under-used — publish weights more often."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below high_watermark ({self.high_watermark})"
            )
        return self


class _TransportBase(Section):
    """The trajectory queue between rollout workers and the trainer."""

    kind: str = "embedded"
    """``embedded``: durable SQLite queue in the run directory, no server; ``redis``: Redis Streams."""
    capacity: int = Field(1024, ge=1, le=10_000_000)
    """Unacknowledged trajectories at most; producers block beyond it (back-pressure)."""
    lease_seconds: float = Field(60.0, gt=0, le=86400)
    """A taken but unacknowledged entry is redelivered after this long."""


class EmbeddedTransportConfig(_TransportBase):
    """A durable SQLite queue in the run directory."""

    kind: Literal["embedded"] = "embedded"


class RedisTransportConfig(_TransportBase):
    """Redis Streams."""

    kind: Literal["redis"] = "redis"
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis server: ``redis://[:PASSWORD@]host:port/db``, ``rediss://`` for TLS. Written to the
    run directory masked; a masked or absent password is read from $ASYNCRL_REDIS_PASSWORD."""

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _redis_url(v)


TransportConfig: TypeAlias = Annotated[
    Annotated[EmbeddedTransportConfig, Tag("embedded")] | Annotated[RedisTransportConfig, Tag("redis")],
    Discriminator(_kind_of("embedded")),
]
"""``transport``: one model per ``kind``."""


class CanaryConfig(Section):
    """The weight-sync canary (docs/reliability.md#weight-sync-canary): after every weight load a rollout
    worker checks that its engine serves the version the trainer published — a fingerprint of the
    tensors in the engine's model and the log-probs of a fixed probe prompt, against the values the
    trainer recorded in the version's manifest. A mismatch refuses the version: the worker goes back
    to its previous good version, the orchestrator raises a ``weight_canary`` alert and the trainer
    publishes its weights again as a new version."""

    enabled: bool = True
    """Record the canary at every publish and check it at every load. Off: versions are loaded unchecked."""
    probe_tokens: int = Field(32, ge=2, le=4096)
    """Length of the probe prompt in tokens (capped by the context). Its cost per load is one forward
    pass of this many tokens in the engine, and one in the trainer per publish."""
    probe_tolerance: float | None = Field(None, gt=0)
    """Largest ``mean |Δ log p|`` over the probe tokens between the engine and the trainer. Unset: by
    dtype, ``probe_tolerance_float32`` when the trainer and the engine both compute in float32, else
    ``probe_tolerance_half``."""
    probe_tolerance_float32: float = Field(1e-4, gt=0)
    """Default tolerance in float32. Engine and trainer then differ by rounding only: 0 on SmolLM2 with the
    built-in engine on CPU (the same kernels), 1.5e-7-4.2e-7 for vLLM vs the trainer on CPU
    (docs/engines.md) — over 200x margin — while one LoRA step of ±1e-4 per element moves the SmolLM2
    probe by 8.5e-4 to 1.3e-3 (bench/canary_cost.py), so even a one-version-stale engine shows."""
    probe_tolerance_half: float = Field(0.2, gt=0)
    """Default tolerance when either side computes in bfloat16 or float16: the same SmolLM2 weights in
    float32 and bfloat16 give probe log-probs 0.040 apart on average (max 0.14; bench/canary_cost.py), and
    the gap grows with the model, so this leaves 5x margin and catches only gross failures (an adapter
    whose effect is not served, other weights); version identity then rests on the fingerprint."""
    fingerprint_rtol: float = Field(1e-6, gt=0, le=1)
    """Tolerance of each fingerprint statistic relative to its scale (``sqrt(Σx²)`` for sums, ``Σx²`` for
    sums of squares). The engine holds a bitwise copy, so only reduction order differs: at most 4e-8 on
    SmolLM2's 272 tensors (1 vs 2 threads, against float64). One optimiser step moves a tensor's sum by
    about ``lr·sqrt(n)``, which this sees for any ``lr`` above ``1e-6 × rms(weights)``."""


class _WeightsBase(Section):
    """The versioned weight store."""

    kind: str = "local"
    """``local``: snapshots under the run directory; ``shared``: snapshots on a shared filesystem (``path``)
    with the latest-version pointer in Redis (``redis_url``), for roles on several machines."""
    keep: int = Field(3, ge=1, le=10000)
    """Snapshots kept (older ones are deleted)."""
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    """The weight-sync canary: every load is checked against what the trainer published."""


class LocalWeightsConfig(_WeightsBase):
    """Snapshots under the run directory."""

    kind: Literal["local"] = "local"


class SharedWeightsConfig(_WeightsBase):
    """Snapshots on a shared filesystem, the latest-version pointer in Redis."""

    kind: Literal["shared"] = "shared"
    path: str | None = None
    """Directory on a filesystem every machine mounts (at the same path); the run's snapshots
    go to ``{path}/{run directory name}/``. Unset: ``{run_dir}/weights`` (the run directory is shared)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the latest-version pointer (same URL rules as transport.redis_url)."""

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _redis_url(v)


WeightsConfig: TypeAlias = Annotated[
    Annotated[LocalWeightsConfig, Tag("local")] | Annotated[SharedWeightsConfig, Tag("shared")],
    Discriminator(_kind_of("local")),
]
"""``weights``: one model per ``kind``."""


class PriceConfig(Section):
    """Example prices (replace with your own): dollars per unit."""

    device_hour: dict[str, float] = Field(
        default_factory=lambda: {"cpu": 0.05, "a100": 1.8, "h100": 2.5, "h200": 3.2}
    )
    """Dollars per device-hour by device type; a role process occupies one device (on CPU runs, one core)."""
    cpu_core_hour: float = Field(0.04, ge=0)
    """One CPU core for an hour (environments, reward computation)."""
    env_call: float = Field(0.00001, ge=0)
    """One environment / tool call."""
    gb_stored_month: float = Field(0.02, ge=0)
    """One GB of checkpoints, weights or queue data kept for a month."""
    gb_transferred: float = Field(0.01, ge=0)
    """One GB moved through the queue or the weight store."""


class CostAssumptionsConfig(Section):
    """Assumptions of ``asyncrl cost estimate``, the budget of a run before it starts (docs/cost.md).

    Each can also be given as a flag (``--tokens-per-trajectory 250``); ``--from-run RUN`` measures
    all of them on an earlier run instead."""

    trajectories: float = Field(10_000, ge=0)
    """N: trajectories generated."""
    tokens_per_trajectory: float = Field(100, ge=0)
    """L: model (sampled) tokens per trajectory."""
    rollout_tokens_per_s: float = Field(1_000, ge=0)
    """P_rollout: generated model tokens per rollout device-second (idle included)."""
    train_tokens_per_s: float = Field(1_000, ge=0)
    """P_train: trained model tokens per trainer device-second (idle included)."""
    env_calls_per_trajectory: float = Field(3, ge=0)
    """E: environment calls per trajectory."""
    env_seconds_per_call: float = Field(0.1, ge=0)
    """Wall time a call occupies a tool server's core."""
    reward_seconds_per_trajectory: float = Field(0.0, ge=0)
    """Seconds of answer verification per trajectory (CPU)."""
    value_model_fraction: float = Field(0.0, ge=0)
    """Value-model compute as a fraction of training compute."""
    transfer_bytes_per_trajectory: float = Field(20_000, ge=0)
    """Queue plus weight-store traffic per trajectory."""
    stored_bytes: float = Field(1e8, ge=0)
    """Bytes kept (checkpoints, weights, queue) during the run."""
    wall_seconds: float = Field(3600, ge=0)
    """Run duration (for storage months and the cost rate)."""
    startup_device_seconds: float = Field(0.0, ge=0)
    """Fixed device time before the roles produce anything (interpreter and model start-up)."""


class CostConfig(Section):
    """Cost ledger settings."""

    enabled: bool = True
    """Keep a cost ledger for the run."""
    device: str = "cpu"
    """Device type the roles run on; its hourly price is ``prices.device_hour[device]``."""
    prices: PriceConfig = Field(default_factory=PriceConfig)
    reward_cache: bool = True
    """Cache verdicts of deterministic answer verifiers by (environment, task, answer) (a cost lever)."""
    assumptions: CostAssumptionsConfig = Field(default_factory=CostAssumptionsConfig)

    @model_validator(mode="after")
    def _priced(self) -> CostConfig:
        if self.device not in self.prices.device_hour:
            raise ValueError(
                f"cost.device {self.device!r} has no price; cost.prices.device_hour has {sorted(self.prices.device_hour)}"
            )
        return self


class TelemetryConfig(Section):
    """Metrics, evaluation and reports."""

    tensorboard: bool = True
    """Write TensorBoard event files next to metrics.jsonl."""
    eval_every: int = Field(10, ge=0)
    """Evaluate on the held-out split every N published versions (0: only at start and end)."""
    log_every_s: float = Field(2.0, gt=0)
    """Seconds between metric records of the rollout workers and the orchestrator (the trainer writes one
    record per trained batch)."""
    progress_every_s: float = Field(5.0, gt=0, le=3600)
    """Without the live display (``--no-display``): seconds between plain progress lines, during the
    warm start and the RL run."""
    eval_tasks: int = Field(0, ge=0)
    """Held-out tasks per periodic evaluation (0: the whole held-out split)."""
    eval_nice: int = Field(5, ge=0, le=19)
    """OS priority decrement (``nice``) of the evaluator process, so evaluation yields the CPU to training."""
    archive: bool = True
    """Archive every trained batch (compressed msgpack) in ``archive/`` for ``asyncrl replay``."""
    traces: bool = True
    """Write one lifecycle trace line per trained trajectory to ``traces/trained.jsonl``."""
    wandb: bool = False
    """Also log metrics to Weights & Biases (only if ``wandb`` is installed; nothing is sent otherwise)."""
    mlflow: bool = False
    """Also log metrics to MLflow (only if ``mlflow`` is installed; nothing is sent otherwise)."""
    project: str = "asyncrl"
    """Project / experiment name used by the W&B and MLflow sinks."""
    recent_alerts: int = Field(8, ge=1, le=1000)
    """Alerts the live display and the orchestrator's snapshot keep (all of them are in ``alerts.jsonl``)."""


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
    launcher's before the roles start) and the trainer in ``orchestrator.mode: sync`` (rollout waits
    for its step). 0: every core the process may use, or ``OMP_NUM_THREADS`` where the environment
    sets it. See ``asyncrl.bootstrap.torch_threads``."""
    malloc_mmap_threshold_kb: int = Field(0, ge=0, le=1_048_576)
    """glibc only: allocations of at least this many KiB get their own pages (``mallopt
    M_MMAP_THRESHOLD``) and go back to the OS when freed, in every role process and in the launcher (which
    trains the warm start). 0 keeps glibc's
    dynamic threshold, which rises to 32 MiB: a training step's many 1–30 MiB activation tensors
    then live in the heap, whose fragments are kept, so a role's RSS can be twice its live tensors
    (docs/benchmarks.md#training-memory-bench). A small value (1024–4096) trades some speed (page
    faults on every large allocation) for a peak close to the live memory."""


class LocalLauncherConfig(_LauncherBase):
    """OS processes on this machine."""

    kind: Literal["local"] = "local"
    lend_threads: bool = True
    """Core lending (CPU models, one trainer rank): a compute role that waits — a rollout worker held
    by the staleness budget, the trainer with no batch to take — lends its cores to the roles still
    computing, which raise their torch threads until it computes again (docs/orchestrator.md#core-lending,
    ``asyncrl.control.lending``). Off: every role keeps its pinned ``torch_threads`` (``solo_threads``)."""
    lend_after_ms: int = Field(250, ge=0, le=60_000)
    """A role's cores are lent only once it has waited this long: the short gaps between two model
    turns or two training steps are not worth a switch (each switch costs the borrower a moment of
    oversubscription when the lender comes back)."""


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
    Discriminator(_kind_of("local")),
]
"""``launcher``: one model per ``kind``."""


class _StateBase(Section):
    """Where the orchestrator's state lives (counters, ledger, documents; restored on --resume)."""

    kind: str = "sqlite"
    """``sqlite``: ``run_dir/control.sqlite`` (embedded, survives a crash of any role); ``redis``: the same
    counters, ledger and documents in Redis (``redis_url``), so roles on several machines need no shared
    SQLite file."""
    snapshot_every_s: float = Field(1.0, gt=0, le=3600)
    """Seconds between snapshots of the orchestrator's rule states into the store."""


class SQLiteStateConfig(_StateBase):
    """``run_dir/control.sqlite``."""

    kind: Literal["sqlite"] = "sqlite"


class RedisStateConfig(_StateBase):
    """The run's state in Redis."""

    kind: Literal["redis"] = "redis"
    redis_url: str | None = None
    """The Redis server (same URL rules as transport.redis_url; masked in the run directory, a masked or
    absent password is read from $ASYNCRL_REDIS_PASSWORD). Required."""
    prefix: str | None = None
    """Key prefix of this run's state; unset: ``asyncrl:{<hash of the run directory>}:state`` (set it when
    the roles see the run directory under different absolute paths)."""

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else _redis_url(v)

    @model_validator(mode="after")
    def _check(self) -> RedisStateConfig:
        if not self.redis_url:
            raise ValueError(
                "control.state.kind=redis needs control.state.redis_url, e.g. redis://127.0.0.1:6379/0"
            )
        if self.prefix is not None and not self.prefix.strip():
            raise ValueError("control.state.prefix must not be empty (unset it for the default)")
        return self


StateStoreConfig: TypeAlias = Annotated[
    Annotated[SQLiteStateConfig, Tag("sqlite")] | Annotated[RedisStateConfig, Tag("redis")],
    Discriminator(_kind_of("sqlite")),
]
"""``control.state``: one model per ``kind``."""


class CurriculumConfig(Section):
    """Task buckets (task type x difficulty) and their adaptive sampling weights."""

    enabled: bool = True
    """Sample tasks by bucket weight (False: the task source's own uniform sampling)."""
    window: int = Field(64, ge=1, le=100000)
    """Recent episodes per bucket whose success rate sets its weight."""
    min_episodes: int = Field(16, ge=1, le=100000)
    """Episodes a bucket needs in its window before its weight moves off the ceiling."""
    floor: float = Field(0.1, gt=0, le=1)
    """Weight of hopeless (success 0) and converged (success 1) buckets."""
    ceiling: float = Field(1.0, gt=0, le=100)
    """Weight of a bucket at success 0.5 (weight = floor + (ceiling - floor) * 4p(1-p))."""
    steer_buffer: bool = False
    """Also steer the replay buffer's batch composition to the bucket weights."""

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        if self.floor > self.ceiling:
            raise ValueError(f"floor ({self.floor}) must be at most ceiling ({self.ceiling})")
        return self


class BreakerConfig(Section):
    """Circuit breakers per environment and bucket."""

    enabled: bool = True
    """Open a bucket's breaker after ``consecutive`` anomalies of one kind."""
    consecutive: int = Field(5, ge=1, le=10000)
    """Consecutive episodes with the same anomaly kind that open the breaker."""
    backoff_s: float = Field(10.0, gt=0, le=86400)
    """Seconds an opened breaker waits before its first half-open probe."""
    backoff_factor: float = Field(2.0, ge=1, le=100)
    """Each failed probe multiplies the wait by this."""
    max_backoff_s: float = Field(300.0, gt=0, le=86400)
    """Upper bound of the wait between probes."""
    probes: int = Field(2, ge=1, le=1000)
    """Healthy probe episodes in a row that close a half-open breaker."""
    reward_min: float = Field(-10.0, ge=-1e9, le=1e9)
    """Final rewards below this are an anomaly (``reward_range``)."""
    reward_max: float = Field(10.0, ge=-1e9, le=1e9)
    """Final rewards above this are an anomaly (``reward_range``)."""
    fault_rate_alert: float = Field(0.1, ge=0, le=1)
    """Raise an ``env_faults`` alert when more than this share of environment call attempts fail
    (raise, hang or return garbage; retried attempts included), measured over windows of
    ``fault_rate_window`` attempts across all workers; one alert per excursion above it; 0 disables."""
    fault_rate_window: int = Field(50, ge=1, le=1_000_000)
    """Environment call attempts per fault-rate measurement."""


class DriftConfig(Section):
    """Reward-drift (two-sided CUSUM per bucket) and reward-hacking alarms."""

    enabled: bool = True
    """Run the drift detector on every bucket's group-mean rewards."""
    warmup: int = Field(30, ge=2, le=100000)
    """Group means that set a bucket's reference mean and standard deviation."""
    k: float = Field(0.75, ge=0, le=100)
    """CUSUM slack in reference standard deviations (half the smallest shift worth detecting)."""
    h: float = Field(10.0, gt=0, le=1000)
    """CUSUM decision threshold in reference standard deviations."""
    min_std: float = Field(0.05, gt=0, le=100)
    """Floor on the reference standard deviation (a constant history is not infinitely sensitive)."""
    downweight: float = Field(0.5, gt=0, le=1)
    """Curriculum weight multiplier of a bucket after a drift alarm."""
    hold_s: float = Field(60.0, ge=0, le=86400)
    """Seconds the down-weighting lasts."""
    hacking_window: int = Field(6, ge=3, le=10000)
    """Points of training reward and held-out success compared by the reward-hacking rule."""
    hacking_rise: float = Field(0.1, gt=0, le=100)
    """Rise of training reward over the window (with held-out success not rising) that is flagged."""
    heldout_rate: float = Field(0.0, ge=0, le=1)
    """Share of groups rollout workers run on held-out tasks (not trained) to track held-out success."""


class ExplorationConfig(Section):
    """Temperature jitter, exploration-task rate and early termination of failing episodes."""

    adaptive: bool = False
    """Raise jitter and exploration rate while most groups carry no signal, lower them when they do."""
    max_temperature_jitter: float = Field(0.3, ge=0, le=1)
    """Upper bound of the adapted ``rollout.temperature_jitter``."""
    max_exploration_rate: float = Field(0.2, ge=0, le=1)
    """Upper bound of the adapted ``rollout.exploration_rate``."""
    step: float = Field(0.05, gt=0, le=1)
    """Change of both knobs per decision."""
    zero_signal_high: float = Field(0.7, ge=0, le=1)
    """Share of zero-advantage groups above which exploration rises."""
    zero_signal_low: float = Field(0.3, ge=0, le=1)
    """Share of zero-advantage groups below which exploration falls back."""
    window: int = Field(16, ge=1, le=100_000)
    """Groups per adaptive decision (the zero-signal share is measured over this many)."""
    early_stop_invalid: int = Field(0, ge=0, le=1000)
    """End an episode after this many consecutive invalid actions (outcome ``early_stopped``); 0: never."""


class ElasticConfig(Section):
    """Elastic rollout capacity: add or remove rollout workers within [min_workers, max_workers]."""

    enabled: bool = False
    """Let the orchestrator start and stop rollout workers."""
    min_workers: int = Field(1, ge=1, le=1024)
    """Never fewer rollout workers than this."""
    max_workers: int = Field(4, ge=1, le=1024)
    """Never more rollout workers than this."""
    cooldown_s: float = Field(20.0, ge=0, le=86400)
    """Seconds between two scaling decisions."""
    window: int = Field(6, ge=1, le=10000)
    """Ticks of evidence (every ``telemetry.log_every_s``) a decision needs."""
    starve_busy: float = Field(0.6, ge=0, le=1)
    """Trainer busy fraction below which (with a near-empty queue) it is starving."""
    starve_fill: float = Field(0.1, ge=0, le=1)
    """Queue fill at or below which the trainer may be starving."""
    overflow_fill: float = Field(0.8, ge=0, le=1)
    """Queue fill at or above which production outruns consumption."""

    @model_validator(mode="after")
    def _check(self) -> ElasticConfig:
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"min_workers ({self.min_workers}) must be at most max_workers ({self.max_workers})"
            )
        return self


class ControlConfig(Section):
    """The orchestrator's rules: curriculum, breakers, drift, exploration, elastic capacity, state."""

    state: StateStoreConfig = Field(default_factory=SQLiteStateConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    breaker: BreakerConfig = Field(default_factory=BreakerConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    exploration: ExplorationConfig = Field(default_factory=ExplorationConfig)
    elastic: ElasticConfig = Field(default_factory=ElasticConfig)
    balance: bool = True
    """Admit a group only on a worker whose in-flight load (remaining episode steps) is within one
    group of the least-loaded worker's."""
    refresh_s: float = Field(0.5, gt=0, le=60)
    """Seconds between a rollout worker's reads of the orchestrator's directives (curriculum weights,
    breakers, exploration, retirement)."""
    heartbeat_s: float = Field(5.0, gt=0, le=3600)
    """Load balancing counts only workers whose load heartbeat is at most this old (a dead worker's load
    stops counting after it)."""


class RunConfig(Section):
    """Root of a run's configuration."""

    name: str = "run"
    """Run name; the run directory is ``{run_root}/{name}``."""
    run_root: str = "runs"
    """Folder holding run directories."""
    cache_dir: str = ".cache/asyncrl"
    """Cache of warm-start checkpoints, keyed by config hash."""
    seed: int = Field(0, ge=0)
    """Global seed."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    credit: CreditConfig = Field(default_factory=CreditConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    transport: TransportConfig = Field(default_factory=EmbeddedTransportConfig)
    weights: WeightsConfig = Field(default_factory=LocalWeightsConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    launcher: LauncherConfig = Field(default_factory=LocalLauncherConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)

    @model_validator(mode="before")
    @classmethod
    def _older_dumps(cls, data: Any) -> Any:
        return drop_stale_defaults(cls, data)

    def staleness_policy(self) -> StalenessPolicy:
        """The staleness rules in force for this run (:mod:`asyncrl.staleness`; rule 5 sets the lag)."""
        oc = self.orchestrator
        return StalenessPolicy.from_config(
            oc.mode, oc.max_staleness, self.trainer.batch_size, oc.stale_policy
        )

    @model_validator(mode="after")
    def _cross_section(self) -> RunConfig:
        if self.rollout.engine.kind == "vllm" and "kind" not in self.algo.policy_loss.model_fields_set:
            # vLLM's log-probs differ from the trainer's: correct with truncated IS (docs/engines.md).
            self.algo.policy_loss = self.algo.policy_loss.model_copy(update={"kind": "decoupled_ppo"})
        if self.trainer.batch_size % self.rollout.group_size:
            raise ValueError(
                f"trainer.batch_size ({self.trainer.batch_size}) must be a multiple of rollout.group_size "
                f"({self.rollout.group_size}) so that batches hold whole groups"
            )
        most = self.staleness_policy().max_sync_every
        if self.trainer.sync_every > most:
            raise ValueError(
                f"trainer.sync_every ({self.trainer.sync_every}) may be at most max_staleness + 1 ({most}) in "
                f"mode {self.orchestrator.mode!r}: samples from one published version are trained up to "
                "sync_every - 1 steps later"
            )
        if self.rollout.tree.enabled and self.env.kind == "agent":
            raise ValueError(
                "rollout.tree needs environment episodes it can replay; env.kind 'agent' runs your own "
                "program (set rollout.tree.enabled: false, or use an environment)"
            )
        need = min_queue_capacity(
            self.trainer.checkpoint_every,
            self.trainer.buffer_steps,
            self.trainer.batch_size,
            self.rollout.max_group_size,
        )
        if self.transport.capacity < need:
            raise ValueError(
                f"transport.capacity ({self.transport.capacity}) must be at least "
                "(trainer.checkpoint_every + trainer.buffer_steps + 1) x trainer.batch_size + "
                f"(trainer.checkpoint_every - 1) x (rollout.group_size - 1) = {need}: the trainer holds entries "
                "un-acknowledged until a checkpoint covers them (trained) or it has a buffer slot for them "
                "(buffered); with less, a full queue can hold only entries waiting for a checkpoint that needs "
                "new entries"
            )
        return self


def max_trainer_held(checkpoint_every: int, buffer_steps: int, batch_size: int, group_size: int) -> int:
    """Most queue entries a live trainer holds un-acknowledged between two loop iterations.

    ``checkpoint_every − 1`` steps trained since the last checkpoint (the step that reaches
    ``checkpoint_every`` checkpoints in the same iteration), each of at most ``batch_size +
    group_size − 1`` samples (a batch takes whole groups until it has ``batch_size``; a group with a
    dropped member is smaller, so the last group taken can overshoot by ``group_size − 1``), plus a
    replay buffer of at most ``buffer_steps × batch_size`` (it evicts beyond). See
    :mod:`asyncrl.trainer.intake` for why this bounds back-pressure.
    """
    return (checkpoint_every - 1) * (batch_size + group_size - 1) + buffer_steps * batch_size


def min_queue_capacity(checkpoint_every: int, buffer_steps: int, batch_size: int, group_size: int) -> int:
    """Smallest ``transport.capacity`` accepted: :func:`max_trainer_held` plus ``2 × batch_size`` —
    room for one pull of fresh entries beyond everything the trainer can hold, so a full queue
    always holds an entry the trainer can take."""
    return max_trainer_held(checkpoint_every, buffer_steps, batch_size, group_size) + 2 * batch_size


SECTIONS: tuple[str, ...] = tuple(
    name for name, f in RunConfig.model_fields.items() if isinstance(f.default_factory, type)
)


# ---------------------------------------------------------------------------------------------
class ConfigError(UserError, ValueError):
    """A user mistake in a config file or override; the message is meant for people."""


def _describe_allowed(err: ErrorDetails) -> str:
    ctx = err.get("ctx") or {}
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown key (check spelling; `asyncrl config explain` lists the fields)"
    if kind == "literal_error":
        return f"allowed values: {ctx.get('expected')}"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), "?")
        return f"must be {bounds[kind]} {limit}"
    return str(err["msg"])


def _walk(loc: tuple[int | str, ...], root: type[BaseModel]) -> tuple[str, str | None]:
    """The dotted field path of an error location (variant tags left out), and for an unknown key
    directly inside a variant section, why it is wrong when another kind has that field."""
    parts: list[str] = []
    model: type[BaseModel] | None = root
    wrong_kind: str | None = None
    i = 0
    while i < len(loc):
        name = loc[i]
        parts.append(str(name))
        field = model.model_fields.get(str(name)) if model is not None else None
        i += 1
        if field is None:
            model = None
            continue
        kinds = variants(field)
        if kinds and i < len(loc) and loc[i] in kinds:
            kind = str(loc[i])
            model = kinds[kind]
            i += 1
            if i == len(loc) - 1 and str(loc[i]) not in model.model_fields:
                owners = [k for k, cls in kinds.items() if str(loc[i]) in cls.model_fields]
                if owners:
                    section = ".".join(parts)
                    wrong_kind = (
                        f"only for {section}.kind {' or '.join(repr(k) for k in owners)}, not for "
                        f"{section}.kind {kind!r} (set {section}.kind, or remove the field)"
                    )
            continue
        ann = field.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return ".".join(parts), wrong_kind


def format_validation_error(exc: ValidationError, source: str, root: type[BaseModel] | None = None) -> str:
    """One line per error: the field path, the bad value and what is allowed (no traceback)."""
    from asyncrl.credentials import mask_secrets

    lines = [f"invalid configuration ({mask_secrets(source)}):"]
    for err in exc.errors():
        path, wrong_kind = _walk(err["loc"], root or RunConfig)
        path = path or "(root)"
        value = err.get("input")
        shown = mask_secrets(repr(value)) if not isinstance(value, dict) else "{...}"
        if len(shown) > 60:
            shown = shown[:57] + "..."
        if wrong_kind is not None:
            lines.append(f"  {path}: {wrong_kind}")
        elif err["type"] == "union_tag_invalid":
            tag = mask_secrets(repr((err.get("ctx") or {}).get("tag")))
            lines.append(
                f"  {path}.kind = {tag}: allowed values: {(err.get('ctx') or {}).get('expected_tags')}"
            )
        elif err["type"] == "value_error":
            lines.append(f"  {path}: {str(err['msg']).removeprefix('Value error, ')}")
        elif err["type"] == "missing":
            lines.append(f"  {path}: required field is missing")
        else:
            lines.append(f"  {path} = {shown}: {_describe_allowed(err)}")
    return mask_secrets("\n".join(lines))  # a password in a URL never reaches an error message


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML (numbers, booleans, lists, null)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value, e.g. trainer.lr=1e-5")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _variant_kinds(parts: list[str]) -> dict[str, type[BaseModel]]:
    """``{kind: model}`` when ``parts`` names a variant section (``["env", "latency"]``), else empty."""
    model: type[BaseModel] = RunConfig
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return {}
        kinds = variants(field)
        if kinds:
            return kinds if i == len(parts) - 1 else {}
        if not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return {}
        model = field.annotation
    return {}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides in order. Setting a variant section's ``kind`` switches the section to that
    kind: fields given so far (in the file or earlier overrides) that the new kind does not have are
    dropped, so ``--set env.latency.kind=none`` turns off a file's Pareto latency; a field of another kind
    given after it is still an error."""
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        if parts[-1] == "kind" and (target := _variant_kinds(parts[:-1]).get(str(value))) is not None:
            for key in [k for k in node if k not in target.model_fields]:
                del node[key]
        node[parts[-1]] = value
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory; give the path of a YAML file in it")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r}); "
            "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {str(p)!r} must hold a mapping at top level, got {type(data).__name__}"
        )
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults when ``path`` is None) and apply dotted overrides."""
    data = load_yaml(path) if path is not None else {}
    data = apply_overrides(data, list(overrides or []))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        source = str(path) if path is not None else "defaults"
        if overrides:
            source += " with --set " + " ".join(overrides)
        raise ConfigError(format_validation_error(exc, source)) from None


def dump_yaml(cfg: BaseModel) -> str:
    """The config as YAML, with passwords in URLs masked (``***``; see :mod:`asyncrl.credentials`)."""
    from asyncrl.credentials import mask_secrets

    return mask_secrets(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def config_hash(*parts: BaseModel) -> str:
    """Stable short hash of config sections (used to key caches)."""
    import hashlib
    import json

    blob = json.dumps([p.model_dump(mode="json") for p in parts], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _field_row(path: str, field: FieldInfo, note: str = "") -> tuple[str, str, str, str]:
    ann = field.annotation
    type_name = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
    default = "" if field.default_factory is not None else repr(field.default)
    if field.default_factory is not None:
        default = repr(field.default_factory())  # type: ignore[call-arg]
    symbols = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    bounds = [f"{sym} {getattr(m, k)}" for m in field.metadata for k, sym in symbols.items() if hasattr(m, k)]
    doc = (field.description or "").strip().replace("\n", " ")
    if bounds:
        doc = f"{doc} [{', '.join(bounds)}]".strip()
    return path, type_name, default, f"{note}{doc}"


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def explain(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows (path, type, default, doc) for every field of ``model``, recursing into sections.

    A variant section lists its ``kind`` with every allowed value, then each field once; a field
    that only some kinds have is marked ``kind: X —``."""
    rows: list[tuple[str, str, str, str]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        kinds = variants(field)
        if kinds:
            factory = field.default_factory
            default_kind = (
                factory.model_fields["kind"].default
                if isinstance(factory, type) and issubclass(factory, BaseModel)
                else None
            )
            base = next(iter(kinds.values())).__mro__[1]
            assert issubclass(base, BaseModel)
            rows.append((path, "section", "", _first_line(base)))
            tags = ", ".join(repr(k) for k in kinds)
            kind_doc = (base.model_fields["kind"].description or "").strip().replace("\n", " ")
            rows.append((f"{path}.kind", f"Literal[{tags}]", repr(default_kind), kind_doc))
            seen: set[str] = {"kind"}
            for cls in kinds.values():
                for fname, f in cls.model_fields.items():
                    if fname in seen:
                        continue
                    seen.add(fname)
                    owners = [k for k, c in kinds.items() if fname in c.model_fields]
                    note = "" if len(owners) == len(kinds) else f"kind: {', '.join(owners)} — "
                    sub = f.annotation
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        rows.append((f"{path}.{fname}", "section", "", note + _first_line(sub)))
                        rows.extend(explain(sub, f"{path}.{fname}."))
                    else:
                        rows.append(_field_row(f"{path}.{fname}", f, note))
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.append((path, "section", "", _first_line(ann)))
            rows.extend(explain(ann, path + "."))
            continue
        rows.append(_field_row(path, field))
    return rows
