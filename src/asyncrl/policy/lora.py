"""LoRA: low-rank adapters on a pretrained model, and their tensors as weight versions.

Every role wraps the same base model with the same adapter layout (peft's :func:`~peft.get_peft_model`);
a weight version then carries only the adapter's tensors (:func:`adapter_tensors`, named as the wrapped
model names its trainable parameters), loaded strictly (:func:`load_adapter`: other names or shapes are
an :class:`AdapterError`, never a policy nobody can name). An adapter update is
``W x + (alpha / r) B A x``; ``B`` starts at zero, so version 0 is the base model exactly.
:func:`merged_state_dict` folds the adapter into plain weights (an engine taking full weights, e.g.
vLLM; a warm start saved as a plain directory); :class:`MergedCopy` keeps a plain model with it folded
in, refreshed in place at every load (``rollout.engine.merge_lora``). The design: docs/models.md#lora.
"""

from __future__ import annotations

import copy
import itertools
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


def is_lora(model: object) -> bool:
    return hasattr(model, "peft_config")


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The adapter's parameter names (the trainable ones), in module order."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the adapter's tensors: what a LoRA weight version holds."""
    return {
        name: p.detach().to("cpu", copy=True).contiguous()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def load_adapter(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
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
    merged = copy.deepcopy(model).merge_and_unload()
    return state_dict_tensors(merged)


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights under their plain HF names (no adapter, no peft prefixes)."""
    if not is_lora(model):
        return state_dict_tensors(model)
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict_tensors(base_model(model)).items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t
    return out


class MergeUnsupported(ValueError):
    """A LoRA model :class:`MergedCopy` cannot fold: an adapter on a layer other than ``nn.Linear``
    (embeddings, convolutions), a LoRA variant (DoRA, ...) or an adapter bias."""


class MergedCopy:
    """A plain (non-PEFT) model computing what a LoRA model computes, for sampling: each adapted linear
    layer's weight is ``W + (alpha / r) B A`` (``Σ`` over active adapters; none while adapters are
    disabled), the other parameters and buffers are the LoRA model's own tensors (shared, not copied).

    :meth:`refresh` folds the adapter in again, in place, ``W`` read from the LoRA model's base layer
    (which the adapter never changes): no unmerge, no copy of the PEFT model, tensors keep their
    addresses (a captured CUDA graph sees the new values). :attr:`adapter` holds the adapter tensors
    the served weights were folded from, under the LoRA model's names: what the weight-sync canary
    fingerprints. Memory and cost: ``docs/engines.md#lora-the-merged-copy``.
    """

    def __init__(self, model: Any) -> None:
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        inner = base_model(model)
        layers = {n: m for n, m in inner.named_modules() if isinstance(m, LoraLayer)}
        for name, m in layers.items():
            if type(m) is not LoraLinear or m.lora_variant or any(m.lora_bias.values()):
                raise MergeUnsupported(
                    f"{name}: {type(m).__name__} adapter (variant {sorted(m.lora_variant) or 'none'}, "
                    f"bias {any(m.lora_bias.values())}): only plain LoRA on linear layers is folded"
                )
        own = {id(m.get_base_layer().weight) for m in layers.values()}
        memo: dict[int, torch.Tensor] = {
            id(t): t for t in itertools.chain(inner.parameters(), inner.buffers()) if id(t) not in own
        }
        plain = copy.deepcopy(inner, memo)  # shares every tensor but the adapted weights
        for name in layers:
            parent, _, child = name.rpartition(".")
            setattr(plain.get_submodule(parent), child, plain.get_submodule(name).get_base_layer())
        plain.train(False)
        self.model: Any = plain
        self._layers: list[tuple[Any, torch.Tensor]] = [
            (m, plain.get_submodule(n).weight) for n, m in layers.items()
        ]
        names = {id(p): n for n, p in model.named_parameters()}
        params = _adapter_params(layers.values())
        self.adapter: dict[str, torch.Tensor] = {
            names[id(p)]: torch.empty_like(p, requires_grad=False) for p in params
        }
        self._snap = {id(p): self.adapter[names[id(p)]] for p in params}
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Fold the LoRA model's adapter, as it is now, into the copy (in place)."""
        for p in _adapter_params(m for m, _ in self._layers):
            self._snap[id(p)].copy_(p)
        for layer, w in self._layers:
            base = layer.get_base_layer().weight
            active = [] if layer.disable_adapters else [a for a in layer.active_adapters if a in layer.lora_A]
            if not active:
                w.copy_(base)
                continue
            half = w.dtype in (torch.float16, torch.bfloat16)  # fold in float32, round once
            acc = base.float() if half else w.copy_(base)
            for a in active:
                b_, a_ = self._snap[id(layer.lora_B[a].weight)], self._snap[id(layer.lora_A[a].weight)]
                b_, a_ = (a_.T, b_.T) if layer.fan_in_fan_out else (b_, a_)
                acc.addmm_(b_.to(acc.dtype), a_.to(acc.dtype), alpha=layer.scaling[a])
            if half:
                w.copy_(acc)

    @property
    def folded(self) -> list[torch.Tensor]:
        """The copy's weights :meth:`refresh` writes (the adapted layers'); every other tensor is the LoRA
        model's own, which an adapter load leaves as it was."""
        return [w for _, w in self._layers]


def _adapter_params(layers: Any) -> list[torch.Tensor]:
    """The ``lora_A`` / ``lora_B`` parameters of ``layers`` (LoRA layers), in order."""
    return [p for m in layers for p in itertools.chain(m.lora_A.parameters(), m.lora_B.parameters())]
