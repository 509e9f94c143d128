"""``python``: small computation questions answered by running code in a sandbox.

The model calls ``<tool>python(CODE)</tool>``; CODE (the raw text between the first ``(`` and
the last ``)``, so nested parentheses and newlines are fine) runs via
:func:`asyncrl.envs.sandbox.run_python` and the observation is its stripped stdout (or
``error: <last line of the traceback>``), at most 200 characters. An example is in
docs/environments.md (``python``).

Reference code is always ONE line (statements joined by ``;``), which keeps episodes short.
Difficulty is the tier of the question (1: one expression, 2: a filtered count/sum, 3: a loop
or search). Answers are computed in-process by the task source (never by running model code),
so grading does not depend on the sandbox.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncrl.config import SandboxConfig
from asyncrl.envs.base import HashSplitTaskSource, task_id
from asyncrl.envs.toolenv import PYTHON_TOOL, EnvOptionsError, ToolEnv, run_sandboxed
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = ["PythonEnv", "PythonTasks", "py_demonstrate", "py_solve"]


def _is_prime(k: int) -> bool:
    return k >= 2 and all(k % d for d in range(2, math.isqrt(k) + 1))


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


@dataclass(frozen=True)
class _Template:
    name: str
    tier: int
    question: str
    code: str
    answer: Callable[..., int]
    params: Callable[[random.Random], dict[str, int]]


TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "sum_squares", 1, "What is the sum of the squares of 1..{n}?",
        "print(sum(i*i for i in range(1, {n1})))",
        lambda n, n1: sum(i * i for i in range(1, n1)),
        lambda r: {"n": (n := r.randint(3, 99)), "n1": n + 1},
    ),
    _Template(
        "sum_cubes", 1, "What is the sum of the cubes of 1..{n}?",
        "print(sum(i**3 for i in range(1, {n1})))",
        lambda n, n1: sum(i**3 for i in range(1, n1)),
        lambda r: {"n": (n := r.randint(3, 60)), "n1": n + 1},
    ),
    _Template(
        "power", 1, "What is {a} to the power {b}?",
        "print({a}**{b})",
        lambda a, b: a**b,
        lambda r: {"a": r.randint(2, 9), "b": r.randint(5, 25)},
    ),
    _Template(
        "count_div", 2, "How many numbers in 1..{n} are divisible by {a} or {b}?",
        "print(sum(1 for i in range(1, {n1}) if i % {a} == 0 or i % {b} == 0))",
        lambda n, n1, a, b: sum(1 for i in range(1, n1) if i % a == 0 or i % b == 0),
        lambda r: {"n": (n := r.randint(50, 500)), "n1": n + 1, "a": (a := r.randint(2, 9)),
                   "b": r.choice([x for x in range(2, 12) if x != a])},
    ),
    _Template(
        "digit_sum", 2, "What is the sum of the digits of {a}**{b}?",
        "print(sum(int(c) for c in str({a}**{b})))",
        lambda a, b: sum(int(c) for c in str(a**b)),
        lambda r: {"a": r.randint(2, 9), "b": r.randint(10, 60)},
    ),
    _Template(
        "count_primes", 2, "How many primes are below {n}?",
        "print(sum(1 for k in range(2, {n}) if all(k % d for d in range(2, k))))",
        lambda n: sum(1 for k in range(2, n) if _is_prime(k)),
        lambda r: {"n": r.randint(20, 400)},
    ),
    _Template(
        "fib_mod", 3, "What is Fibonacci number {n} mod {m}? (F1=F2=1)",
        "f = [0, 1]; [f.append(f[-1] + f[-2]) for _ in range({n})]; print(f[{n}] % {m})",
        lambda n, m: _fib(n) % m,
        lambda r: {"n": r.randint(20, 200), "m": r.choice([97, 100, 101, 1000, 997])},
    ),
    _Template(
        "largest_prime", 3, "What is the largest prime below {n}?",
        "print(max(k for k in range(2, {n}) if all(k % d for d in range(2, k))))",
        lambda n: max(k for k in range(2, n) if _is_prime(k)),
        lambda r: {"n": r.randint(30, 2000)},
    ),
    _Template(
        "sum_primes", 3, "What is the sum of the primes below {n}?",
        "print(sum(k for k in range(2, {n}) if all(k % d for d in range(2, k))))",
        lambda n: sum(k for k in range(2, n) if _is_prime(k)),
        lambda r: {"n": r.randint(20, 400)},
    ),
)  # fmt: skip
_BY_NAME = {t.name: t for t in TEMPLATES}
SUFFIX = " Use python, print the result."


class PythonTasks(HashSplitTaskSource):
    """Computation questions; difficulty = template tier. Split by (template, parameters), the
    symmetric parameters of ``count_div`` canonical (:meth:`content_key`)."""

    task_types = tuple(t.name for t in TEMPLATES)
    difficulties = (1, 2, 3)
    salt = "python"

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        tpl = rng.choice([t for t in TEMPLATES if t.tier == difficulty])
        params = tpl.params(rng)
        key = tpl.name + "|" + ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        payload = {
            "prompt": tpl.question.format(**params) + SUFFIX,
            "template": tpl.name,
            "params": params,
            "answer": str(tpl.answer(**params)),
        }
        return Task(id=task_id("py", key), task_type=tpl.name, difficulty=difficulty, payload=payload)

    def content_key(self, task: Task) -> str:
        """Template and parameters, the symmetric ones canonical: "divisible by {a} or {b}" keys
        on its divisors without order and without one the other divides (``2 or 4`` is ``2``)."""
        p = task.payload
        params = dict(p["params"])
        if p["template"] == "count_div":
            a, b = sorted((int(params.pop("a")), int(params.pop("b"))))
            params["div"] = f"{a}" if b % a == 0 else f"{a}.{b}"
        return str(p["template"]) + "|" + ",".join(f"{k}={v}" for k, v in sorted(params.items()))


def _code(task: Task, **override: int) -> str:
    tpl = _BY_NAME[task.payload["template"]]
    return str(tpl.code).format(**{**task.payload["params"], **override})


def py_solve(task: Task) -> list[str]:
    """One python call with the template's reference code, then the answer."""
    return [f"<tool>python({_code(task)})</tool>", f"<answer>{task.payload['answer']}</answer>"]


