"""The warm start from the policy's own episodes (``trainer.sft.source: rollouts`` / ``auto``), and the
warm start's guard against environments that fault.

* pass@G and the kept set against hand-counted trajectories: successes only, distinct episodes, at most
  ``keep_per_task`` a task, faulted episodes counted and never kept, per-turn samples kept together;
* on a tiny model and a plugin with no demonstrations that chance solves a few times in a hundred, the
  rounds keep what succeeded, fine-tune on it and raise held-out success and pass@G well above the start;
  RL starts from the best round; the rounds stop at the target; the report lands in ``warmstart.json``;
* demonstrations whose environment raises on some rows are counted, skipped and reported; a warm start
  left with too few is one line; ``auto`` without demonstrations plays rounds where ``demos`` refuses.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tests.helpers import TINY_MODEL
from tests.test_signal import CoinTasks  # one task type, two levels, ids as content keys

from asyncrl.config import EnvConfig, RunConfig, load_config
from asyncrl.envs import StepResult
from asyncrl.errors import UserError
from asyncrl.jobs.groups import Counts, group_signal
from asyncrl.jobs.warm_rollouts import keep_successes
from asyncrl.records import Task, Trajectory, Turn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the counts ------------------------------------------------------------------------------------
def _traj(task: str, episode: str, outcome: str, ids: list[int], sample: str = "") -> Trajectory:
    turns = [Turn(role="env", token_ids=[1, 2]), Turn(role="model", token_ids=ids)]
    return Trajectory(
        id=sample or episode,
        episode_id=episode if sample else "",
        task=Task(id=task, task_type="t"),
        turns=turns,
        outcome=outcome,  # type: ignore[arg-type]
    )


def test_pass_at_g_counts_episodes_and_tasks_with_a_success() -> None:
    groups = [
        [_traj("a", "a0", "failure", [3]), _traj("a", "a1", "success", [4])],
        [_traj("b", "b0", "failure", [3]), _traj("b", "b1", "env_error", [3])],
        [
            _traj("c", "c0", "success", [5], sample="c0-0"),  # one episode of two per-turn samples
            _traj("c", "c0", "success", [6], sample="c0-1"),
            _traj("c", "c1", "success", [5]),
        ],
    ]
    assert group_signal(groups).rates() == (3 / 6, 2 / 3)
    assert group_signal([]).rates() == Counts().rates() == (0.0, 0.0)


def test_the_kept_set_is_distinct_successes_capped_per_task_and_never_a_fault() -> None:
    trajs = [
        _traj("a", "a0", "success", [4]),
        _traj("a", "a1", "success", [4]),  # the same tokens: kept once
        _traj("a", "a2", "success", [5]),
        _traj("a", "a3", "success", [6]),  # a third distinct one: over keep_per_task
        _traj("b", "b0", "failure", [7]),
        _traj("b", "b1", "env_error", [8]),
        _traj("c", "c0", "success", [5], sample="c0-0"),
        _traj("c", "c0", "success", [6], sample="c0-1"),
    ]
    seen: dict[str, set[tuple[int, ...]]] = {}
    kept, solved, faulted = keep_successes(trajs, per_task=2, seen=seen)
    assert (solved, faulted) == (2, 1)
    assert kept == [
        ([1, 2, 4], [0, 0, 1]),
        ([1, 2, 5], [0, 0, 1]),
        ([1, 2, 5], [0, 0, 1]),
        ([1, 2, 6], [0, 0, 1]),
    ]
    # a later round: what was kept is not kept again, the per-task cap holds over rounds
    later = [
        _traj("a", "a4", "success", [7]),
        _traj("c", "c2", "success", [5]),
        _traj("d", "d0", "success", [5]),
    ]
    kept, solved, faulted = keep_successes(later, per_task=2, seen=seen)
    assert (kept, solved, faulted) == ([([1, 2, 5], [0, 0, 1])] * 2, 3, 0)  # c's second, d's first


# -- a plugin that chance solves sometimes ---------------------------------------------------------
class LetterEnv:
    """Success when the reply holds an ``a``: a fresh tiny model does it a few times in a hundred."""

    tools: ClassVar[list[Any]] = []

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> CoinTasks:
        return CoinTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)

    async def reset(self, task: Task) -> str:
        self.task = task
        return "Write the letter a."

    async def step(self, model_text: str) -> StepResult:
        ok = "a" in model_text[:4]
        return StepResult(observation="", done=True, reward=float(ok), outcome="success" if ok else "failure")


class FlakyLetterEnv(LetterEnv):
    """Its ``reset`` raises on a third of the tasks (a row the user's environment cannot load)."""

    @staticmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        return ["a"]

    async def reset(self, task: Task) -> str:
        if task.payload["n"] % 3 == 0:
            raise ValueError(f"row {task.id} has no question")
        return await super().reset(task)


class BrokenLetterEnv(FlakyLetterEnv):
    async def reset(self, task: Task) -> str:
        raise ValueError("the dataset file is empty")


def _cfg(cache: Path, env: str, *extra: str) -> RunConfig:
    return load_config(
        None,
        [
            *TINY_MODEL,
            "env.kind=plugin",
            f"env.path={__name__}:{env}",
            "env.max_turns=1",
            "env.heldout_size=32",
            "env.guard.retries=0",
            "model.max_context=128",
            "rollout.group_size=4",
            "rollout.sampling.max_new_tokens=4",
            "trainer.sft.steps=40",
            "trainer.sft.batch_size=16",
            "trainer.sft.lr=3e-3",
            "trainer.sft.rollouts.tasks_per_round=32",
            "trainer.sft.rollouts.samples_per_task=8",
            "trainer.sft.rollouts.heldout_tasks=32",
            "trainer.sft.rollouts.epochs=20",
            f"cache_dir={cache}",
            *extra,
        ],
    )


def test_rounds_of_the_policys_own_successes_raise_success_and_pass_at_g(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import warm_start

    temperatures = "trainer.sft.rollouts.temperatures=[1.0,1.2]"
    cfg = _cfg(
        tmp_path,
        "LetterEnv",
        "trainer.sft.rollouts.rounds=2",
        "trainer.sft.rollouts.target_pass_at_g=1",
        temperatures,
    )
    ws = warm_start(cfg)
    meta = json.loads((ws.path / "warmstart.json").read_text())
    assert meta["source"] == "auto" and meta["demos"] == 0  # no demonstrations: auto plays rounds
    rounds = meta["rollouts"]["rounds"]
    start, *played = rounds
    assert start["round"] == 0 and start["heldout_pass_at_g"] < 0.5, start  # under the target: rounds run
    assert len(played) == 2, rounds
    first = played[0]
    assert first["tasks"] == 32 and first["episodes"] == 256 and first["temperature"] == 1.0
    assert first["tasks_with_success"] > 0 and first["kept"] >= first["tasks_with_success"]
    assert first["kept_total"] == first["kept"] and first["steps"] == min(100, -(-20 * first["kept"] // 16))
    second = played[1]
    assert second["temperature"] == 1.2 and second["kept_total"] == first["kept"] + second["kept"]
    best = max(rounds, key=lambda r: r["heldout_pass_at_g"])
    assert meta["rollouts"]["best_round"] == best["round"] > 0
    assert best["heldout_pass_at_g"] >= start["heldout_pass_at_g"] + 0.3, rounds
    assert best["heldout_success"] >= start["heldout_success"] + 0.2, rounds
    # RL starts from the best round: the saved policy's own evaluation agrees with it, not with the start
    assert ws.heldout_success >= start["heldout_success"] + 0.2, (ws.heldout_success, rounds)


def test_rounds_stop_at_the_target(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import warm_start

    cfg = _cfg(tmp_path, "LetterEnv", "trainer.sft.rollouts.rounds=5")  # target 0.5: a round or two
    rollouts = json.loads((warm_start(cfg).path / "warmstart.json").read_text())["rollouts"]
    *before, last = rollouts["rounds"]
    assert rollouts["stopped"] == "target" and 2 <= len(rollouts["rounds"]) < 6, rollouts
    assert last["heldout_pass_at_g"] >= 0.5 > max(r["heldout_pass_at_g"] for r in before), rollouts


def test_faulting_rows_are_counted_and_skipped_in_demonstrations_and_rounds(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import warm_start

    cfg = _cfg(
        tmp_path,
        "FlakyLetterEnv",
        "trainer.sft.num_demos=30",
        "trainer.sft.rollouts.rounds=1",
        "trainer.sft.rollouts.target_pass_at_g=1",
    )
    meta = json.loads((warm_start(cfg).path / "warmstart.json").read_text())
    assert 3 <= meta["demo_faults"] <= 20 and meta["demos"] == 30 - meta["demo_faults"]
    assert "has no question" in meta["demo_fault_examples"][0]
    played = meta["rollouts"]["rounds"][1]
    assert 0 < played["faulted"] < played["episodes"]


def test_a_warm_start_left_with_too_few_demonstrations_is_one_line(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import warm_start

    cfg = _cfg(tmp_path, "BrokenLetterEnv", "trainer.sft.num_demos=8", "trainer.sft.source=demos")
    with pytest.raises(UserError) as err:
        warm_start(cfg)
    text = str(err.value)
    assert "\n" not in text and "0 demonstration samples left" in text and "8 of 8 faulted" in text
    assert "the dataset file is empty" in text and "trainer.sft.source: rollouts" in text


def test_demos_without_demonstrations_refuses_where_auto_plays_rounds(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import has_demonstrations, uses_demonstrations, warm_start

    demos = _cfg(tmp_path, "LetterEnv", "trainer.sft.source=demos")
    assert not has_demonstrations(demos.env) and uses_demonstrations(demos)
    with pytest.raises(UserError, match=r"trainer\.sft\.source: rollouts"):
        warm_start(demos)
    auto = _cfg(tmp_path, "FlakyLetterEnv")
    assert has_demonstrations(auto.env) and uses_demonstrations(auto)
    assert not uses_demonstrations(_cfg(tmp_path, "FlakyLetterEnv", "trainer.sft.source=rollouts"))


def test_editing_the_demonstrator_function_invalidates_the_cached_warm_start(tmp_path: Path) -> None:
    from asyncrl.jobs.warm_start import warm_start_key

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(40))
    )
    demo = tmp_path / "my_demos.py"
    demo.write_text("def turns(example, rng):\n    return ['<answer>' + example['answer'] + '</answer>']\n")
    over = ["env.kind=dataset", f"env.dataset.path={rows}", f"env.dataset.demonstrator={demo}:turns"]
    before = warm_start_key(load_config(None, over))
    demo.write_text(
        "def turns(example, rng):\n    return ['Sure. <answer>' + example['answer'] + '</answer>']\n"
    )
    assert warm_start_key(load_config(None, over)) != before


def test_the_evaluation_counts_episodes_per_bucket() -> None:
    from asyncrl.rollout.heldout import bucket_counts

    trajs = [
        _traj("a", "a0", "success", [4]),
        _traj("a", "a1", "failure", [4]),
        _traj("c", "c0", "success", [5], sample="c0-0"),  # one episode of two per-turn samples
        _traj("c", "c0", "success", [6], sample="c0-1"),
    ]
    assert bucket_counts(trajs) == {"t:0": [2, 3]}
