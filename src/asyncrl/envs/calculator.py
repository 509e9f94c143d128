"""``calculator``: multi-step arithmetic word problems solved with a ``calc`` tool.

Examples and the learnability property are in docs/environments.md (``calculator``). The
generator guarantees it: the numbers appear in the order they are used, step 1 combines the
first two (``n0 op1 n1``), every later step the previous result with the next (``r_{k-1} op_k
n_k``), each sentence's verb fixes its operator, operands are 1..20 (later multipliers 2..5) and
every intermediate result is a non-negative integer below 1000.

The ``calc`` tool is :mod:`asyncrl.envs.toolenv`' (shared with the answer environments).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from asyncrl.envs.base import HashSplitTaskSource, task_id
from asyncrl.envs.toolenv import CALC_TOOL, EnvOptionsError, ToolEnv, run_calc
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["CalculatorEnv", "CalculatorTasks", "calc_demonstrate", "calc_solve"]


# ---------------------------------------------------------------------------------------------
# Task generation
# ---------------------------------------------------------------------------------------------
NAMES: tuple[tuple[str, str], ...] = (
    ("Ann", "she"), ("Bob", "he"), ("Cid", "he"), ("Dee", "she"), ("Eve", "she"), ("Fay", "she"),
    ("Gus", "he"), ("Hal", "he"), ("Ivy", "she"), ("Jon", "he"), ("Kim", "she"), ("Lea", "she"),
    ("Max", "he"), ("Ned", "he"), ("Pam", "she"), ("Ray", "he"), ("Sue", "she"), ("Tom", "he"),
)  # fmt: skip
OBJECTS: tuple[str, ...] = (
    "pens",
    "apples",
    "cards",
    "coins",
    "books",
    "eggs",
    "shells",
    "stamps",
    "cups",
    "rocks",
)
_FIRST: dict[str, tuple[str, ...]] = {
    "+": ("{N} has {a} {o}. {P} gets {b} more.", "{N} has {a} {o}. {P} buys {b} more."),
    "-": ("{N} has {a} {o}. {P} gives away {b}.", "{N} has {a} {o}. {P} loses {b}."),
    "*": ("{N} has {a} bags of {b} {o}.",),
}
_NEXT: dict[str, tuple[str, ...]] = {
    "+": ("{P} gets {n} more.", "{P} buys {n} more.", "{P} finds {n} more."),
    "-": ("{P} gives away {n}.", "{P} loses {n}.", "{P} sells {n}."),
    "*": ("Then {p} has {n} times as many.",),
}
LIMIT = 1000


def _apply(r: int, op: str, n: int) -> int:
    return r + n if op == "+" else r - n if op == "-" else r * n


class CalculatorTasks(HashSplitTaskSource):
    """Arithmetic word problems; difficulty = number of steps = number of ``calc`` calls.

    The held-out split is decided by the arithmetic up to its algebra (:func:`canonical_chain`),
    not by the story, so a held-out problem never reappears in training with other names, nor as
    ``b+a`` for a held-out ``a+b``, nor with its steps reordered (``12-5+7`` for ``12+7-5``).
    """

    task_types = ("arithmetic",)
    difficulties = (1, 2, 3, 4, 5)
    salt = "calculator"
    heldout_permille = 200
    """20 %: difficulty 1 has 479 distinct problems (697 spellings), so 10 % would hold out ~47,
    fewer than the 64 that ``configs/smollm2_arithmetic.yaml`` evaluates on; 20 % holds out 95."""

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        name, pron = rng.choice(NAMES)
        obj = rng.choice(OBJECTS)
        op = rng.choice("+-*")
        if op == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 12)
        elif op == "-":
            a = rng.randint(2, 20)
            b = rng.randint(1, a)
        else:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
        steps: list[tuple[str, int]] = [(op, b)]
        fmt = {"N": name, "P": pron.capitalize(), "p": pron, "o": obj, "a": a, "b": b}
        sentences = [rng.choice(_FIRST[op]).format(**fmt)]
        r = _apply(a, op, b)
        for _ in range(difficulty - 1):
            options = ["+"] if r + 20 < LIMIT else []
            if r >= 1:
                options.append("-")
            if r > 0 and r * 2 < LIMIT:
                options.append("*")
            op = rng.choice(options)
            if op == "+":
                n = rng.randint(1, 20)
            elif op == "-":
                n = rng.randint(1, min(20, r))
            else:
                n = rng.randint(2, min(5, (LIMIT - 1) // r))
            steps.append((op, n))
            sentences.append(rng.choice(_NEXT[op]).format(n=n, **{k: v for k, v in fmt.items() if k != "n"}))
            r = _apply(r, op, n)
        sentences.append(f"How many {obj}?")
        key = f"{a}" + "".join(f"{o}{n}" for o, n in steps)
        payload = {
            "prompt": " ".join(sentences),
            "start": a,
            "steps": [[o, n] for o, n in steps],
            "answer": str(r),
        }
        return Task(id=task_id("calc", key), task_type="arithmetic", difficulty=difficulty, payload=payload)

    def content_key(self, task: Task) -> str:
        """The chain's numbers and its expression as a polynomial in them (:func:`canonical_chain`)."""
        p = task.payload
        return canonical_chain(int(p["start"]), [(str(o), int(n)) for o, n in p["steps"]])


