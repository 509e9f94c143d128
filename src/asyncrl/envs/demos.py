"""Warm-start demonstrations from the user's data: a worked-solution column and a demonstrator function.

* ``env.dataset.solution_field``: a row's worked solution becomes the demonstrated model turn --
  the solution's text as reasoning, then ``<answer>`` with the row's answer (the text the
  environment's scorer grades, so a clean demonstration succeeds). GSM8K's final line ``#### N``
  is understood (:func:`split_solution`): it is left out of the reasoning, and an answer column
  whose text ends with it is read as ``N``.
* ``demonstrator: module:function`` (``dataset``, ``reasoning_gym``, ``class``): the user's
  ``function(example, rng) -> list[str]`` returns the model turns in asyncrl's text protocol
  (``<tool>NAME(ARGS)</tool>``, ``<answer>TEXT</answer>``: what a ``class`` kind's ``demo_field``
  list holds) for the task's example (the row, or the reasoning-gym entry). At
  ``trainer.sft.corruption_rate`` the warm start changes one number in them
  (:func:`~asyncrl.envs.demos.corrupt_turns`).
* :func:`tool_note`: the one line ``asyncrl env check`` and ``asyncrl train`` print when an
  environment offers tools that its demonstrations never call.
"""

from __future__ import annotations

import copy
import random
import re
import string
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import ToolCallAction, parse_action
from asyncrl.envs.class_tools import load_object
from asyncrl.envs.imports import EnvPluginError

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncrl.records import Task

__all__ = [
    "UserDemonstrator",
    "answer_demonstrate",
    "corrupt_answer",
    "corrupt_turns",
    "corrupted",
    "final_answer",
    "solution_turn",
    "split_solution",
    "tool_note",
]

_FINAL = re.compile(r"(?:\A|\n)[ \t]*####[ \t]*(?P<final>[^\n]*?)\s*\Z")
"""GSM8K's last line, ``#### N``."""
TOOL_NOTE_TASKS = 8
"""Tasks whose clean demonstrations :func:`tool_note` reads."""


def split_solution(text: str) -> tuple[str, str | None]:
    """``(reasoning, final)`` of a worked solution: the text before a last line ``#### N`` and ``N``;
    ``(text, None)`` (stripped) without one."""
    m = _FINAL.search(text)
    if m is None or not m.group("final"):
        return text.strip(), None
    return text[: m.start()].strip(), m.group("final")


def final_answer(text: str) -> str:
    """An answer column's reference answer: ``N`` when its text ends with a line ``#### N``, else the text."""
    final = split_solution(text)[1]
    return final if final is not None else text.strip()


def solution_turn(solution: str, answer: str) -> str:
    """The model turn demonstrating a worked solution: its reasoning, then ``<answer>answer</answer>``."""
    reasoning = split_solution(solution)[0]
    return f"{reasoning}\n<answer>{answer}</answer>" if reasoning else f"<answer>{answer}</answer>"


class UserDemonstrator:
    """The function named by a ``demonstrator`` field; every mistake is an :class:`EnvPluginError`
    naming the field (``field``: its config path, e.g. ``env.dataset.demonstrator``)."""

    def __init__(self, spec: str, field: str) -> None:
        self.spec, self.field = spec, field
        fn = load_object(spec, field)
        if not callable(fn):
            raise EnvPluginError(f"{field} {spec!r} is a {type(fn).__name__}, not a function")
        self.fn: Callable[[dict[str, Any], random.Random], Any] = fn

    def turns(self, example: dict[str, Any], rng: random.Random) -> list[str]:
        """The function's model turns for ``example`` (a copy: the function may change it)."""
        try:
            out = self.fn(copy.deepcopy(example), rng)
        except Exception as exc:
            raise EnvPluginError(f"{self.field} {self.spec!r} raised {type(exc).__name__}: {exc}") from exc
        if not (isinstance(out, list) and out and all(isinstance(t, str) for t in out)):
            got = f"a list holding a {_first_odd(out)}" if isinstance(out, list) and out else repr(out)[:60]
            raise EnvPluginError(
                f"{self.field} {self.spec!r} returned {got}; it must return the model turns, a non-empty "
                "list of strings such as ['<tool>calc(2+3)</tool>', '<answer>5</answer>']"
            )
        return out

    def solve(self, example: dict[str, Any], task: Task) -> list[str]:
        """The clean demonstration (the function's rng seeded by the task's id: the same every time)."""
        return self.turns(example, random.Random(task.id))


def _first_odd(out: list[Any]) -> str:
    return next(type(t).__name__ for t in out if not isinstance(t, str))


def tool_note(env: Any, tasks: list[Task], where: str) -> str | None:
    """One line when ``env`` offers tools and none of the clean demonstrations of ``tasks`` (the first
    :data:`TOOL_NOTE_TASKS`) calls one: the warm start would teach answering without them. ``where``
    names the environment (``env.reasoning_gym``, ``env.mix member 'rg'``). Never raises: a
    demonstration that fails is left out (the warm start and ``env check`` report those)."""
    names = [t.name for t in env.tools]
    demonstrate = getattr(env, "demonstrate", None)
    tasks = tasks[:TOOL_NOTE_TASKS]
    if not names or not callable(demonstrate) or not tasks:
        return None
    rng, shown = random.Random(0), 0
    for task in tasks:
        try:
            turns = demonstrate(task, rng, 0.0)
        except Exception:  # a demonstration that fails is the warm start's to report
            continue
        if any(isinstance(parse_action(t), ToolCallAction) for t in turns):
            return None
        shown += 1
    if not shown:
        return None
    return (
        f"{where} offers the tools {names} but none of {shown} warm-start demonstrations calls one "
        "(they only answer): the warm start teaches answering without tools; give a demonstrator whose "
        "turns call them (docs/environments.md#demonstrations-from-your-data)"
    )


_INT_RE = re.compile(r"-?\d+")


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
