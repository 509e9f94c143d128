"""``env.kind: mix`` trains end to end from a config on a tiny model: a calculator and a dataset (answer)
environment in one run, with each environment's own held-out rows in ``summary.json`` and a member made
to fault on every step showing its faults in its own row only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.report import write_report
from asyncrl.jobs.train import train
from helpers import TINY_MODEL

pytestmark = pytest.mark.slow


def test_a_calculator_and_a_dataset_train_in_one_run(tmp_path: Path, cache_dir: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
            for a in range(20)
            for b in range(20)
        )
    )
    mix = (
        "env.mix=[{name: arith, weight: 2, env: {kind: calculator, heldout_size: 8}},"
        f" {{name: qa, weight: 1, env: {{kind: dataset, heldout_size: 8, dataset: {{path: '{rows}', scorer: numeric}},"
        " faults: {exception_rate: 1.0}, guard: {retries: 0}}}]"
    )
    cfg = load_config(
        None,
        [
            *TINY_MODEL,
            f"run_root={tmp_path / 'runs'}",
            f"cache_dir={cache_dir}",
            "model.max_context=160",
            "env.kind=mix",
            mix,
            "env.max_turns=2",
            "rollout.group_size=4",
            "rollout.concurrent_episodes=16",
            "rollout.sampling.max_new_tokens=16",
            "trainer.batch_size=16",
            "trainer.total_steps=4",
            "trainer.checkpoint_every=2",
            "trainer.sft.steps=8",
            "trainer.sft.num_demos=32",
            "trainer.sft.batch_size=16",
            "telemetry.log_every_s=0.5",
            "telemetry.tensorboard=false",
        ],
    )
    run_dir, s = train(cfg, display=False, eval_limit=16)
    assert s["trainer_steps"] == 4 and s["samples_trained"] == 64 and s["lost_trajectories"] == 0, s
    envs = s["per_env"]
    print(json.dumps(envs, indent=1))
    assert list(envs) == ["arith", "qa"], envs
    for name in ("arith", "qa"):
        row = envs[name]
        assert row["heldout_episodes"] == 8, row  # its own held-out split, 8 of the 16 evaluated
        assert row["initial_success"] is not None and row["final_success"] is not None, row
        assert row["train_episodes"] > 0 and row["tokens"] > 0, row
    assert envs["arith"]["faults"] == 0 and envs["qa"]["faults"] > 0, envs  # the broken member alone
    assert envs["arith"]["weight"] == pytest.approx(2 / 3)
    assert sum(r["curriculum_share"] for r in envs.values()) == pytest.approx(1.0)
    final = json.loads((Path(run_dir) / "final_eval.json").read_text())
    assert set(final["per_env"]) == {"arith", "qa"}
    html = write_report(Path(run_dir)).read_text()
    assert "Per environment" in html and ">qa<" in html, "the report's per-environment table"
