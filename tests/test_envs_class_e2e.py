"""``env.kind: class`` trains end to end from a config on a tiny model: a TRL-style class, unchanged,
a warm start from the rows' demonstrations (a tool call, then the answer), asynchronous RL with the
class's reward function over the environments, nothing lost, and the held-out evaluation succeeds
through the tool (each call recorded from the parsed action)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.train import train
from helpers import TINY_MODEL

pytestmark = pytest.mark.slow

LAMP = '''
class Lamp:
    def reset(self, **kwargs):
        self.on = False

    def switch_on(self) -> str:
        """
        Switch the lamp on.

        Returns:
            The lamp's state.
        """
        self.on = True
        return "on"


def reward_func(environments, **kwargs):
    return [1.0 if env.on else 0.0 for env in environments]
'''


def test_a_trl_environment_class_trains_from_a_config(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "lamp.py").write_text(LAMP)
    demo = ["<tool>switch_on()</tool>", "<answer>on</answer>"]
    rows = [{"prompt": f"Light room {i}.", "demo": demo} for i in range(300)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        None,
        [
            *TINY_MODEL,
            "model.max_context=160",
            "env.kind=class",
            f"env.class_env.factory={tmp_path / 'lamp.py'}:Lamp",
            f"env.class_env.reward={tmp_path / 'lamp.py'}:reward_func",
            f"env.class_env.rows={tmp_path / 'rows.jsonl'}",
            "env.class_env.demo_field=demo",
            "env.max_turns=2",
            "env.heldout_size=8",
            "rollout.group_size=4",
            "rollout.concurrent_episodes=8",
            "rollout.sampling.max_new_tokens=24",
            "trainer.batch_size=8",
            "trainer.total_steps=2",
            "trainer.checkpoint_every=2",
            "trainer.sft.steps=300",
            "trainer.sft.num_demos=128",
            "trainer.sft.batch_size=16",
            "telemetry.log_every_s=0.5",
            "telemetry.tensorboard=false",
            f"run_root={tmp_path / 'runs'}",
            f"cache_dir={cache_dir}",
        ],
    )
    _, s = train(cfg, display=False, eval_limit=8)
    final = json.loads((Path(s["run_dir"]) / "final_eval.json").read_text())
    print(
        s["initial_success"],
        {k: final.get(k) for k in ("success_rate", "tool_calls", "tool_success_rate", "outcomes")},
    )
    assert s["trainer_steps"] == 2 and s["samples_trained"] == 16 and s["lost_trajectories"] == 0, s
    # success is the reward function's verdict on the environment: the lamp was switched on by the tool
    assert s["initial_success"] >= 0.5, s  # after the warm start, on held-out rows
    assert final["success_rate"] > 0 and final["tool_calls"] > 0 and final["tool_success_rate"] > 0, final
