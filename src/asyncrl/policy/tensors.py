"""A model's weights as plain tensors: what weight versions, checkpoints and LoRA adapters hold.

Below :mod:`asyncrl.policy.model` and :mod:`asyncrl.policy.lora`, which both use it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def _alias_names(model: torch.nn.Module) -> set[str]:
    """State-dict names whose tensor shares storage with an earlier name (tied weights)."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    aliases: set[str] = set()
    for name, t in model.state_dict(keep_vars=True).items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            aliases.add(name)
        seen.add(key)
    return aliases


def state_dict_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of every weight, tied duplicates left out.

    Copies, not views: a published snapshot must not change when the optimiser later
    updates the live parameters in place. Tied aliases (``lm_head.weight``) are dropped,
    as safetensors files cannot hold shared storage and HF checkpoints omit them too.
    """
    aliases = _alias_names(model)
    return {
        name: t.detach().to("cpu", copy=True).contiguous()
        for name, t in model.state_dict().items()
        if name not in aliases
    }


def load_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy ``tensors`` into ``model``'s parameters and buffers in place.

    In place (``copy_``), so optimiser state and any engine holding the same module keep
    valid references. Strict: every non-tied weight must be present with the right shape,
    and unknown names are errors, because a silently partial load would make samples
    come from a policy nobody can name.
    """
    current = model.state_dict()
    aliases = _alias_names(model)
    required = set(current) - aliases
    missing = sorted(required - set(tensors))
    unknown = sorted(set(tensors) - set(current))
    problems: list[str] = []
    if missing:
        problems.append(f"missing {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}")
    if unknown:
        problems.append(f"unknown tensor name(s), e.g. {', '.join(unknown[:3])}")
    for name, t in tensors.items():
        if name in current and tuple(t.shape) != tuple(current[name].shape):
            problems.append(f"{name} has shape {tuple(t.shape)}, model expects {tuple(current[name].shape)}")
    if problems:
        raise ValueError("cannot load weights: " + "; ".join(problems[:5]))
    with torch.no_grad():
        for name, t in tensors.items():
            current[name].copy_(t)
