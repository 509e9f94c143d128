"""Exact attention head-dimension padding: serve an engine an equivalent model with wider heads.

vLLM's CPU attention kernels support only some head sizes (32, 64, 80, ...); the demo policy's
is 16. :func:`pad_attention_heads` turns a Qwen2 / Llama checkpoint with head size ``D`` into one
with head size ``D' = k·D`` (``k`` a positive integer) that computes **the same function**, so an
engine can run it in place of the original. Pure tensor code: no vLLM, no files.

Formulas, per layer and per head (``h`` indexes heads; ``j = 0 .. D/2 − 1``):

* **Placement.** Real dimension ``j`` of a head goes to padded dimension ``π(j) = k·j`` and real
  dimension ``j + D/2`` to ``π(j + D/2) = k·j + D'/2``; every other padded dimension is zero.
* **RoPE** (Hugging Face ``rotate_half`` / vLLM neox style) rotates the pair ``(j, j + D/2)`` by
  the angle ``t·θ_j`` with ``θ_j = base^(−2j/D)``. In the padded head, the pair
  ``(k·j, k·j + D'/2)`` rotates by ``base^(−2kj/D') = base^(−2j/D) = θ_j``: the same angle, so the
  rotated real dimensions land on the same padded places. A padded pair is zero in q and k and a
  rotation keeps it zero, so it adds nothing to ``q·k``. (In float32 the frequencies agree bit for
  bit when ``D`` and ``D'`` are powers of two and to rounding otherwise;
  :func:`check_rope_frequencies` verifies it for the model's ``rope_theta``.) Only plain RoPE
  (``rope_type: default``, no ``rope_scaling``, full rotary dimension) is supported.
* **Scale.** Attention uses ``q·k / sqrt(head_dim)``; the engine divides by ``sqrt(D')``, so the
  q projection's weight rows and bias are multiplied by ``sqrt(D'/D) = sqrt(k)``:
  ``(sqrt(k)·q)·k / sqrt(k·D) = q·k / sqrt(D)``. The logits of every softmax are unchanged.
* **Projections.** ``q_proj``, ``k_proj``, ``v_proj`` weights ``[H·D, hidden]`` (and biases
  ``[H·D]``; Qwen2 has them, Llama does not) become ``[H·D', hidden]`` with row ``h·D + i`` moved
  to ``h·D' + π(i)`` and zero rows elsewhere (v uses the same placement: any consistent one would
  do, its padded outputs are zero). ``o_proj`` ``[hidden, H·D]`` becomes ``[hidden, H·D']`` with
  column ``h·D + i`` at ``h·D' + π(i)`` and zero columns elsewhere, so the zero v dimensions are
  never read. Nothing else changes; the config gains ``head_dim: D'``.
* **Qwen2 as Llama** (:func:`qwen2_as_llama`). vLLM 0.32's Qwen2 ignores ``head_dim`` (it uses
  hidden / heads); its Llama reads it. Qwen2 is Llama with q/k/v biases; Llama's
  ``attention_bias: true`` also gives ``o_proj`` a bias, so it gets a zero one. Same function.

Cost: every attention-head computation (q/k/v/o projections, ``q·kᵀ``, attention × v) and the KV
cache grow by ``D'/D``; MLP and embeddings are unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from asyncrl.errors import UserError

PADDABLE_MODEL_TYPES = ("qwen2", "llama")
_PROJ_NAME = re.compile(r"(?:^|\.)self_attn\.([qkvo]_proj)\.(weight|bias)$")


class HeadPaddingError(UserError, ValueError):
    """The model cannot be padded exactly (the message says why)."""


def head_dim_of(config: Mapping[str, Any]) -> int:
    """The attention head size of a Hugging Face ``config.json`` (``head_dim`` or hidden / heads)."""
    heads = int(config.get("num_attention_heads", 0) or 0)
    hidden = int(config.get("hidden_size", 0) or 0)
    return int(config.get("head_dim") or (hidden // heads if heads else 0))


def padded_head_dim(head_dim: int, supported: Iterable[int]) -> int | None:
    """The smallest supported size that is a multiple of ``head_dim`` (``head_dim`` itself when it
    is supported); ``None`` when there is none or ``head_dim`` is not even (RoPE pairs dims)."""
    sizes = sorted(set(supported))
    if head_dim in sizes:
        return head_dim
    if head_dim <= 0 or head_dim % 2:
        return None
    return next((s for s in sizes if s > head_dim and s % head_dim == 0), None)


def rope_theta_of(config: Mapping[str, Any]) -> float:
    """``rope_theta`` of a plain-RoPE config; :class:`HeadPaddingError` for anything else.

    Plain RoPE: ``rope_scaling`` absent or null, and transformers 5's ``rope_parameters`` (when
    present) of ``rope_type: default`` with no key but ``rope_type`` and ``rope_theta``; no
    ``partial_rotary_factor`` below 1.
    """
    theta = config.get("rope_theta")
    for key in ("rope_scaling", "rope_parameters"):
        spec = config.get(key)
        if spec is None:
            continue
        plain = (
            isinstance(spec, Mapping)
            and spec.get("rope_type", spec.get("type", "default")) == "default"
            and set(spec) <= {"rope_type", "type", "rope_theta"}
            and (key == "rope_parameters" or set(spec) <= {"rope_type", "type"})
        )
        if not plain:
            raise HeadPaddingError(
                f"head padding supports plain RoPE only (no rope scaling), got {key}={spec!r}"
            )
        theta = spec.get("rope_theta", theta)
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise HeadPaddingError(
            f"head padding needs RoPE on the whole head, got partial_rotary_factor={config['partial_rotary_factor']}"
        )
    return float(theta if theta is not None else 10000.0)


def placement(head_dim: int, padded_dim: int) -> torch.Tensor:
    """``π``: the padded index of each real dimension of a head (long tensor of length ``head_dim``)."""
    k, half = padded_dim // head_dim, head_dim // 2
    first = torch.arange(half) * k
    return torch.cat([first, first + padded_dim // 2])


def check_rope_frequencies(head_dim: int, padded_dim: int, theta: float) -> None:
    """Verify ``θ_j`` (real head) equals ``θ_π(j)`` (padded head) as Hugging Face computes them
    (``1 / base^(arange(0, D, 2) / D)`` in float32); :class:`HeadPaddingError` if not."""

    def inv_freq(dim: int) -> torch.Tensor:
        return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))

    real, padded = inv_freq(head_dim), inv_freq(padded_dim)
    mapped = padded[placement(head_dim, padded_dim)[: head_dim // 2]]
    if not torch.allclose(real, mapped, rtol=1e-6, atol=0.0):
        raise HeadPaddingError(
            f"RoPE frequencies differ after padding {head_dim}->{padded_dim} (rope_theta {theta}); "
            f"max relative error {float(((real - mapped) / real).abs().max()):.2e}"
        )


def check_paddable(config: Mapping[str, Any], padded_dim: int) -> None:
    """Raise :class:`HeadPaddingError` unless ``config`` can be padded exactly to ``padded_dim``."""
    model_type = config.get("model_type")
    if model_type not in PADDABLE_MODEL_TYPES:
        raise HeadPaddingError(
            f"head padding supports model types {', '.join(PADDABLE_MODEL_TYPES)}, got {model_type!r}"
        )
    d = head_dim_of(config)
    if d <= 0 or d % 2 or padded_dim % d or padded_dim < d:
        raise HeadPaddingError(f"cannot pad head size {d} to {padded_dim}: needs an even size and a multiple")
    check_rope_frequencies(d, padded_dim, rope_theta_of(config))


def qwen2_as_llama(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A Qwen2 checkpoint (``use_sliding_window: false``) as the equivalent Llama checkpoint:
    ``model_type: llama``, ``attention_bias: true`` and a zero ``o_proj.bias`` per layer (Llama's
    flag biases q, k, v *and* o; Qwen2 biases q, k, v only). Other tensors pass through."""
    if config.get("model_type") != "qwen2":
        raise HeadPaddingError(f"expected a qwen2 config, got model_type {config.get('model_type')!r}")
    if config.get("use_sliding_window"):
        raise HeadPaddingError("a Qwen2 model with use_sliding_window cannot be served as Llama")
    out = dict(tensors)
    for name, t in tensors.items():
        if _layer_projection(name) == ("o_proj", "weight"):
            out.setdefault(name[: -len("weight")] + "bias", t.new_zeros(t.shape[0]))
    drop = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
    new_config = {k: v for k, v in config.items() if k not in drop}
    new_config.update(
        model_type="llama", architectures=["LlamaForCausalLM"], attention_bias=True, mlp_bias=False
    )
    return out, new_config


