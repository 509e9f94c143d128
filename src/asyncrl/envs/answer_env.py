"""The base of the answer environments (``reasoning_gym``, ``dataset``): a question, one answer.

The prompt is the task's question; the model answers with ``<answer>TEXT</answer>`` and the
scorer of the subclass grades TEXT (see :mod:`asyncrl.envs.scoring` for the hygiene rules).
Tools are opt-in (``tools: [calc, python]``): the calculator's ``calc`` and the sandboxed
``python`` of the built-ins, with the same process rewards (:class:`~asyncrl.envs.base.EpisodeRewards`).
Warm starts use the reference answer, corrupted at ``trainer.sft.corruption_rate``.
"""

from __future__ import annotations

import random
import re
import string
from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncrl.envs.base import mentions_number
from asyncrl.envs.calculator import CalcError, CalculatorEnv, evaluate
from asyncrl.envs.python_env import OBSERVATION_CHARS, PythonEnv
from asyncrl.envs.sandbox import run_python
from asyncrl.envs.toolenv import ToolEnv

if TYPE_CHECKING:
    from asyncrl.config import SandboxConfig

__all__ = ["AnswerEnv", "answer_demonstrate", "corrupt_answer"]

_INT_RE = re.compile(r"-?\d+")


class AnswerEnv(ToolEnv):
    """A question answered once, scored by :meth:`score`; ``tools`` names the opt-in tools."""

    def __init__(self, tools: Sequence[str], reward: str, sandbox: SandboxConfig) -> None:
        super().__init__()
        self.sandbox = sandbox
        known = {"calc": lambda: CalculatorEnv().tools[0], "python": lambda: PythonEnv(sandbox).tools[0]}
        self.tools = [known[name]() for name in tools]
        self.partial_credit = reward == "score"

    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        if name == "calc":
            try:
                return True, str(evaluate(args))
            except CalcError as exc:
                return False, str(exc)
        result = await run_python(args, self.sandbox)
        return result.ok, result.summary(OBSERVATION_CHARS).removeprefix("error: ")

    def result_used(self, text: str, result: str) -> bool:
        return mentions_number(text, result)

    def is_correct(self, answer: str) -> bool:
        return self.score(answer) >= 1.0

    @abstractmethod
    def score(self, answer: str) -> float:
        """The answer's score in [0, 1] on ``self.task`` (never raises: see ``safe_score``)."""


def corrupt_answer(gold: str, rng: random.Random) -> str:
    """A plausible wrong answer, never ``gold`` nor ``gold`` respaced or repunctuated (which a fair
    scorer may accept): an integer off by 1 or 2, else the first digit (or, without digits, the
    first letter) changed -- the first, because a scorer with a tolerance fairly accepts a change in
    the tenth significant digit -- else ``x`` appended."""
    text = gold.strip()
    if _INT_RE.fullmatch(text):
        return str(int(text) + rng.choice((-2, -1, 1, 2)))
    for pool in (string.digits, string.ascii_lowercase, string.ascii_uppercase):
        spots = [k for k, ch in enumerate(text) if ch in pool]
        if spots:
            k = spots[0]
            return text[:k] + rng.choice(pool.replace(text[k], "")) + text[k + 1 :]
    return text + "x"


def answer_demonstrate(gold: str, rng: random.Random, corruption_rate: float) -> list[str]:
    """The reference answer, or (with probability ``corruption_rate``) a wrong one."""
    answer = corrupt_answer(gold, rng) if rng.random() < corruption_rate else gold.strip()
    return [f"<answer>{answer}</answer>"]
