"""The tools the built-in kinds share: ``calc`` (integer arithmetic) and ``python`` (code in the sandbox).

The ``calc`` tool uses its own tiny recursive-descent parser (integers, ``+ - * /``, parentheses,
unary minus); it never calls ``eval``. Division must be exact. The ``python`` tool runs the code via
:func:`asyncrl.envs.sandbox.run_python` (``env.sandbox``); its observation is the stripped stdout (or
``error: <last line of the traceback>``), at most ``OBSERVATION_CHARS`` characters.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from asyncrl.envs.base import Tool
from asyncrl.envs.sandbox import run_python

if TYPE_CHECKING:
    from asyncrl.config import SandboxConfig

__all__ = ["CALC_TOOL", "PYTHON_TOOL", "CalcError", "evaluate", "run_calc", "run_sandboxed"]

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
