"""LoRA: low-rank adapters on a pretrained model, and their tensors as weight versions.

With ``model.lora`` set, every role wraps the same base model (``initial_policy``) with the same
adapter layout (peft's :func:`~peft.get_peft_model`). The trainer trains only the adapter; a
weight version then carries only the adapter's tensors (:func:`adapter_tensors`, named as the
wrapped model names its trainable parameters), through the same store, manifest, checksum,
fall-back and retention as full weights. Loading a version (:func:`load_adapter`) is strict: the
names and shapes must be exactly the adapter's, or it raises :class:`AdapterError` — an adapter
that cannot be applied fails loudly instead of sampling from a policy nobody can name.

An adapter update is ``W x + (alpha / r) B A x``; ``B`` starts at zero, so version 0 is the base
model exactly. :func:`merged_state_dict` folds the adapter into plain weights (for an engine that
takes full weights, e.g. vLLM, and for saving a warm start as an ordinary model directory).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.errors import UserError
from asyncrl.policy.tensors import state_dict_tensors

if TYPE_CHECKING:
    from asyncrl.config import LoraConfig

ADAPTER_FILE = "adapter.safetensors"


class AdapterError(UserError, ValueError):
    """A weight version whose tensors are not this policy's adapter (names or shapes differ)."""


def apply_lora(model: Any, cfg: LoraConfig) -> Any:
    """``model`` wrapped with fresh adapters on ``cfg.target_modules`` (the base weights frozen)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError:  # pragma: no cover - peft is a runtime dependency
        raise UserError("model.lora needs the peft package: pip install 'asyncrl'") from None
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in present]
    if missing or not cfg.target_modules:
        raise UserError(
            f"model.lora.target_modules {missing or cfg.target_modules} name no layer of this model; "
            f"its linear layers include {sorted(n for n in present if n.endswith('proj'))[:10]}"
        )
    peft_cfg = PeftLoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
    )
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, peft_cfg)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def adapter_names(model: Any) -> list[str]:
    """The adapter's parameter names (the trainable ones), in module order."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def adapter_tensors(model: Any) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the adapter's tensors: what a LoRA weight version holds."""
    return {
        name: p.detach().to("cpu", copy=True).contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def load_adapter(model: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy an adapter version into ``model`` in place; strict about names and shapes."""
    params = dict(model.named_parameters())
    expected = set(adapter_names(model))
    missing = sorted(expected - set(tensors))
    unknown = sorted(set(tensors) - expected)
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} adapter tensor(s), e.g. {', '.join(missing[:2])}")
    if unknown:
        problems.append(
            f"{len(unknown)} tensor(s) that are not this adapter's, e.g. {', '.join(unknown[:2])}"
        )
    for name, t in tensors.items():
        if name in expected and tuple(t.shape) != tuple(params[name].shape):
            problems.append(
                f"{name} has shape {tuple(t.shape)}, the adapter expects {tuple(params[name].shape)}"
            )
    if problems:
        raise AdapterError(
            "cannot apply this weight version as a LoRA adapter ("
            + "; ".join(problems[:3])
            + "): was it written with another model.lora (rank, target_modules) or without LoRA?"
        )
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)


def base_model(model: Any) -> Any:
    """The wrapped transformers model (its base weights, with adapter layers inside)."""
    return model.get_base_model() if is_lora(model) else model


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Plain HF weights with the adapter folded in (``W + (alpha/r) B A``); the model is unchanged."""
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    return state_dict_tensors(merged)


def base_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base weights under their plain HF names (no adapter, no peft prefixes)."""
    if not is_lora(model):
        return state_dict_tensors(model)
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict_tensors(base_model(model)).items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t
    return out
