"""The base of the answer environments (``reasoning_gym``, ``dataset``): a question, one answer.

The prompt is the task's question; the model answers with ``<answer>TEXT</answer>`` and the
scorer of the subclass grades TEXT (see :mod:`asyncrl.envs.scoring` for the hygiene rules).
Tools are opt-in (``tools: [calc, python]``): the calculator's ``calc`` and the sandboxed
``python`` of the built-ins, with the same process rewards (:class:`~asyncrl.envs.base.EpisodeRewards`).
Warm starts use the reference answer, corrupted at ``trainer.sft.corruption_rate``, or the turns of
the user's ``demonstrator`` function (:mod:`asyncrl.envs.demos`).
"""

from __future__ import annotations

import functools
import random
import re
import string
from abc import abstractmethod
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

from asyncrl.envs.base import ToolCallAction, parse_action
from asyncrl.envs.calculator import CALC_TOOL, run_calc
from asyncrl.envs.demos import UserDemonstrator
from asyncrl.envs.python_env import PYTHON_TOOL, run_sandboxed
from asyncrl.envs.toolenv import ToolEnv

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig, SandboxConfig
    from asyncrl.records import Task

__all__ = [
    "AnswerEnv",
    "answer_demonstrate",
    "cached_source",
    "corrupt_answer",
    "corrupt_turns",
]

_INT_RE = re.compile(r"-?\d+")


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


def corrupted(gold: str, rng: random.Random, corruption_rate: float) -> str:
    """The reference answer (stripped), or (with probability ``corruption_rate``) a wrong one."""
    return corrupt_answer(gold, rng) if rng.random() < corruption_rate else gold.strip()


def answer_demonstrate(gold: str, rng: random.Random, corruption_rate: float) -> list[str]:
    """The reference answer, or (with probability ``corruption_rate``) a wrong one, as the one turn."""
    return [f"<answer>{corrupted(gold, rng, corruption_rate)}</answer>"]


def corrupt_turns(turns: list[str], rng: random.Random, corruption_rate: float) -> list[str]:
    """``turns``, or (with probability ``corruption_rate``) with one integer changed: in a tool call
    when one has an integer (an answer's text may not be what the reward reads), else in any turn."""
    turns = list(turns)
    calls = [
        i for i, t in enumerate(turns) if _INT_RE.search(t) and isinstance(parse_action(t), ToolCallAction)
    ]
    spots = calls or [i for i, t in enumerate(turns) if _INT_RE.search(t)]
    if spots and rng.random() < corruption_rate:
        i = rng.choice(spots)
        turns[i] = _INT_RE.sub(lambda m: corrupt_answer(m.group(0), rng), turns[i], count=1)
    return turns


def cached_source(source: type[Any], section: Any, cfg: EnvConfig) -> Any:
    """``source(section, seed=, heldout_size=, lo=, hi=)``, built once per process and configuration
    (one generation or read of the rows, one hygiene check of the scorer)."""
    return (
        _cached(  # classes are hashable; typeshed's lru_cache says Hashable, which type[Any] is not to mypy
            cast("Hashable", source),
            cast("Hashable", type(section)),
            section.model_dump_json(),
            cfg.seed,
            cfg.heldout_size,
            cfg.min_difficulty,
            cfg.max_difficulty,
        )
    )


@functools.lru_cache(maxsize=8)
def _cached(
    source: type[Any], model: Any, section_json: str, seed: int, heldout_size: int, lo: int, hi: int
) -> Any:
    section = model.model_validate_json(section_json)
    return source(section, seed=seed, heldout_size=heldout_size, lo=lo, hi=hi)
