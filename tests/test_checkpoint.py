"""Resumable trainer checkpoints: exact resume, atomicity, retention and corruption handling."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import asyncrl.trainer.checkpoint as ckpt_mod
from asyncrl.config import ModelConfig
from asyncrl.errors import UserError
from asyncrl.policy import Policy, token_logprobs
from asyncrl.trainer.checkpoint import (
    CheckpointError,
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}

Setup = tuple[Policy, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]


def _lr_lambda(step: int) -> float:
    return 1.0 / (1.0 + 0.5 * step)


def _setup(seed: int = 0) -> Setup:
    policy = Policy.build(ModelConfig(**TINY, seed=seed))
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda)
    return policy, opt, sched


def _train_step(s: Setup) -> torch.Tensor:
    """One optimiser step on a loss whose input is drawn from the global torch RNG."""
    policy, opt, sched = s
    vocab = len(policy.tokenizer)
    ids = (torch.rand(2, 8) * (vocab - 4)).long() + 4
    weights = torch.rand(2, 8)
    lp = token_logprobs(policy.model, ids, torch.ones_like(ids))
    loss = -(lp * weights).mean()
    opt.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    sched.step()
    return ids


def _params(policy: Policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


def _assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _state(step: int) -> TrainerState:
    return TrainerState(step=step, last_published=step, consumed=10 * step, extra={})


def test_resume_is_bitwise_exact(tmp_path: Path) -> None:
    torch.manual_seed(1234)
    orig = _setup(seed=0)
    for _ in range(3):
        _train_step(orig)
    rng = random.Random(7)
    rng.random()
    state = TrainerState(
        step=3, last_published=4, consumed=17, extra={"reward_sum": 1.5, "hist": [1, 2], "tag": "x"}
    )
    path = save_checkpoint(tmp_path, orig[0], orig[1], orig[2], state, py_rng=rng)
    assert path == tmp_path / "step_00000003"
    names = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    for f in (
        "policy/model.safetensors",
        "policy/config.json",
        "optimizer.safetensors",
        "optimizer.json",
        "scheduler.json",
        "rng.safetensors",
        "rng.json",
        "trainer_state.json",
        "manifest.json",
    ):
        assert f in names
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == names - {"manifest.json"}
    opt_json = json.loads((path / "optimizer.json").read_text())
    assert opt_json["class"] == "AdamW"
    from safetensors.torch import load_file

    assert "state.0.exp_avg" in load_file(path / "optimizer.safetensors")

    # The original run continues: one more step from the saved RNG state.
    saved_params = _params(orig[0])
    py_next = rng.random()
    orig_ids = _train_step(orig)
    orig_after = _params(orig[0])

    # A fresh process-equivalent: different init, different RNG position.
    fresh = _setup(seed=1)
    fresh_rng = random.Random(0)
    torch.manual_seed(999)
    assert latest_checkpoint(tmp_path) == path
    loaded = load_checkpoint(path, fresh[0], fresh[1], fresh[2], py_rng=fresh_rng)
    assert loaded == state
    _assert_bitwise_equal(_params(fresh[0]), saved_params)
    assert fresh[2].last_epoch == 3
    assert fresh[1].param_groups[0]["betas"] == (0.9, 0.999)
    assert fresh_rng.random() == py_next

    fresh_ids = _train_step(fresh)
    assert torch.equal(fresh_ids, orig_ids)
    _assert_bitwise_equal(_params(fresh[0]), orig_after)
    assert fresh[1].param_groups[0]["lr"] == orig[1].param_groups[0]["lr"]
    assert fresh[2].state_dict() == orig[2].state_dict()
    for p_o, p_f in zip(orig[0].model.parameters(), fresh[0].model.parameters(), strict=True):
        so, sf = orig[1].state[p_o], fresh[1].state[p_f]
        assert torch.equal(so["step"], sf["step"]) and float(sf["step"]) == 4
        assert torch.equal(so["exp_avg_sq"], sf["exp_avg_sq"])


def test_retention_and_temp_dirs(tmp_path: Path) -> None:
    s = _setup()
    # Leftovers of an interrupted save: a temp dir and a step dir without a manifest.
    stale = tmp_path / ".tmp-step_00000009-deadbeef"
    stale.mkdir()
    (stale / "optimizer.json").write_text("{}")
    partial = tmp_path / "step_00000099"
    partial.mkdir()
    (partial / "trainer_state.json").write_text("{}")
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None

    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, s[0], s[1], s[2], _state(step), keep=2)
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert dirs == ["step_00000003", "step_00000004", "step_00000099"]  # stale temp dir removed
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000004"
    # Re-saving an existing step replaces it.
    save_checkpoint(tmp_path, s[0], s[1], s[2], _state(4), keep=2)
    assert latest_checkpoint(tmp_path, verify=True) == tmp_path / "step_00000004"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # The checkpoint just written is kept even if newer-numbered ones exist.
    save_checkpoint(tmp_path, s[0], s[1], None, _state(2), keep=1)
    assert (tmp_path / "step_00000002").is_dir() and (tmp_path / "step_00000004").is_dir()
    assert not (tmp_path / "step_00000003").exists()


def test_corruption_is_detected_and_skipped(tmp_path: Path) -> None:
    s = _setup()
    first = save_checkpoint(tmp_path, s[0], s[1], s[2], _state(1))
    _train_step(s)
    second = save_checkpoint(tmp_path, s[0], s[1], s[2], _state(2))

    blob = bytearray((second / "optimizer.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (second / "optimizer.safetensors").write_bytes(bytes(blob))
    fresh = _setup(seed=1)
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is corrupt"):
        load_checkpoint(second, fresh[0], fresh[1], fresh[2])
    assert issubclass(CheckpointError, UserError)
    assert latest_checkpoint(tmp_path) == second
    assert latest_checkpoint(tmp_path, verify=True) == first
    assert load_checkpoint(first, fresh[0], fresh[1], fresh[2]).step == 1

    # Unverified loading still names a garbled file instead of crashing obscurely.
    (second / "optimizer.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"optimizer\.safetensors is corrupt"):
        load_checkpoint(second, fresh[0], fresh[1], fresh[2], verify=False)

    (first / "rng.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"rng\.safetensors is missing"):
        load_checkpoint(first, fresh[0], fresh[1], fresh[2])
    assert latest_checkpoint(tmp_path, verify=True) is None

    (first / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"no manifest\.json"):
        load_checkpoint(first, fresh[0], fresh[1], fresh[2])


def test_mismatches_are_clear_errors(tmp_path: Path) -> None:
    s = _setup()
    path = save_checkpoint(tmp_path, s[0], s[1], None, _state(1))
    with pytest.raises(CheckpointError, match=r"scheduler\.json is missing"):
        load_checkpoint(path, s[0], s[1], s[2])
    with pytest.raises(CheckpointError, match=r"rng\.json is missing"):
        load_checkpoint(path, s[0], s[1], None, py_rng=random.Random(0))
    sgd = torch.optim.SGD(s[0].model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="AdamW optimizer, got SGD"):
        load_checkpoint(path, s[0], sgd)
    with pytest.raises(CheckpointError, match=r"TrainerState\.extra"):
        save_checkpoint(tmp_path, s[0], s[1], None, TrainerState(2, 2, 0, {"bad": object()}))
    assert latest_checkpoint(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_module_uses_no_pickle() -> None:
    source = Path(ckpt_mod.__file__).read_text()
    for banned in ("pickle", "torch.save", "torch.load"):
        assert banned not in source
