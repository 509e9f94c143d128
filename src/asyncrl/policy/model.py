"""The policy network: build, save, load, move weights, and score tokens.

The policy is a plain Hugging Face causal LM (Qwen2 or Llama architecture) in float32,
so any local HF checkpoint directory can be used in place of a freshly built one, and
what asyncrl saves can be opened by other HF tools. Scoring tokens (the one log-prob
definition the trainer and the rollout engine share) is :mod:`asyncrl.policy.scoring`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors.torch import load_file

from asyncrl.durable import staged_dir
from asyncrl.errors import UserError
from asyncrl.policy.memory import check_fits, parameter_count
from asyncrl.policy.tensors import load_tensors, state_dict_tensors
from asyncrl.policy.tokenizer import SPECIAL_TOKENS, build_tokenizer

if TYPE_CHECKING:  # transformers' model classes are imported where a model is built or loaded: ~2 s of
    # CPU (torch.distributed.tensor, torch._dynamo) that `asyncrl train`'s start and its commands that
    # load no model need not pay (role processes preload them: asyncrl.launch.local)
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from asyncrl.config import ModelConfig

AttnImpl = Literal["sdpa", "eager"]

DEFAULT_ATTN: AttnImpl = "sdpa"
"""Attention kernel of built and loaded models. Both kernels agree with the engine to
float32 rounding (the engine passes explicit masks and position ids); sdpa is faster."""

WEIGHTS_NAME = "model.safetensors"


class PolicyLoadError(UserError, RuntimeError):
    """A policy directory is missing, incomplete or corrupt; the message is meant for people."""


class DeviceError(UserError, RuntimeError):
    """``model.device`` names a device this machine does not have."""


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch device ``model.device`` names (see :class:`~asyncrl.config.ModelConfig`).

    ``auto`` is the current CUDA device when one is visible, else the CPU. An explicit CUDA
    device that is not there is a :class:`DeviceError`, not a silent fall-back to the CPU: a run
    meant for a GPU that quietly runs on two cores is a day lost.
    """
    if spec == "cpu":
        return torch.device("cpu")
    have = torch.cuda.is_available()
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if have else torch.device("cpu")
    if not have:
        raise DeviceError(
            f"model.device is {spec!r} but no CUDA device is visible here (torch.cuda.is_available() is "
            "False; a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides the GPUs); use model.device=auto or cpu"
        )
    dev = torch.device(spec)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise DeviceError(
            f"model.device is {spec!r} but only {n} CUDA device(s) are visible (cuda:0 .. cuda:{n - 1})"
        )
    return torch.device("cuda", index)


# ---------------------------------------------------------------------------------------------
def build_model(
    cfg: ModelConfig, vocab_size: int, attn_implementation: AttnImpl = DEFAULT_ATTN
) -> PreTrainedModel:
    """A freshly initialised causal LM from the architecture fields of ``cfg``.

    Initialisation is seeded with ``cfg.seed`` inside a forked RNG, so building a model
    neither depends on nor disturbs the caller's global torch RNG state. Dropout is 0 so
    train and eval mode compute the same function (log-probs recomputed by the trainer
    must match those recorded by the sampler); the model is returned in train mode.
    """
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.built_context,
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
        "bos_token_id": SPECIAL_TOKENS.index("<bos>"),
        "eos_token_id": SPECIAL_TOKENS.index("<eos>"),
    }
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    model: PreTrainedModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if cfg.family == "qwen2":
            qcfg = Qwen2Config(**common, use_sliding_window=False)
            qcfg._attn_implementation = attn_implementation
            model = Qwen2ForCausalLM(qcfg)
        else:
            lcfg = LlamaConfig(**common, attention_bias=False, mlp_bias=False)
            lcfg._attn_implementation = attn_implementation
            model = LlamaForCausalLM(lcfg)
    torch.nn.Module.float(model)  # PreTrainedModel.float is an untyped wrapper
    model.train()
    return model


# ---------------------------------------------------------------------------------------------
def input_vocab_size(model: PreTrainedModel) -> int:
    """Rows of the input embedding (may exceed the tokenizer's size, never fall short of it)."""
    weight = model.get_input_embeddings().weight
    assert isinstance(weight, torch.Tensor)
    return int(weight.shape[0])


