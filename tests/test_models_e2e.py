"""Pretrained-model runs end to end: ``asyncrl train`` on a model that speaks a real tokenizer and
chat template, for the calculator, kb_lookup and a user plugin environment whose code knows
nothing of the model; and a 2-step run of the real SmolLM2-135M-Instruct.

The ``realmodel`` ones (``make test-models``; minutes on two cores, so not in ``make test``) train
the real model on each environment. The others use a tiny random Llama carrying SmolLM2's tokenizer and ChatML template (so the
whole pretrained path — loading, the generated tool prompt, Hermes calls, token-exact deltas —
runs at the cost of a 2M-parameter model); the last one is the real model.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import EnvConfig, load_config
from asyncrl.envs import HashSplitTaskSource, StepResult, Tool
from asyncrl.jobs.train import train
from asyncrl.records import Task
from models_util import family_tokenizer, load_tokenizer, smollm2_dir, tiny_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.realmodel]  # make test-models: keeps make test within its budget

SMALL = [
    "env.heldout_size=2",
    "env.max_turns=3",
    "rollout.group_size=2",
    "rollout.concurrent_episodes=4",
    "rollout.sampling.max_new_tokens=24",
    "trainer.batch_size=4",
    "trainer.total_steps=2",
    "trainer.checkpoint_every=1",
    "trainer.sft.steps=2",
    "trainer.sft.batch_size=2",
    "trainer.sft.num_demos=4",
    "telemetry.eval_every=0",
    "telemetry.tensorboard=false",
    "algo.kl_coef=0",
]


# A user plugin: its code is the same for a char model and a pretrained one.
class WordTasks(HashSplitTaskSource):
    task_types = ("word",)
    difficulties = (1,)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = "".join(rng.choice("abcdef") for _ in range(4))
        return Task(id=f"w-{word}", task_type="word", difficulty=difficulty, payload={"word": word})

    def content_key(self, task: Task) -> str:
        return str(task.payload["word"])


class ShoutEnv:
    """Answer with the upper-cased word; the ``shout`` tool upper-cases text."""

    def __init__(self) -> None:
        self.tools = [Tool("shout", "upper-case text", {"type": "string", "name": "text", "example": "hi"})]
        self.word = ""

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> WordTasks:
        return WordTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)

    @staticmethod
    def solve(task: Task) -> list[str]:
        w = task.payload["word"]
        return [f"<tool>shout({w})</tool>", f"<answer>{w.upper()}</answer>"]

    @staticmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        return ShoutEnv.solve(task)

    async def reset(self, task: Task) -> str:
        self.word = task.payload["word"]
        return f"Shout the word {self.word}."

    async def step(self, model_text: str) -> StepResult:
        if model_text.startswith("<tool>shout(") and model_text.endswith(")</tool>"):
            return StepResult(observation=model_text[12:-8].upper(), process_reward=0.1)
        if model_text.startswith("<answer>"):
            ok = model_text[8:-9] == self.word.upper()
            return StepResult(
                observation="", done=True, reward=float(ok), outcome="success" if ok else "failure"
            )
        return StepResult(observation="error: call shout or answer", process_reward=-0.1)


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = family_tokenizer(load_tokenizer(smollm2_dir()), "smollm2")
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-smollm2-format"), tok)


def _check(summary: dict[str, Any], run_dir: Path) -> None:
    assert summary["trainer_steps"] == 2 and summary["lost_trajectories"] == 0
    assert summary["token_exact_rate"] == 1.0 and summary["token_exact_checked"] > 0
    prior = (run_dir / "initial_eval.json").read_text()
    assert '"token_exact_rate": 1.0' in prior


@pytest.mark.parametrize(
    "env",
    [["env.kind=calculator"], ["env.kind=kb_lookup"], ["env.kind=plugin", f"env.path={__name__}:ShoutEnv"]],
)
def test_train_a_chat_template_model_on_each_environment(
    env: list[str], tiny_chat_model: Path, tmp_path: Path
) -> None:
    cfg = load_config(
        None,
        [
            *SMALL,
            *env,
            f"model.path={tiny_chat_model}",
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'c'}",
        ],
    )
    run_dir, summary = train(cfg, display=False, eval_limit=2)
    _check(summary, run_dir)


@pytest.mark.realmodel
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("env", ["calculator", "kb_lookup", "plugin"])
def test_two_steps_of_smollm2(env: str, tmp_path: Path) -> None:
    kind = [f"env.kind={env}"] + ([f"env.path={__name__}:ShoutEnv"] if env == "plugin" else [])
    cfg = load_config(
        None,
        [
            *SMALL,
            *kind,
            "env.max_turns=2",
            "rollout.sampling.max_new_tokens=16",
            "trainer.sft.steps=1",
            f"model.path={smollm2_dir()}",
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'c'}",
        ],
    )
    run_dir, summary = train(cfg, display=False, eval_limit=1)
    _check(summary, run_dir)
