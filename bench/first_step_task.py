"""A single-turn task both asyncrl and TRL's GRPOTrainer can run with the same reward function.

The calculator's word problems (``asyncrl.envs.calculator``), but the episode is ONE model turn:
the agent must write the first tool call of the reference solution, ``<tool>calc(n0 OP n1)</tool>``.
Reward 1.0 when the expression evaluates to the reference first intermediate result, else 0.0.
It keeps what the multi-turn task needs from the policy (read the first two numbers, pick the
operator from the verb) while fitting TRL's prompt → completion → reward interface.

Used as an asyncrl plugin environment (``env.kind: plugin``,
``env.path: first_step_task:FirstStepEnv`` with ``bench/`` on ``PYTHONPATH``) and imported by
``bench/trl_compare.py`` for TRL's reward function, so both sides score identically.
"""

from __future__ import annotations

import random
from typing import Any

from asyncrl.envs.base import StepResult, ToolCallAction, parse_action
from asyncrl.envs.calculator import CalculatorEnv, CalculatorTasks, calc_demonstrate, calc_solve
from asyncrl.envs.toolenv import CalcError, evaluate
from asyncrl.records import Task


def first_value(task: Task) -> int:
    """The reference first intermediate result of ``task``."""
    first_call = calc_solve(task)[0]  # "<tool>calc(12+7)</tool>"
    return int(evaluate(first_call[len("<tool>calc(") : -len(")</tool>")]))


def first_step_reward(text: str, target: int) -> float:
    """1.0 if ``text`` is one ``calc(EXPR)`` call whose value is ``target``; else 0.0."""
    action = parse_action(text)
    if not isinstance(action, ToolCallAction) or action.name != "calc":
        return 0.0
    try:
        return 1.0 if int(evaluate(action.args)) == target else 0.0
    except (CalcError, ValueError, OverflowError):
        return 0.0


class FirstStepEnv:
    """One model turn per episode; see the module docstring."""

    tools = CalculatorEnv().tools

    def __init__(self) -> None:
        self.target = 0

    @classmethod
    def make_task_source(cls, cfg: Any) -> CalculatorTasks:
        return CalculatorTasks.from_config(cfg)  # type: ignore[return-value]

    @staticmethod
    def solve(task: Task) -> list[str]:
        return calc_solve(task)[:1]

    @staticmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        return calc_demonstrate(task, rng, corruption_rate)[:1]

    def reset(self, task: Task) -> str:
        self.target = first_value(task)
        return str(task.payload["prompt"])

    def step(self, model_text: str) -> StepResult:
        reward = first_step_reward(model_text, self.target)
        return StepResult(
            observation="",
            done=True,
            reward=reward,
            outcome="success" if reward == 1.0 else "failure",
        )
