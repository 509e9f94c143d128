"""Shared episode logic of the built-in environments, and the tools they share.

All built-ins follow the same loop -- parse the turn with :func:`parse_action`, dispatch a tool
call or grade an answer, pay process rewards with :class:`EpisodeRewards` -- so that the
environments differ only in their tools, prompts and answer checks. Keeping this in one place
means a policy trained on one built-in sees exactly the same protocol on the others.

The shared tools: ``calc`` uses its own tiny recursive-descent parser (integers, ``+ - * /``,
parentheses, unary minus; never ``eval``; division must be exact); ``python`` runs the code via
:func:`asyncrl.envs.sandbox.run_python` (``env.sandbox``), its observation the stripped stdout (or
``error: <last line of the traceback>``), at most ``OBSERVATION_CHARS`` characters.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from asyncrl.config import CostConfig, default_of
from asyncrl.envs.base import (
    AnswerAction,
    EpisodeRewards,
    MalformedAction,
    StepResult,
    Tool,
    mentions_number,
    parse_action,
    repeat_final,
)
from asyncrl.envs.sandbox import run_python
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    import random

    from asyncrl.config import EnvConfig, SandboxConfig
    from asyncrl.envs.base import HashSplitTaskSource

S = TypeVar("S")

MAX_ARGS_CHARS = 4000
"""Longest ARGS text accepted by a built-in tool (longer calls are tool errors)."""


MAX_EXPR_CHARS = 120
MAX_ABS_VALUE = 10**15
OBSERVATION_CHARS = 200


# ---------------------------------------------------------------------------------------------
# The safe expression evaluator
# ---------------------------------------------------------------------------------------------
class CalcError(ValueError):
    """An expression the calculator does not accept; the message is the observation."""


_TOKEN_RE = re.compile(r"\s*(?:(\d+)|(\S))")


def _tokenize(expr: str) -> list[str]:
    tokens: list[str] = []
    for m in _TOKEN_RE.finditer(expr):
        num, ch = m.group(1), m.group(2)
        if num is not None:
            if len(num) > 15:
                raise CalcError("number too large")
            tokens.append(num)
        elif ch is not None:
            if ch not in "+-*/()":
                raise CalcError(f"unexpected character {ch!r}; use digits, + - * / and ( )")
            tokens.append(ch)
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := '-' unary | atom ; atom := INT | '(' expr ')'"""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise CalcError("expression ends too early")
        self.pos += 1
        return tok

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = _check(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> int:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value = _check(value * rhs)
            else:
                if rhs == 0:
                    raise CalcError("division by zero")
                if value % rhs:
                    raise CalcError(f"{value}/{rhs} is not a whole number")
                value = value // rhs
        return value

    def unary(self) -> int:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.atom()

    def atom(self) -> int:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise CalcError("missing )")
            return value
        if tok.isdigit():
            return int(tok)
        raise CalcError(f"unexpected {tok!r}")


def _check(value: int) -> int:
    if abs(value) > MAX_ABS_VALUE:
        raise CalcError("result too large")
    return value


def evaluate(expr: str) -> int:
    """Evaluate an integer arithmetic expression safely (no ``eval``); raises :class:`CalcError`."""
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {MAX_EXPR_CHARS} characters")
    if expr.count("(") > 20:
        raise CalcError("too many parentheses")
    tokens = _tokenize(expr)
    if not tokens:
        raise CalcError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr()
    if parser.peek() is not None:
        raise CalcError(f"unexpected {parser.peek()!r}")
    return value


CALC_TOOL = Tool(
    name="calc",
    description="Evaluate integer arithmetic: digits, + - * / and parentheses. Returns the integer.",
    args_schema={
        "type": "string",
        "name": "expression",
        "description": "arithmetic expression",
        "example": "3*4",
    },
)


def run_calc(args: str) -> tuple[bool, str]:
    """The ``calc`` tool: ``(True, the value)`` or ``(False, what is wrong with the expression)``."""
    try:
        return True, str(evaluate(args))
    except CalcError as exc:
        return False, str(exc)


PYTHON_TOOL = Tool(
    name="python",
    description="Run Python 3 code in a sandbox (no network, no files outside its temp dir); returns what it prints.",
    args_schema={"type": "string", "description": "Python source code", "example": "print(6*7)"},
)


async def run_sandboxed(code: str, limits: SandboxConfig) -> tuple[bool, str]:
    """The ``python`` tool: ``(ok, stdout or the error)`` of :func:`run_python`, in at most
    ``OBSERVATION_CHARS`` characters."""
    result = await run_python(code, limits)
    return result.ok, result.summary(OBSERVATION_CHARS).removeprefix("error: ")


class EnvOptionsError(UserError, ValueError):
    """Unknown or invalid ``env.options`` for a built-in environment (a user mistake)."""


def env_section(cfg: EnvConfig, section: S | None) -> S:
    """``section``, the ``env.<kind>`` section of a kind configured there (``env.options`` must be empty)."""
    if cfg.options:
        raise EnvOptionsError(f"env.options for {cfg.kind!r} must be empty: use the env.{cfg.kind} section")
    assert section is not None  # EnvConfig's validator requires it for this kind
    return section


def refuse_unknown_options(kind: str, options: Mapping[str, object], allowed: tuple[str, ...]) -> None:
    """Raise :class:`EnvOptionsError` naming any key of ``options`` not in ``allowed``, and those."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise EnvOptionsError(f"env.options for {kind!r}: unknown {unknown}; allowed: {list(allowed)}")


class VerifierCache:
    """Caches the scores (a verdict is a score of 1.0 or 0.0) of deterministic verifiers by
    (environment, task id, answer).

    Its size is ``cost.reward_cache_entries`` (each rollout worker sets it). A cost lever: the 8 samples of a group often give the same answer, and the same task returns
    across epochs; a deterministic grader need not run twice. Hit rate and time spent grading are
    reported in the cost ledger (``cost/reward_cache_hit_rate``, ``cost/reward_seconds``).
    """

    def __init__(self, max_entries: int = default_of(CostConfig, "reward_cache_entries")) -> None:
        from collections import OrderedDict

        self.enabled = True
        self.max_entries = max_entries
        self._verdicts: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self.hits = self.misses = 0
        self.seconds = 0.0

    def verdict(self, key: tuple[str, str, str], grade: Callable[[], object]) -> bool:
        """Whether ``grade()`` (a yes/no verifier) accepts the answer; cached."""
        return self.score(key, lambda: 1.0 if grade() else 0.0) >= 1.0

    def score(self, key: tuple[str, str, str], grade: Callable[[], float]) -> float:
        """``grade()``'s score of the answer; cached."""
        if self.enabled and key in self._verdicts:
            self.hits += 1
            self._verdicts.move_to_end(key)
            return self._verdicts[key]
        t0 = time.perf_counter()
        result = float(grade())
        self.seconds += time.perf_counter() - t0
        self.misses += 1
        if self.enabled:
            self._verdicts[key] = result
            if len(self._verdicts) > self.max_entries:
                self._verdicts.popitem(last=False)
        return result


VERIFIER_CACHE = VerifierCache()
"""Process-wide: one per rollout worker."""


class ToolEnv(ABC):
    """Base of the built-in environments (async).

    Subclasses set :attr:`tools`, and implement :meth:`run_tool` (and, where the defaults do not
    fit, :meth:`prompt`, :meth:`is_correct` and :meth:`result_used`). One instance runs one episode at a time.
    Stepping after the episode ended returns the same final result again (reward and outcome
    unchanged, no process reward), so a retried final step is harmless.
    """

    kind: ClassVar[str] = ""
    tools: list[Tool]

    def __init__(self) -> None:
        self.task: Task | None = None
        self.rewards = EpisodeRewards()
        self._final: StepResult | None = None

    # -- construction conventions (also used by plugins, see registry.py) ----------------------
    @classmethod
    def from_config(cls, cfg: EnvConfig) -> Self:
        """The environment of ``cfg``: the class called with ``env.options`` (a kind with a section reads it)."""
        return cls(**cfg.options)

    @classmethod
    @abstractmethod
    def make_task_source(cls, cfg: EnvConfig) -> HashSplitTaskSource:
        """The task source matching this environment and config."""

    @staticmethod
    @abstractmethod
    def solve(task: Task) -> list[str]:
        """Model-turn texts of a perfect episode."""

    @staticmethod
    @abstractmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        """A demonstration that, with probability ``corruption_rate``, contains one mistake."""

    # -- to implement ---------------------------------------------------------------------------
    def prompt(self, task: Task) -> str:
        """The first observation: the task's ``prompt``, unless an environment says more."""
        return str(task.payload["prompt"])

    @abstractmethod
    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        """Run a tool; ``(True, result)`` or ``(False, error message)``."""

    def is_correct(self, answer: str) -> bool:
        """Grade the final answer against ``self.task``: by default, equal to its ``answer``."""
        assert self.task is not None
        return answer.strip() == str(self.task.payload["answer"])

    partial_credit: bool = False
    """The outcome reward is :meth:`score` itself, not 1 for a full score and 0 otherwise."""

    def score(self, answer: str) -> float:
        """The answer's score in [0, 1]; a full score is a success. ``is_correct`` as 1 or 0 by default."""
        return 1.0 if self.is_correct(answer) else 0.0

    def result_used(self, text: str, result: str) -> bool:
        """Whether ``text`` (later args or the answer) uses an earlier tool ``result``: by default,
        whether the integer ``result`` appears in it as a whole number."""
        return mentions_number(text, result)

    def resolve(self, text: str, *, answer: bool) -> str:
        """The tool arguments (or, with ``answer``, the answer) with any reference the
        environment defines replaced by what it names; identity by default. Applied before the
        call, the grading, the verifier cache and the process rewards, so all of them see the
        same resolved text (``strings`` with ``reference: true`` resolves ``_``)."""
        return text

    # -- the protocol ---------------------------------------------------------------------------
    async def reset(self, task: Task) -> str:
        self.task = task
        self.rewards = EpisodeRewards()
        self._final = None
        return self.prompt(task)

    async def step(self, model_text: str) -> StepResult:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._final is not None:
            return repeat_final(self._final)
        action = parse_action(model_text)
        if isinstance(action, MalformedAction):
            return self.rewards.malformed(action.reason)
        if isinstance(action, AnswerAction):
            answer = self.resolve(action.answer, answer=True)
            score = VERIFIER_CACHE.score(
                (type(self).__name__, self.task.id, answer.strip()), lambda: self.score(answer)
            )
            correct = score >= 1.0
            reward, parts = self.rewards.answer(answer, self.result_used)
            self._final = StepResult(
                observation="correct" if correct else "incorrect",
                process_reward=reward,
                done=True,
                reward=score if self.partial_credit else float(correct),
                outcome="success" if correct else "failure",
                info={"action": "answer", "answer": answer, "reward_parts": parts},
            )
            return self._final
        names = [t.name for t in self.tools]
        if action.name not in names:
            return self.rewards.malformed(f"unknown tool {action.name!r}; tools: {', '.join(names)}")
        started = time.monotonic()
        args = action.args
        if len(args) > MAX_ARGS_CHARS:
            ok, text = False, f"arguments longer than {MAX_ARGS_CHARS} characters"
        else:
            args = self.resolve(args, answer=False)
            ok, text = await self.run_tool(action.name, args)
        return self.rewards.tool_step(action.name, args, ok, text, started, self.result_used)

    async def close(self) -> None:  # noqa: B027 - optional hook, not abstract
        """Nothing to release by default."""


class ChainToolEnv(ToolEnv):
    """A built-in with one tool of two comma-separated arguments, ``NAME(A, B)``, whose result is
    fed into the next call (``kb_lookup``: ``lookup(ENTITY, RELATION)``, ``strings``:
    ``apply(OPERATION, TEXT)``). One argument is a keyword (a relation, an operation: never a
    comma); the other, :attr:`chained`, carries the previous result and may contain commas, so the
    call is split at the comma next to the keyword. The prompt is the task's; an answer is correct,
    and a later text *uses* a result, when :meth:`same` says the texts agree."""

    tool_name: ClassVar[str]
    usage: ClassVar[str]
    """The call's form, shown in the tool's description and its usage error."""
    chained: ClassVar[int]
    """Which argument (0 or 1) carries the previous result."""

    def __init__(self, description: str, arg: tuple[str, str], example: str, **schema: Any) -> None:
        """``arg``: the argument's name and description in the tool's schema; ``schema``: more of it."""
        super().__init__()
        self.tools = [
            Tool(
                name=self.tool_name,
                description=f"{self.usage} -> {description}",
                args_schema={
                    "type": "string",
                    "name": arg[0],
                    "description": arg[1],
                    **schema,
                    "example": example,
                },
            )
        ]

    def split(self, args: str) -> tuple[str, str]:
        """The two arguments, whitespace-trimmed (the caller checked there is a comma)."""
        a, b = args.split(",", 1) if self.chained == 1 else args.rsplit(",", 1)
        return a.strip(), b.strip()

    async def run_tool(self, name: str, args: str) -> tuple[bool, str]:
        if "," not in args:
            return False, f"use {self.usage}"
        return self.call(*self.split(args))

    @abstractmethod
    def call(self, first: str, second: str) -> tuple[bool, str]:
        """The tool on its two arguments; ``(True, result)`` or ``(False, error message)``."""

    @abstractmethod
    def same(self, text: str, value: str) -> bool:
        """Whether the model's ``text`` names ``value`` (the answer, an earlier result)."""

    def is_correct(self, answer: str) -> bool:
        assert self.task is not None
        return self.same(answer, str(self.task.payload["answer"]))

    def result_used(self, text: str, result: str) -> bool:
        arg = self.split(text)[self.chained] if "," in text else text
        return self.same(arg, result)
