"""End to end: the calculator agent written as a plain ``openai`` tool-calling loop trains through
the gateway on the tiny model (rollout worker processes, queue, trainer, weights) and its held-out
success rises; the staleness bound holds for gateway sessions; nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.train import train

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(900)]  # `make test-long`
ROOT = Path(__file__).resolve().parents[1]


def test_openai_calculator_agent_learns_through_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the agent module (examples/) is found from the working directory
    cfg = load_config(  # the agent demo, shortened; bench/gateway_time_to_target.py uses the same
        ROOT / "configs" / "agent.yaml",
        [
            "rollout.concurrent_episodes=64",
            "trainer.total_steps=15",
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
