"""End to end: the calculator agent written as a plain ``openai`` tool-calling loop trains through
the gateway on the tiny model (rollout worker processes, queue, trainer, weights) and its held-out
success rises; the staleness bound holds for gateway sessions; nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.orchestrator.run import train

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]  # `make test-long`
ROOT = Path(__file__).resolve().parents[1]


def test_openai_calculator_agent_learns_through_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the agent module (examples/) is found from the working directory
    cfg = load_config(
        None,
        [
            "env.kind=agent",
            "env.path=examples.calculator_openai:run",
            "env.agent_tasks=calculator",
            "model.max_context=320",
            "env.min_difficulty=2",
            "env.max_difficulty=3",
            "env.heldout_size=128",
            "rollout.group_size=8",
            "rollout.concurrent_episodes=64",
            "rollout.sampling.max_new_tokens=24",
            "trainer.batch_size=64",
            "trainer.lr=1e-4",
            "trainer.total_steps=15",
            "trainer.sft.steps=800",
            "trainer.sft.corruption_rate=0.5",
            "orchestrator.max_staleness=2",
            "telemetry.log_every_s=0.5",
            "telemetry.eval_every=0",
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    _, s = train(cfg, display=False, eval_limit=96)
    assert s["final_success"] >= s["initial_success"] + 0.10, s
    assert s["staleness_max"] <= 2
    assert s["trainer_steps"] == 15 and s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0
