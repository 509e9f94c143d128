"""``reasoning_gym`` and ``dataset`` train end to end from a config on a tiny model: a warm start from
the reference answers, then asynchronous RL, with nothing lost and the held-out evaluation run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.train import train
from helpers import TINY_MODEL

pytestmark = pytest.mark.slow

TINY = [
    *TINY_MODEL,
    "model.max_context=160",
    "env.max_turns=2",
    "env.heldout_size=16",
    "rollout.group_size=4",
    "rollout.concurrent_episodes=16",
    "rollout.sampling.max_new_tokens=16",
    "trainer.batch_size=16",
    "trainer.total_steps=4",
    "trainer.checkpoint_every=2",
    "trainer.sft.steps=60",
    "trainer.sft.num_demos=128",
    "trainer.sft.batch_size=16",
    "telemetry.log_every_s=0.5",
    "telemetry.tensorboard=false",
]


def run(tmp: Path, cache: Path, *extra: str) -> dict[str, float]:
    cfg = load_config(None, [*TINY, f"run_root={tmp}", f"cache_dir={cache}", *extra])
    _, summary = train(cfg, display=False, eval_limit=16)
    print({k: summary.get(k) for k in ("initial_success", "final_success", "tool_calls")})
    return summary


def test_reasoning_gym_trains_from_a_config(tmp_path: Path, cache_dir: Path) -> None:
    s = run(
        tmp_path,
        cache_dir,
        "env.kind=reasoning_gym",
        "env.reasoning_gym.datasets=[{name: basic_arithmetic, config: {operators: ['+'], min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}]",
        "env.reasoning_gym.tools=[calc]",
    )
    assert s["trainer_steps"] == 4 and s["samples_trained"] == 64 and s["lost_trajectories"] == 0, s


def test_dataset_trains_from_a_config(tmp_path: Path, cache_dir: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
            for a in range(20)
            for b in range(20)
        )
    )
    s = run(
        tmp_path / "runs",
        cache_dir,
        "env.kind=dataset",
        f"env.dataset.path={rows}",
        "env.dataset.scorer=numeric",
    )
    assert s["trainer_steps"] == 4 and s["samples_trained"] == 64 and s["lost_trajectories"] == 0, s
