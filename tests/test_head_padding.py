"""Exact head-dimension padding (``asyncrl.engine.cpu.head_padding``), checked without vLLM.

The padded model, loaded into a Hugging Face model built from the padded config (HF honours
``head_dim`` and scales attention by ``head_dim ** -0.5``, as vLLM does), must give the same
logits as the original on random input, for Qwen2 (q/k/v biases) and Llama (none), for padding
factors 2 and 4, and for a non-default ``rope_theta``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from asyncrl.config import ModelConfig
from asyncrl.engine.cpu.head_padding import (
    HeadPaddingError,
    check_rope_frequencies,
    head_dim_of,
    pad_attention_heads,
    padded_head_dim,
    placement,
    qwen2_as_llama,
    rope_theta_of,
)
from asyncrl.engine.vllm_backend import CPU_HEAD_SIZES
from asyncrl.policy.model import build_model
from asyncrl.policy.tensors import load_tensors, state_dict_tensors

DEMO = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192}


def model_from(config: dict[str, Any], like: PreTrainedModel | None = None) -> PreTrainedModel:
    """A model of ``like``'s class (default: the class ``config`` names) built from ``config``."""
    if like is None:
        cls = LlamaForCausalLM if config["model_type"] == "llama" else Qwen2ForCausalLM
        cfg: Any = (LlamaConfig if config["model_type"] == "llama" else Qwen2Config).from_dict(config)
    else:
        cls, cfg = type(like), type(like.config).from_dict(config)
    cfg._attn_implementation = "eager"
    model = cls(cfg)
    torch.nn.Module.float(model)
    return model.eval()


def original(family: str, theta: float | None = None) -> PreTrainedModel:
    model = build_model(ModelConfig(family=family, seed=3, max_context=128, **DEMO), 106)  # type: ignore[arg-type]
    if theta is not None:  # the same weights under another rope_theta
        config = model.config.to_dict()
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        other = model_from(config, model)
        load_tensors(other, state_dict_tensors(model))
        model = other
    with torch.no_grad():  # non-trivial biases and norms, so every padded parameter matters
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def logits(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert isinstance(out, torch.Tensor)
    return out


@pytest.mark.parametrize("family", ["qwen2", "llama"])
@pytest.mark.parametrize("padded", [32, 64])
@pytest.mark.parametrize("theta", [None, 1e6])
def test_padded_model_computes_the_same_logits(family: str, padded: int, theta: float | None) -> None:
    model = original(family, theta)
    config = model.config.to_dict()
    assert head_dim_of(config) == 16
    tensors, new_config = pad_attention_heads(state_dict_tensors(model), config, padded)
    assert new_config["head_dim"] == padded and config.get("head_dim") in (None, 16)  # input untouched
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * padded, 64)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * padded, 64)
    assert tensors["model.layers.0.self_attn.o_proj.weight"].shape == (64, 4 * padded)
    assert ("model.layers.0.self_attn.q_proj.bias" in tensors) == (family == "qwen2")
    wide = model_from(new_config, model)
    assert wide.model.layers[0].self_attn.head_dim == padded  # type: ignore[union-attr,index]
    load_tensors(wide, tensors)
    ids = torch.randint(3, 106, (3, 40), generator=torch.Generator().manual_seed(0))
    want, got = logits(model, ids), logits(wide, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # not trivially equal: a wrong placement or a missing scale changes the logits
    broken = dict(tensors)
    q = "model.layers.0.self_attn.q_proj.weight"
    broken[q] = tensors[q] / (padded / 16) ** 0.5
    load_tensors(wide, broken)
    assert (logits(wide, ids) - want).abs().max() > 1e-3


@pytest.mark.parametrize("padded", [16, 32])
def test_qwen2_served_as_llama_computes_the_same_logits(padded: int) -> None:
    """What the vLLM engine serves for a Qwen2 policy: padded, then as Llama (vLLM's Qwen2 ignores
    ``head_dim``); rebuilt here from its config.json alone, as vLLM does."""
    model = original("qwen2")
    tensors, config = state_dict_tensors(model), model.config.to_dict()
    if padded != 16:
        tensors, config = pad_attention_heads(tensors, config, padded)
    tensors, config = qwen2_as_llama(tensors, config)
    assert config["model_type"] == "llama" and config["attention_bias"] is True
    assert not tensors["model.layers.1.self_attn.o_proj.bias"].any()
    served = model_from(json.loads(json.dumps(config)))
    assert isinstance(served, LlamaForCausalLM)
    load_tensors(served, tensors)
    ids = torch.randint(3, 106, (2, 50), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(served, ids), logits(model, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("theta", [10000.0, 1e6, 500000.0, 123.0])
@pytest.mark.parametrize(("d", "padded"), [(16, 32), (8, 32), (48, 96), (16, 64), (40, 80)])
def test_rope_frequencies_match(theta: float, d: int, padded: int) -> None:
    """Bit for bit when both sizes are powers of two; else within float32 rounding (torch divides
    by a non-power-of-two through its reciprocal)."""
    check_rope_frequencies(d, padded, theta)
    real = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))
    wide = 1.0 / (theta ** (torch.arange(0, padded, 2, dtype=torch.float) / padded))
    mapped = wide[placement(d, padded)[: d // 2]]
    if d & (d - 1) == 0 and padded & (padded - 1) == 0:
        assert torch.equal(real, mapped)
    else:
        torch.testing.assert_close(mapped, real, rtol=1e-6, atol=0)


def test_placement_pairs_rotate_together() -> None:
    idx = placement(16, 32)
    assert idx.tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]
    assert all(int(idx[j + 8]) == int(idx[j]) + 16 for j in range(8))  # (j, j+D/2) -> (j', j'+D'/2)


def test_padded_head_dim_picks_the_smallest_supported_multiple() -> None:
    assert padded_head_dim(16, CPU_HEAD_SIZES) == 32
    assert padded_head_dim(32, CPU_HEAD_SIZES) == 32  # supported: no padding
    assert padded_head_dim(48, CPU_HEAD_SIZES) == 96  # 64 is not a multiple of 48
    assert padded_head_dim(8, CPU_HEAD_SIZES) == 32
    assert padded_head_dim(24, CPU_HEAD_SIZES) == 96
    assert padded_head_dim(17, CPU_HEAD_SIZES) is None  # odd: RoPE pairs dimensions
    assert padded_head_dim(136, CPU_HEAD_SIZES) is None  # no supported multiple


def test_only_plain_rope_and_known_architectures_are_padded() -> None:
    model = original("qwen2")
    config = model.config.to_dict()
    tensors = state_dict_tensors(model)
    assert rope_theta_of(config) == 10000.0
    assert rope_theta_of({"rope_theta": 5e5, "rope_scaling": None}) == 5e5
    for bad in (
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
        {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        {"partial_rotary_factor": 0.5},
    ):
        with pytest.raises(HeadPaddingError, match="RoPE"):
            pad_attention_heads(tensors, {**config, **bad}, 32)
    with pytest.raises(HeadPaddingError, match="model types"):
        pad_attention_heads(tensors, {**config, "model_type": "qwen3"}, 32)
    with pytest.raises(HeadPaddingError, match="multiple"):
        pad_attention_heads(tensors, config, 40)
    with pytest.raises(HeadPaddingError, match="rows"):
        pad_attention_heads(tensors, {**config, "num_attention_heads": 2, "head_dim": 16}, 32)