def num_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameter elements (``parameters()`` yields a tied weight once)."""
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_hf() -> Iterator[None]:
    """Silence HF's per-call progress bars and load reports.

    Weights are saved every training step, and asyncrl turns load problems into its own
    one-line :class:`PolicyLoadError`, so HF's tables would only be noise.
    """
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def _short(exc: BaseException) -> str:
    """First line of an exception message, for error messages meant for people."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class Policy:
    """A causal LM and its tokenizer, with offline save/load and raw-tensor weight transfer."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model = model
        self.tokenizer = tokenizer

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def build(cls, cfg: ModelConfig, attn_implementation: AttnImpl = DEFAULT_ATTN) -> Policy:
        """A fresh policy from ``cfg``'s architecture fields and a locally built tokenizer."""
        kind = cfg.tokenizer_kind
        assert kind != "hf"  # ModelConfig rejects 'hf' without a path
        tok = build_tokenizer(kind)
        return cls(build_model(cfg, len(tok), attn_implementation), tok)

    @classmethod
    def from_config(cls, cfg: ModelConfig, attn_implementation: AttnImpl = DEFAULT_ATTN) -> Policy:
        """:meth:`load` ``cfg.path`` when it is set, else :meth:`build`."""
        if cfg.path is not None:
            return cls.load(cfg.path, attn_implementation, cfg=cfg)
        return cls.build(cfg, attn_implementation)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        attn_implementation: AttnImpl = DEFAULT_ATTN,
        *,
        cfg: ModelConfig | None = None,
        lora: bool = True,
    ) -> Policy:
        """Load any local HF causal-LM directory that also holds tokenizer files.

        ``cfg`` supplies ``dtype``, ``trust_remote_code`` and ``lora`` (float32, off and none
        without it). With ``cfg.lora`` (and ``lora=True``) the model is wrapped with the adapter
        layout, and the directory's ``adapter.safetensors`` (a saved LoRA policy) is loaded into it;
        ``lora=False`` loads the base model alone (e.g. the KL reference). Never touches the network.
        Every failure (docs/policy.md#model) is one :class:`~asyncrl.errors.UserError` line that names
        the path, what is wrong and what to do.
        """
        dtype = getattr(torch, cfg.dtype) if cfg is not None else torch.float32
        remote = bool(cfg.trust_remote_code) if cfg is not None else False
        p = Path(path)
        where = f"policy directory {str(p)!r}"
        check_model_dir(p, where, dtype, remote)
        tok = _load_tokenizer(p, where, remote)
        model = _load_weights(p, where, dtype, remote, attn_implementation)
        vocab = input_vocab_size(model)
        if len(tok) > vocab:
            raise PolicyLoadError(
                f"{where}: tokenizer has {len(tok)} tokens but the model's vocabulary is {vocab}"
            )
        if tok.pad_token_id is None and tok.eos_token is not None:
            tok.pad_token = tok.eos_token  # pad = eos: padding is masked everywhere it is used
        if cfg is not None and cfg.lora is not None and lora:
            from asyncrl.policy.lora import ADAPTER_FILE, apply_lora, load_adapter

            model = apply_lora(model, cfg.lora)
            if (p / ADAPTER_FILE).is_file():
                load_adapter(model, load_file(str(p / ADAPTER_FILE)))
        model.train()
        return cls(model, tok)

    # ---- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``model.safetensors``, ``config.json`` and tokenizer files to ``path``.

        Written to a sibling temp directory first and renamed into place, so a reader (or
        a crash) never sees a half-written checkpoint. An existing directory at ``path``
        is replaced.
        """
        dst = Path(path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        with staged_dir(dst, tmp_prefix=f".{dst.name}.tmp-", replace_prefix=f".{dst.name}.old-") as tmp:
            if self.lora:  # the base model as a plain HF directory, and the adapter beside it
                from safetensors.torch import save_file

                from asyncrl.policy.lora import ADAPTER_FILE, adapter_tensors, base_model, base_state_dict

                inner = base_model(self.model)
                inner.config.save_pretrained(str(tmp))
                if getattr(inner, "generation_config", None) is not None:
                    inner.generation_config.save_pretrained(str(tmp))
                save_file(base_state_dict(self.model), str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
                save_file(adapter_tensors(self.model), str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
            else:
                with _quiet_hf():
                    self.model.save_pretrained(str(tmp))
            self.tokenizer.save_pretrained(str(tmp))
            if not (tmp / WEIGHTS_NAME).is_file():  # pragma: no cover - sharding is off for small models
                raise RuntimeError(f"save_pretrained did not write {WEIGHTS_NAME} in {tmp}")

    # ---- raw weights -----------------------------------------------------------------------
    @property
    def lora(self) -> bool:
        """Whether the model carries LoRA adapters (see :mod:`asyncrl.policy.lora`)."""
        from asyncrl.policy.lora import is_lora

        return is_lora(self.model)

    def state_dict_tensors(self) -> dict[str, torch.Tensor]:
        """What a weight version holds: every weight (:func:`state_dict_tensors`), or with LoRA
        only the adapter's tensors."""
        if self.lora:
            from asyncrl.policy.lora import adapter_tensors

            return adapter_tensors(self.model)
        return state_dict_tensors(self.model)

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load a weight version (:func:`load_tensors`). With LoRA: an adapter version, or the
        base weights under their plain names (a checkpoint's ``model.safetensors``)."""
        if not self.lora:
            load_tensors(self.model, tensors)
            return
        from asyncrl.policy.lora import adapter_names, base_model, load_adapter

        names = set(adapter_names(self.model))
        if names & set(tensors) or not tensors:
            load_adapter(self.model, tensors)
            return
        inner = base_model(self.model)
        current = {k.replace(".base_layer.", "."): k for k in inner.state_dict() if ".lora_" not in k}
        unknown = sorted(set(tensors) - set(current))
        if unknown:
            from asyncrl.policy.lora import AdapterError

            raise AdapterError(f"cannot load weights into the LoRA policy: unknown names, e.g. {unknown[:2]}")
        given = {current[k]: v for k, v in tensors.items()}  # the adapter layers stay as they are
        load_tensors(inner, inner.state_dict() | given)

    def num_parameters(self) -> int:
        return num_parameters(self.model)

    def to(self, device: str | torch.device) -> Policy:
        """Move the model to ``device`` (a ``model.device`` spec or a torch device); returns self.

        On a CUDA device float32 matmuls may use TF32 tensor cores (``high`` precision), the
        usual setting for RL on GPUs; the trainer and the built-in engine then share the same
        numerics, so the importance ratio stays ~1 with identical weights.
        """
        dev = resolve_device(device) if isinstance(device, str) else device
        if dev.type == "cuda":
            torch.set_float32_matmul_precision("high")
        torch.nn.Module.to(self.model, dev)  # PreTrainedModel.to is an untyped wrapper
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + generated tokens) the model accepts."""
        return int(self.model.config.max_position_embeddings)


def context_limit(cfg: ModelConfig, policy: Policy) -> int:
    """Tokens an episode may use: ``model.max_context`` when set, capped by the model's own context."""
    return context_cap(cfg.max_context, policy.max_context)


