"""LoRA: adapter-only training and weight versions, strict loading, save/resume, a run end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import HFEngineConfig, ModelConfig, load_config
from asyncrl.engine import HFEngine
from asyncrl.errors import UserError
from asyncrl.policy import Policy
from asyncrl.policy.lora import ADAPTER_FILE, AdapterError, adapter_names
from asyncrl.records import SamplingParams
from models_util import family_tokenizer, load_tokenizer, smollm2_dir, tiny_model_dir
from test_canary import assert_every_load_passed_the_canary


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = family_tokenizer(load_tokenizer(smollm2_dir()), "smollm2")
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-lora"), tok)


def lora_cfg(path: Path, **lora: Any) -> ModelConfig:
    return ModelConfig(path=str(path), lora={"rank": 4, "alpha": 8, **lora})


def logits(policy: Policy, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = policy.model(input_ids=torch.tensor([ids])).logits
    return out


def perturb(policy: Policy) -> None:
    with torch.no_grad():
        for _name, p in policy.model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)


def test_lora_needs_a_pretrained_model() -> None:
    with pytest.raises(UserError, match=r"model\.lora adapts a pretrained model"):
        load_config(None, ["model.lora.rank=8"])


def test_only_the_adapter_trains_and_travels(tiny: Path) -> None:
    policy = Policy.load(tiny, cfg=lora_cfg(tiny))
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    version = policy.state_dict_tensors()
    assert set(version) == set(adapter_names(policy.model))
    full = Policy.load(tiny).state_dict_tensors()
    adapter_bytes = sum(t.numel() * t.element_size() for t in version.values())
    full_bytes = sum(t.numel() * t.element_size() for t in full.values())
    assert adapter_bytes < full_bytes / 10


def test_an_adapter_version_makes_the_engine_sample_the_trainers_policy(tiny: Path) -> None:
    cfg = lora_cfg(tiny)
    trainer, sampler = Policy.load(tiny, cfg=cfg), Policy.load(tiny, cfg=cfg)
    ids = [1, 520, 9531, 198, 6004, 2683]
    assert torch.equal(logits(trainer, ids), logits(sampler, ids))  # B = 0: both are the base model
    perturb(trainer)
    assert not torch.allclose(logits(trainer, ids), logits(sampler, ids))
    engine = HFEngine(
        sampler, HFEngineConfig(cuda_graphs=False, prefix_cache=False, prefix_sharing=False), [2], seed=0
    )
    engine.load_weights(5, trainer.state_dict_tensors())
    assert engine.version == 5
    torch.testing.assert_close(logits(trainer, ids), logits(sampler, ids))
    # sampled log-probs agree with the trainer's recomputation under the adapter
    from asyncrl.policy import token_logprobs

    s = engine.generate([ids], SamplingParams(max_new_tokens=6))[0]
    seq = torch.tensor([ids + s.token_ids])
    with torch.no_grad():
        lp = token_logprobs(trainer.model, seq, torch.ones_like(seq))[0, len(ids) :]
    torch.testing.assert_close(lp, torch.tensor(s.logprobs), atol=2e-4, rtol=0)


def test_an_adapter_of_another_shape_fails_loudly(tiny: Path) -> None:
    other = Policy.load(tiny, cfg=lora_cfg(tiny, rank=8)).state_dict_tensors()
    sampler = Policy.load(tiny, cfg=lora_cfg(tiny))
    with pytest.raises(AdapterError, match=r"another model\.lora"):
        HFEngine(
            sampler, HFEngineConfig(cuda_graphs=False, prefix_cache=False, prefix_sharing=False), [2]
        ).load_weights(1, other)
    full = Policy.load(tiny).state_dict_tensors()
    with pytest.raises(AdapterError):
        sampler.load_tensors(
            {k: v for k, v in list(full.items())[:3]} | {"x.lora_A.default.weight": torch.zeros(1)}
        )


def test_save_and_load_keep_base_and_adapter_apart(tiny: Path, tmp_path: Path) -> None:
    cfg = lora_cfg(tiny)
    policy = Policy.load(tiny, cfg=cfg)
    perturb(policy)
    policy.save(tmp_path / "p")
    assert (tmp_path / "p" / ADAPTER_FILE).is_file()
    ids = [1, 520, 9531, 198]
    again = Policy.load(tmp_path / "p", cfg=cfg)
    torch.testing.assert_close(logits(again, ids), logits(policy, ids))
    base = Policy.load(tmp_path / "p")  # an ordinary HF directory: the base weights, unchanged
    torch.testing.assert_close(logits(base, ids), logits(Policy.load(tiny), ids))
    # a checkpoint restores base weights by their plain names into the LoRA policy
    again.load_tensors(base.state_dict_tensors())
    torch.testing.assert_close(logits(again, ids), logits(policy, ids))


@pytest.mark.realmodel  # make test-models
def test_a_lora_run_publishes_adapter_versions(tiny: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from asyncrl.jobs.train import train
    from test_models_e2e import SMALL

    cfg = load_config(
        None,
        [
            *SMALL,
            "env.kind=calculator",
            f"model.path={tiny}",
            "model.lora.rank=4",
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'c'}",
        ],
    )
    run_dir, summary = train(cfg, display=False, eval_limit=2)
    assert summary["trainer_steps"] == 2 and summary["lost_trajectories"] == 0
    assert summary["token_exact_rate"] == 1.0
    assert_every_load_passed_the_canary(run_dir, summary)
    versions = sorted((run_dir / "weights").glob("v*/model.safetensors"))
    assert versions
    tensors = load_file(str(versions[-1]))
    assert tensors and all(".lora_" in k for k in tensors)