def _layer_projection(name: str) -> tuple[str, str] | None:
    """``("q_proj", "weight")`` for ``model.layers.3.self_attn.q_proj.weight``, else ``None``."""
    m = _PROJ_NAME.search(name)
    return (m[1], m[2]) if m else None


def pad_attention_heads(
    tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any], padded_dim: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The same model with head size ``padded_dim`` (formulas in the module docstring).

    ``tensors``: a Hugging Face state dict (``model.layers.{i}.self_attn.{q,k,v,o}_proj.*``);
    ``config``: its ``config.json`` as a dict. Returns new tensors (others passed through, same
    objects) and a new config with ``head_dim = padded_dim``. Raises :class:`HeadPaddingError`
    when the model cannot be padded exactly or a projection has an unexpected shape.
    """
    check_paddable(config, padded_dim)
    d = head_dim_of(config)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    idx = placement(d, padded_dim)
    q_scale = math.sqrt(padded_dim / d)
    out: dict[str, torch.Tensor] = {}
    seen = 0
    for name, t in tensors.items():
        proj = _layer_projection(name)
        if proj is None or proj == ("o_proj", "bias"):  # o's bias is [hidden]: not per head
            out[name] = t
            continue
        kind, param = proj
        n = heads if kind in ("q_proj", "o_proj") else kv_heads
        seen += kind == "q_proj" and param == "weight"
        if kind == "o_proj":  # columns: [hidden, H·D] -> [hidden, H·D']
            if t.dim() != 2 or t.shape[1] != n * d:
                raise HeadPaddingError(f"{name}: expected weight [hidden, {n * d}], got {tuple(t.shape)}")
            cols = t.reshape(t.shape[0], n, d)
            padded = cols.new_zeros(t.shape[0], n, padded_dim)
            padded[:, :, idx] = cols
            out[name] = padded.reshape(t.shape[0], n * padded_dim)
            continue
        if t.shape[0] != n * d:  # rows: [H·D, ...] -> [H·D', ...]
            raise HeadPaddingError(f"{name}: expected {n * d} rows ({n} heads x {d}), got {tuple(t.shape)}")
        rows = t.reshape(n, d, *t.shape[1:])
        padded = rows.new_zeros(n, padded_dim, *t.shape[1:])
        padded[:, idx] = rows * q_scale if kind == "q_proj" else rows
        out[name] = padded.reshape(n * padded_dim, *t.shape[1:])
    layers = int(config.get("num_hidden_layers", seen) or seen)
    if seen != layers:
        raise HeadPaddingError(f"found q_proj weights for {seen} layers, the config has {layers}")
    return out, {**config, "head_dim": padded_dim}