def canonical_chain(start: int, steps: list[tuple[str, int]]) -> str:
    """What makes two chains one problem: the same numbers, and the same polynomial in them.

    The chain ``((start op1 n1) op2 n2) ...`` is expanded with each number as a variable named by
    its value (``3*4`` is the monomial ``3*4``, ``(2+3)*4`` is ``2*4 + 3*4``), and the key is the
    sorted numbers with the sorted monomials and their coefficients. So every rewriting by
    commutativity, associativity and distributivity is one problem: ``7+12`` / ``12+7``,
    ``3*4`` / ``4*3``, ``12+7-5`` / ``12-5+7``, ``(2+3)*4*5`` / ``(3+2)*5*4``, and even
    ``(13+3-3)*2`` / ``13*2+3-3``; while ``2+2`` / ``2*2`` (other operations) and ``12+5-5`` /
    ``12+3-3`` (other numbers) stay apart."""
    poly: dict[tuple[int, ...], int] = {(start,): 1}
    for op, n in steps:
        if op == "*":
            poly = {tuple(sorted((*mono, n))): c for mono, c in poly.items()}
        else:
            poly[(n,)] = poly.get((n,), 0) + (1 if op == "+" else -1)
    numbers = ",".join(str(v) for v in sorted([start, *(n for _, n in steps)]))
    terms = "".join(f"{c:+d}*" + "*".join(map(str, mono)) for mono, c in sorted(poly.items()) if c)
    return f"{numbers}|{terms}"


# ---------------------------------------------------------------------------------------------
# Reference solver
# ---------------------------------------------------------------------------------------------
def _chain(task: Task) -> list[tuple[int, str, int, int]]:
    """(lhs, op, rhs, result) of each step."""
    r = int(task.payload["start"])
    out = []
    for op, n in task.payload["steps"]:
        res = _apply(r, op, int(n))
        out.append((r, op, int(n), res))
        r = res
    return out


def calc_solve(task: Task) -> list[str]:
    """``calc(<previous result><op><next number>)`` per step, then the answer."""
    chain = _chain(task)
    texts = [f"<tool>calc({lhs}{op}{rhs})</tool>" for lhs, op, rhs, _ in chain]
    return [*texts, f"<answer>{chain[-1][3]}</answer>"]


def calc_demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
    """The reference episode, or (with probability ``corruption_rate``) one with ONE mistake.

    Mistakes a plausible weak agent makes: a wrong operand in one call (later calls then chain
    on the wrong result), a skipped call (that number is ignored), or a wrong final copy (the
    answer is not the last tool result). A corrupted demonstration always differs from
    :func:`calc_solve`'s.
    """
    if rng.random() >= corruption_rate:
        return calc_solve(task)
    steps = [(op, int(n)) for op, n in task.payload["steps"]]
    kind = rng.choice(("wrong_operand", "skipped_call", "wrong_final_copy"))
    texts: list[str] = []
    r = int(task.payload["start"])
    if kind == "wrong_final_copy":
        chain = _chain(task)
        final = chain[-1][3]
        wrong = chain[-2][3] if len(chain) > 1 and chain[-2][3] != final else final + rng.choice((-1, 1))
        return [*calc_solve(task)[:-1], f"<answer>{wrong}</answer>"]
    k = rng.randrange(len(steps))
    if kind == "skipped_call" and len(steps) == 1:
        return [f"<answer>{r}</answer>"]  # answered without calling the tool at all
    if kind == "skipped_call" and k == 0:
        k = 1
    for i, (op, n) in enumerate(steps):
        if i == k and kind == "skipped_call":
            continue
        if i == k:
            n = max(1, n + rng.choice((-2, -1, 1, 2))) if n > 1 else n + rng.choice((1, 2))
        texts.append(f"<tool>calc({r}{op}{n})</tool>")
        r = _apply(r, op, n)
    return [*texts, f"<answer>{r}</answer>"]


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
class CalculatorEnv(ToolEnv):
    """Arithmetic word problems with a ``calc(EXPR)`` tool; see the module docstring."""

    kind = "calculator"

    def __init__(self) -> None:
        super().__init__()
        self.tools = [CALC_TOOL]

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> CalculatorTasks:
        if cfg.options:
            raise EnvOptionsError(f"env.options for 'calculator' must be empty, got {sorted(cfg.options)}")
        return CalculatorTasks.from_config(cfg)

    solve = staticmethod(calc_solve)
    demonstrate = staticmethod(calc_demonstrate)

    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        return run_calc(args)