def context_cap(configured: int | None, own: int) -> int:
    """:func:`context_limit` from the two numbers."""
    return own if configured is None else min(configured, own)


# ---------------------------------------------------------------------------------------------
def _is_right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row is ones followed by zeros (the trainer's layout)."""
    m = attention_mask.to(torch.bool)
    return bool((m[:, 1:] <= m[:, :-1]).all())


def padded_attention_inputs(
    attention_mask: torch.Tensor, attn_implementation: str
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Position ids and a 4D attention mask for an arbitrarily padded batch.

    Positions count real tokens only, so a left-padded prompt and the same prompt
    right-padded see identical rotary phases. Each padding query attends to itself, so
    no softmax row is empty (an all-masked row yields NaN in sdpa, and NaN values at
    padding keys would leak into real rows as ``0 * NaN``). For right padding the mask is
    omitted: plain causal attention already keeps real tokens from seeing the padding
    behind them, and lets sdpa use its fast causal kernel.
    """
    valid = attention_mask.to(torch.bool)
    position_ids = (valid.long().cumsum(-1) - 1).clamp_min(0)
    if _is_right_padded(valid):
        return None, position_ids
    t = valid.shape[1]
    idx = torch.arange(t, device=valid.device)
    causal = idx[None, :] <= idx[:, None]
    allowed = causal[None] & (valid[:, None, :] | torch.eye(t, dtype=torch.bool, device=valid.device)[None])
    return as_attention_bias(allowed[:, None], attn_implementation), position_ids


def as_attention_bias(
    allowed: torch.Tensor, attn_implementation: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A boolean "may attend" mask in the form the attention kernel expects.

    sdpa takes booleans; eager adds the mask to the scores, so it needs 0 / -inf-like floats.
    """
    if attn_implementation == "sdpa":
        return allowed
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def check_model_dir(p: Path, where: str, dtype: torch.dtype, remote: bool) -> None:
    """The directory holds a readable config, weights and tokenizer files, and fits in memory."""
    if not p.is_dir():
        raise PolicyLoadError(f"{where} does not exist or is not a directory")
    if not (p / "config.json").is_file():
        raise PolicyLoadError(f"{where} has no config.json (expected a Hugging Face model directory)")
    try:
        json.loads((p / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyLoadError(f"{where}: config.json is not valid JSON ({_short(exc)})") from None
    n_params = parameter_count(p, trust_remote_code=remote)  # also: is the architecture known?
    check_fits(n_params * dtype.itemsize, f"loading {where} ({n_params / 1e6:.1f}M parameters, {dtype})")
    weight_files = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if not any((p / f).is_file() for f in weight_files):
        raise PolicyLoadError(f"{where} has no weights (expected one of {', '.join(weight_files)})")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if not any((p / f).is_file() for f in tokenizer_files):
        raise PolicyLoadError(f"{where} has no tokenizer files (expected tokenizer.json)")


def _load_tokenizer(p: Path, where: str, remote: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        # tokenizer.json is loaded as-is: AutoTokenizer would pick a class from the
        # model type (e.g. Qwen2Tokenizer), which may change pre-processing.
        if (p / "tokenizer.json").is_file():
            tok: PreTrainedTokenizerBase = PreTrainedTokenizerFast.from_pretrained(
                str(p), local_files_only=True
            )
        else:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True, trust_remote_code=remote)
    except Exception as exc:
        raise PolicyLoadError(f"{where}: cannot load the tokenizer ({_short(exc)})") from None
    return tok


def _load_weights(
    p: Path, where: str, dtype: torch.dtype, remote: bool, attn_implementation: AttnImpl
) -> PreTrainedModel:
    """The model, refused when any weight is missing or mis-shaped (HF would re-initialise it)."""
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_hf():
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(p),
                local_files_only=True,
                dtype=dtype,
                trust_remote_code=remote,
                attn_implementation=attn_implementation,
                ignore_mismatched_sizes=True,  # reported below, in one line
                output_loading_info=True,
            )
    except Exception as exc:
        raise PolicyLoadError(f"{where}: cannot load the model weights ({_short(exc)})") from None
    model: PreTrainedModel = loaded[0]
    info: dict[str, Any] = loaded[1]
    # HF re-initialises missing or mis-shaped weights with a warning; a policy that is
    # partly random must not start sampling, so both are errors here.
    mismatched = [f"{k} {tuple(a)} vs config {tuple(b)}" for k, a, b in info.get("mismatched_keys", [])]
    if mismatched:
        raise PolicyLoadError(
            f"{where}: cannot load the model weights (shapes disagree with config.json: "
            f"{'; '.join(sorted(mismatched)[:2])}{' ...' if len(mismatched) > 2 else ''})"
        )
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise PolicyLoadError(
            f"{where}: cannot load the model weights ({len(missing)} tensor(s) missing from the "
            f"checkpoint, e.g. {', '.join(missing[:3])})"
        )
    return model
