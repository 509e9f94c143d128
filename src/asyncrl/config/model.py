"""``model``: the policy network (built or loaded) and its LoRA adapters; read by :mod:`asyncrl.policy`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.config.base import Section


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