def py_demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
    """Reference episode, or with probability ``corruption_rate`` one mistake: an off-by-one
    range/operand in the code (answering what that code prints), a skipped call (a guessed
    answer), or a wrong final copy (the printed result off by one)."""
    if rng.random() >= corruption_rate:
        return py_solve(task)
    answer = int(task.payload["answer"])
    kind = rng.choice(("wrong_operand", "skipped_call", "wrong_final_copy"))
    if kind == "wrong_operand":
        tpl = _BY_NAME[task.payload["template"]]
        params = dict(task.payload["params"])
        name = rng.choice(sorted(k for k in params if k not in ("n1", "m")))
        params[name] = params[name] + rng.choice((-1, 1))
        if "n1" in params and name == "n":
            params["n1"] = params["n"] + 1
        with_bad = tpl.code.format(**params)
        try:
            wrong = tpl.answer(**params)
        except ValueError:  # e.g. no prime below the perturbed bound
            wrong = answer + 1
        if with_bad != _code(task):
            return [f"<tool>python({with_bad})</tool>", f"<answer>{wrong}</answer>"]
        kind = "wrong_final_copy"
    if kind == "skipped_call":
        return [f"<answer>{answer + rng.choice((-10, -2, -1, 1, 2, 10))}</answer>"]
    return [f"<tool>python({_code(task)})</tool>", f"<answer>{answer + rng.choice((-1, 1))}</answer>"]


class PythonEnv(ToolEnv):
    """Computation questions with a sandboxed ``python(CODE)`` tool; see the module docstring.

    It takes no ``env.options``: the sandbox limits are the ``env.sandbox`` config section
    (:class:`~asyncrl.config.SandboxConfig`; unset ``limits``: its defaults).
    """

    kind = "python"

    def __init__(self, limits: SandboxConfig | None = None) -> None:
        super().__init__()
        self.limits = limits if limits is not None else SandboxConfig()
        self.tools = [PYTHON_TOOL]

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> PythonEnv:
        if cfg.options:
            moved = sorted(set(cfg.options) & set(SandboxConfig.model_fields))
            hint = f"; sandbox limits are env.sandbox fields, e.g. env.sandbox.{moved[0]}" if moved else ""
            raise EnvOptionsError(f"env.options for 'python': it takes none, got {sorted(cfg.options)}{hint}")
        return cls(cfg.sandbox)

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> PythonTasks:
        return PythonTasks.from_config(cfg)

    solve = staticmethod(py_solve)
    demonstrate = staticmethod(py_demonstrate)

    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        return await run_sandboxed(args, self.limits)
