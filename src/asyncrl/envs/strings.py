"""``strings``: a pipeline of string operations, each applied with the ``apply`` tool.

A task names a made-up word and a pipeline of ``difficulty`` operations (1-3); the agent applies
them in order, one tool call each, feeding every result into the next call, then answers with
the last result. Examples, and why the ``reference`` option exists, are in docs/environments.md
(``strings``).

Tool syntax: ``apply(OPERATION, TEXT)`` -- the text before the FIRST comma is the operation,
after it the text (whitespace-trimmed). Operations: see :data:`OPERATIONS`. With
``env.options: {reference: true}`` the text :data:`REFERENCE` (as TEXT or as the whole answer)
stands for the previous result -- the input word before the first call.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import HashSplitTaskSource, task_id
from asyncrl.envs.toolenv import ChainToolEnv, EnvOptionsError, refuse_unknown_options
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["OPERATIONS", "REFERENCE", "StringTasks", "StringsEnv", "strings_demonstrate", "strings_solve"]

OPERATIONS: dict[str, Callable[[str], str]] = {
    "reverse": lambda s: s[::-1],
    "upper": str.upper,
    "lower": str.lower,
    "drop_vowels": lambda s: "".join(c for c in s if c.lower() not in "aeiou"),
    "double": lambda s: "".join(c + c for c in s),
    "rotate": lambda s: s[1:] + s[:1],
    "sort": lambda s: "".join(sorted(s)),
}

REFERENCE = "_"
"""With ``reference: true``, this TEXT (or answer) is the previous result."""

_SYLLABLES = ("ka", "lo", "be", "mi", "tu", "ra", "sen", "vo", "di", "pel", "zu", "no", "gri", "fa")


def run_pipeline(word: str, ops: list[str]) -> list[str]:
    """Every intermediate result of applying ``ops`` to ``word`` in order."""
    return list(itertools.accumulate(ops, lambda cur, op: OPERATIONS[op](cur), initial=word))[1:]


def _reference_option(options: Mapping[str, object]) -> bool:
    refuse_unknown_options("strings", options, ("reference",))
    value = options.get("reference", False)
    if not isinstance(value, bool):
        raise EnvOptionsError(f"env.options.reference for 'strings' must be true or false, got {value!r}")
    return value


class StringTasks(HashSplitTaskSource):
    """Pipelines of 1-3 distinct operations on a made-up word; split by (word, result).
    ``reference`` is recorded in each task, so its demonstrations use ``_`` (module docstring)."""

    task_types = ("pipeline",)
    difficulties = (1, 2, 3)
    salt = "strings"

    def __init__(self, *, reference: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reference = reference

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        ops = rng.sample(sorted(OPERATIONS), difficulty)
        path = run_pipeline(word, ops)
        if len(set(path)) < len(path) or path[-1] == word:  # a no-op step: draw again
            return self.generate(rng, difficulty)
        prompt = f'Apply {", then ".join(ops)} to "{word}".'
        payload = {
            "prompt": prompt,
            "word": word,
            "ops": ops,
            "path": path,
            "answer": path[-1],
            "reference": self.reference,
        }
        return Task(
            id=task_id("str", f"{word}|{'.'.join(ops)}"),
            task_type="pipeline",
            difficulty=difficulty,
            payload=payload,
        )

    def content_key(self, task: Task) -> str:
        """The word and the final result: pipelines that take the same word to the same string
        are one problem -- steps that commute (``reverse, upper`` / ``upper, reverse``), a step a
        later one undoes (``rotate, sort`` / ``sort``; ``lower`` on the lowercase word), and the
        rare pipelines that agree on this word by coincidence (held out together: stricter)."""
        return f"{task.payload['word']}|{task.payload['answer']}"


def _episode(word: str, ops: list[str], reference: bool) -> list[str]:
    """The model turns applying ``ops`` in order to ``word``, then answering the last result."""
    cur, texts = word, []
    for op in ops:
        texts.append(f"<tool>apply({op}, {REFERENCE if reference else cur})</tool>")
        cur = OPERATIONS[op](cur)
    return [*texts, f"<answer>{REFERENCE if reference else cur}</answer>"]


def strings_solve(task: Task) -> list[str]:
    """One ``apply`` per operation, each on the previous result, then the answer."""
    p = task.payload
    return _episode(p["word"], list(p["ops"]), bool(p.get("reference", False)))


def strings_demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
    """Reference episode, or with probability ``corruption_rate`` one mistake that changes the
    answer: a wrong operation in one step (carried on to the end), a skipped last step, or a
    wrong answer -- by value the input word copied as the answer, by reference (where no string
    is copied) two neighbouring operations applied in the wrong order. A mistake that happens to
    give the right answer (commuting operations) is drawn again, so the rate is the rate of
    failing demonstrations."""
    if rng.random() >= corruption_rate:
        return strings_solve(task)
    p = task.payload
    word, answer, reference = p["word"], p["answer"], bool(p.get("reference", False))
    texts: list[str] = []
    for _ in range(20):
        ops = list(p["ops"])
        kind = rng.choice(("wrong_operation", "skipped_call", "wrong_final"))
        if kind == "wrong_final" and not reference:
            return [*strings_solve(task)[:-1], f"<answer>{word}</answer>"]
        if kind == "skipped_call":
            ops = ops[:-1]
        elif kind == "wrong_final" and len(ops) > 1:
            k = rng.randrange(len(ops) - 1)
            ops[k], ops[k + 1] = ops[k + 1], ops[k]
        else:
            ops[rng.randrange(len(ops))] = rng.choice([o for o in OPERATIONS if o not in ops])
        texts = _episode(word, ops, reference)
        if (run_pipeline(word, ops) or [word])[-1] != answer:
            break
    return texts


class StringsEnv(ChainToolEnv):
    """String-operation pipelines applied with one tool; see the module docstring."""

    kind = "strings"
    tool_name, usage, chained = "apply", "apply(OPERATION, TEXT)", 1

    def __init__(self, *, reference: bool = False) -> None:
        by_reference = f" TEXT {REFERENCE} is the previous result (the input word at first)."
        super().__init__(
            "TEXT with the operation applied. Operations: "
            + ", ".join(OPERATIONS)
            + ("." + by_reference if reference else ""),
            ("call", "OPERATION, TEXT (split at the first comma)"),
            f"reverse, {REFERENCE}" if reference else "reverse, kolabe",
            operations=sorted(OPERATIONS),
        )
        self.reference = reference
        self.current = ""
        """The previous result (the input word before the first call): what ``_`` names."""

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> StringsEnv:
        return cls(reference=_reference_option(cfg.options))

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> StringTasks:
        return StringTasks.from_config(cfg, reference=_reference_option(cfg.options))

    async def reset(self, task: Task) -> str:
        self.current = str(task.payload["word"])
        return await super().reset(task)

    def resolve(self, text: str, *, answer: bool) -> str:
        if not self.reference:
            return text
        if answer:
            return self.current if text.strip() == REFERENCE else text
        if "," in text:
            op, arg = self.split(text)
            if arg == REFERENCE:
                return f"{op}, {self.current}"
        return text

    solve = staticmethod(strings_solve)
    demonstrate = staticmethod(strings_demonstrate)

    def call(self, op: str, text: str) -> tuple[bool, str]:
        if op not in OPERATIONS:
            return False, f"unknown operation {op[:40]!r}; use one of {', '.join(OPERATIONS)}"
        if not text:
            return False, "empty TEXT"
        self.current = OPERATIONS[op](text)
        return True, self.current

    def same(self, text: str, value: str) -> bool:
        return text.strip().strip('"') == value
