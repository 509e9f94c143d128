"""The base of the answer environments (``reasoning_gym``, ``dataset``): a question, one answer.

The prompt is the task's question; the model answers with ``<answer>TEXT</answer>`` and the
scorer of the subclass grades TEXT (see :mod:`asyncrl.envs.scoring` for the hygiene rules).
Tools are opt-in (``tools: [calc, python]``): the calculator's ``calc`` and the sandboxed
``python`` of the built-ins, with the same process rewards (:class:`~asyncrl.envs.base.EpisodeRewards`).
Warm starts use the reference answer, corrupted at ``trainer.sft.corruption_rate``, or the turns of
the user's ``demonstrator`` function (:mod:`asyncrl.envs.demos`).
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncrl.envs.demos import UserDemonstrator, corrupt_turns, corrupted
from asyncrl.envs.toolenv import CALC_TOOL, PYTHON_TOOL, ToolEnv, run_calc, run_sandboxed

if TYPE_CHECKING:
    from asyncrl.config import SandboxConfig
    from asyncrl.records import Task

__all__ = ["AnswerEnv"]


class AnswerEnv(ToolEnv):
    """A question answered once, scored by :meth:`score`; ``tools`` names the opt-in tools."""

    def __init__(
        self, tools: Sequence[str], reward: str, sandbox: SandboxConfig, demonstrator: str | None = None
    ) -> None:
        """``demonstrator``: the ``env.<kind>.demonstrator`` function making the warm start's turns."""
        super().__init__()
        self.sandbox = sandbox
        self.tools = [{"calc": CALC_TOOL, "python": PYTHON_TOOL}[name] for name in tools]
        self.partial_credit = reward == "score"
        field = f"env.{self.kind}.demonstrator"
        self.demonstrator = UserDemonstrator(demonstrator, field) if demonstrator else None

    @staticmethod
    @abstractmethod
    def gold(task: Task) -> str:
        """The task's reference answer."""

    @abstractmethod
    def example(self, task: Task) -> dict[str, Any]:
        """The task as the ``demonstrator`` function receives it (the row, the entry)."""

    def answer_turn(self, task: Task, answer: str) -> str:
        """The demonstrated turn giving ``answer``: ``<answer>answer</answer>``, unless a subclass
        shows more (``dataset``: the row's worked solution first)."""
        return f"<answer>{answer}</answer>"

    def solve(self, task: Task) -> list[str]:  # type: ignore[override]
        if self.demonstrator is not None:
            return self.demonstrator.solve(self.example(task), task)
        return [self.answer_turn(task, self.gold(task).strip())]

    def demonstrate(self, task: Task, rng: random.Random, corruption_rate: float) -> list[str]:  # type: ignore[override]
        if self.demonstrator is not None:
            return corrupt_turns(self.demonstrator.turns(self.example(task), rng), rng, corruption_rate)
        return [self.answer_turn(task, corrupted(self.gold(task), rng, corruption_rate))]

    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        return run_calc(args) if name == "calc" else await run_sandboxed(args, self.sandbox)

    def is_correct(self, answer: str) -> bool:
        return self.score(answer) >= 1.0

    @abstractmethod
    def score(self, answer: str) -> float:
        """The answer's score in [0, 1] on ``self.task`` (never raises: see ``safe_score``)."""
