"""``strings``: a pipeline of string operations, each applied with the ``apply`` tool.

A task names a made-up word and a pipeline of ``difficulty`` operations (1-3); the agent applies
them in order, one tool call each, feeding every result into the next call, then answers with
the last result. The operations are deterministic and cheap, so a tree group's replays are exact
and a wrong step is a clean, attributable mistake (what segment credit should find).

Tool syntax: ``apply(OPERATION, TEXT)`` -- the text before the FIRST comma is the operation,
after it the text (whitespace-trimmed). Operations: see :data:`OPERATIONS`.

Example (difficulty 3)::

    prompt : Apply reverse, then upper, then drop_vowels to "kolabe".
    model  : <tool>apply(reverse, kolabe)</tool>       -> ebalok
    model  : <tool>apply(upper, ebalok)</tool>         -> EBALOK
    model  : <tool>apply(drop_vowels, EBALOK)</tool>   -> BLK
    model  : <answer>BLK</answer>                      -> correct, reward 1.0
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import HashSplitTaskSource, task_id
from asyncrl.envs.toolenv import ChainToolEnv
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["OPERATIONS", "StringTasks", "StringsEnv", "strings_demonstrate", "strings_solve"]

OPERATIONS: dict[str, Callable[[str], str]] = {
    "reverse": lambda s: s[::-1],
    "upper": str.upper,
    "lower": str.lower,
    "drop_vowels": lambda s: "".join(c for c in s if c.lower() not in "aeiou"),
    "double": lambda s: "".join(c + c for c in s),
    "rotate": lambda s: s[1:] + s[:1],
    "sort": lambda s: "".join(sorted(s)),
}

_SYLLABLES = ("ka", "lo", "be", "mi", "tu", "ra", "sen", "vo", "di", "pel", "zu", "no", "gri", "fa")


def run_pipeline(word: str, ops: list[str]) -> list[str]:
    """Every intermediate result of applying ``ops`` to ``word`` in order."""
    out, cur = [], word
    for op in ops:
        cur = OPERATIONS[op](cur)
        out.append(cur)
    return out


class StringTasks(HashSplitTaskSource):
    """Pipelines of 1-3 distinct operations on a made-up word; split by (word, pipeline)."""

    task_types = ("pipeline",)
    difficulties = (1, 2, 3)
    salt = "strings"

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        ops = rng.sample(sorted(OPERATIONS), difficulty)
        path = run_pipeline(word, ops)
        if len(set(path)) < len(path) or path[-1] == word:  # a no-op step: draw again
            return self.generate(rng, difficulty)
        prompt = f'Apply {", then ".join(ops)} to "{word}".'
        payload: dict[str, Any] = {
            "prompt": prompt,
            "word": word,
            "ops": ops,
            "path": path,
            "answer": path[-1],
        }
        return Task(
            id=task_id("str", f"{word}|{'.'.join(ops)}"),
            task_type="pipeline",
            difficulty=difficulty,
            payload=payload,
        )

    def content_key(self, task: Task) -> str:
        return f"{task.payload['word']}|{'.'.join(task.payload['ops'])}"


def strings_solve(task: Task) -> list[str]:
    """One ``apply`` per operation, each on the previous result, then the answer."""
    cur, texts = task.payload["word"], []
    for op, nxt in zip(task.payload["ops"], task.payload["path"], strict=True):
        texts.append(f"<tool>apply({op}, {cur})</tool>")
        cur = nxt
    return [*texts, f"<answer>{cur}</answer>"]


def strings_demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
    """Reference episode, or with probability ``corruption_rate`` one mistake: a wrong operation
    in one step (carried on to the end), a skipped last step, or the input word as the answer."""
    if rng.random() >= corruption_rate:
        return strings_solve(task)
    ops, word = list(task.payload["ops"]), task.payload["word"]
    kind = rng.choice(("wrong_operation", "skipped_call", "wrong_final_copy"))
    if kind == "skipped_call":
        prev = task.payload["path"][-2] if len(ops) > 1 else word
        return [*strings_solve(task)[:-2], f"<answer>{prev}</answer>"]
    if kind == "wrong_final_copy":
        return [*strings_solve(task)[:-1], f"<answer>{word}</answer>"]
    k = rng.randrange(len(ops))
    ops[k] = rng.choice([o for o in OPERATIONS if o not in ops])
    cur, texts = word, []
    for op in ops:
        texts.append(f"<tool>apply({op}, {cur})</tool>")
        cur = OPERATIONS[op](cur)
    return [*texts, f"<answer>{cur}</answer>"]


class StringsEnv(ChainToolEnv):
    """String-operation pipelines applied with one tool; see the module docstring."""

    kind = "strings"
    tool_name, usage, chained = "apply", "apply(OPERATION, TEXT)", 1

    def __init__(self) -> None:
        super().__init__(
            "TEXT with the operation applied. Operations: " + ", ".join(OPERATIONS),
            ("call", "OPERATION, TEXT (split at the first comma)"),
            "reverse, kolabe",
            operations=sorted(OPERATIONS),
        )

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> StringTasks:
        return StringTasks.from_config(cfg)  # type: ignore[return-value]

    solve = staticmethod(strings_solve)
    demonstrate = staticmethod(strings_demonstrate)

    def call(self, op: str, text: str) -> tuple[bool, str]:
        if op not in OPERATIONS:
            return False, f"unknown operation {op[:40]!r}; use one of {', '.join(OPERATIONS)}"
        if not text:
            return False, "empty TEXT"
        return True, OPERATIONS[op](text)

    def same(self, text: str, value: str) -> bool:
        return text.strip().strip('"') == value
