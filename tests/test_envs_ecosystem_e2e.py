"""``gem``, ``openenv`` and ``verifiers`` train end to end from their configs (configs/gem_guess.yaml,
configs/openenv_guess.yaml, configs/verifiers_arith.yaml) on a tiny model: no warm start (no demonstrations), a few asynchronous
RL steps, 16 samples trained, nothing lost, the held-out evaluation run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.train import train
from helpers import TINY_MODEL

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

TINY = [
    *TINY_MODEL,
    "model.path=null",
    "model.lora=null",
    "model.system_prompt=null",
    "model.device=cpu",
    "model.max_context=1024",  # the char-level tiny model: a GEM prompt is ~650 tokens
    "env.heldout_size=8",
    "rollout.group_size=4",
    "rollout.concurrent_episodes=8",
    "rollout.sampling.max_new_tokens=12",
    "trainer.batch_size=8",
    "trainer.total_steps=2",
    "trainer.checkpoint_every=2",
    "trainer.gradient_checkpointing=false",
    "telemetry.eval_every=0",
    "telemetry.log_every_s=0.5",
    "telemetry.tensorboard=false",
    # the configs' memory-lean allocator (1 MiB mmap threshold) would stay fixed in this test process
    # (glibc cannot give it back to its dynamic rule) and slow every later in-process warm start ~1.6x
    "launcher.malloc_mmap_threshold_kb=0",
]


def run(name: str, tmp: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    monkeypatch.chdir(ROOT)  # examples.* import from the repository root
    cfg = load_config(ROOT / "configs" / f"{name}.yaml", [*TINY, f"run_root={tmp}", f"cache_dir={cache}"])
    _, summary = train(cfg, display=False, eval_limit=8)
    print({k: summary.get(k) for k in ("initial_success", "final_success", "tool_calls")})
    assert summary["trainer_steps"] == 2 and summary["samples_trained"] == 16, summary
    assert summary["lost_trajectories"] == 0, summary
    return summary


@pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="gem-llm not installed")
def test_gem_trains_from_its_config(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run("gem_guess", tmp_path, cache_dir, monkeypatch)


@pytest.mark.skipif(importlib.util.find_spec("openenv") is None, reason="openenv-core not installed")
def test_openenv_trains_from_its_config(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run("openenv_guess", tmp_path, cache_dir, monkeypatch)


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="verifiers not installed")
def test_verifiers_trains_from_its_config(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verifiers v0 SingleTurnEnv (examples/verifiers_arith.py), scored by its own rubric."""
    run("verifiers_arith", tmp_path, cache_dir, monkeypatch)
