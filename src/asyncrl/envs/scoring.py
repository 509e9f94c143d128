"""Answer scorers for the answer environments (``reasoning_gym``, ``dataset``) and their hygiene.

A scorer is ``score(answer, gold) -> float`` in [0, 1] (for ``reasoning_gym`` the dataset's own
``score_answer(answer, entry)``). Three rules keep a scorer from teaching the policy the wrong thing,
without any hard-coded list of bad datasets:

* **A scorer that raises is a failed answer** (score 0), never a crashed episode; each one is
  counted in :data:`~asyncrl.envs.wrappers.GUARD_STATS` (the rollout worker reports it as
  ``guard/scorer_errors``), and so is a score that is not a finite number.
* **A scorer that gives full credit to a wrong answer is refused** when the environment is built:
  :func:`refuse_lenient_scorer` scores deliberately wrong answers (empty, nonsense, the reference
  with one mistake) on a few tasks and raises :class:`ScorerRefused` naming the first
  one credited in full. It also refuses a scorer that does not give its own reference answer full
  credit (no success could ever be recognised).
* **Answers are normalised as the scorer expects**: surrounding whitespace is stripped by
  :func:`~asyncrl.envs.base.parse_action` before any scorer sees the answer (reasoning-gym's
  substring scorers give ``" 61 "`` 0.5 where ``"61"`` gets 1.0).

Built-in scorers for ``dataset``: ``exact`` (case- and whitespace-insensitive string equality),
``numeric`` (numbers equal within ``tolerance``, absolute or relative) and ``math`` (expression
equivalence by Hugging Face's ``math-verify``, which parses LaTeX and plain expressions with its
own grammar and compares them symbolically with sympy -- no ``eval`` of model text). A
``module:function`` scorer is imported like a plugin environment.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.envs.base import normalize
from asyncrl.envs.demos import corrupt_answer
from asyncrl.envs.imports import import_object
from asyncrl.envs.wrappers import GUARD_STATS
from asyncrl.errors import UserError

__all__ = [
    "BUILTIN_SCORERS",
    "ScorerRefused",
    "exact_score",
    "load_scorer",
    "math_score",
    "numeric_score",
    "refuse_lenient_scorer",
    "safe_score",
]

Scorer = Callable[[str, str], float]
"""``score(answer, gold) -> float`` in [0, 1]."""

NONSENSE_ANSWERS: tuple[str, ...] = ("", "asyncrl: not an answer", "zzzz")
"""Answers no task accepts; a scorer that credits one in full is refused."""


class ScorerRefused(UserError, ValueError):
    """The scorer credits a wrong answer in full (or not its own reference answer); a user error."""


_LOCK = threading.Lock()


def _try_score(fn: Callable[..., Any], *args: Any) -> tuple[float, str | None]:
    """``fn(*args)`` as a score in [0, 1] and ``None``, or ``(0.0, what went wrong)``."""
    try:
        value = fn(*args)
    except Exception as exc:  # a scorer bug or an answer it cannot parse: a failed answer
        return 0.0, f"{type(exc).__name__}: {exc}"[:300]
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if not math.isfinite(x):
        return 0.0, f"returned {value!r:.80}, not a finite number"
    return min(1.0, max(0.0, x)), None


def safe_score(fn: Callable[[], Any]) -> float:
    """``fn()`` as a score in [0, 1]; an exception or a non-number is 0.0, counted in
    ``GUARD_STATS.scorer_errors``."""
    score, error = _try_score(fn)
    if error is not None:
        with _LOCK:
            GUARD_STATS.scorer_errors += 1
    return score


# ---------------------------------------------------------------------------------------------
# Built-in scorers
# ---------------------------------------------------------------------------------------------
def exact_score(answer: str, gold: str) -> float:
    """1.0 when the texts agree ignoring case and runs of whitespace, else 0.0."""
    return 1.0 if normalize(answer) == normalize(gold) else 0.0


def _number(text: str) -> float:
    return float(text.strip().replace(",", "").removesuffix("%"))


def numeric_score(answer: str, gold: str, tolerance: float) -> float:
    """1.0 when both parse as numbers (``,`` thousands separators allowed) within ``tolerance``,
    absolute or relative to the reference; 0.0 otherwise (an answer that is not a number included)."""
    try:
        a, g = _number(answer), _number(gold)
    except ValueError:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(g)):
        return 0.0
    return 1.0 if math.isclose(a, g, rel_tol=tolerance, abs_tol=tolerance) else 0.0


def math_score(answer: str, gold: str) -> float:
    """1.0 when ``math-verify`` finds the expressions equivalent (``1/2`` = ``0.5`` = ``\\frac{1}{2}``,
    ``x(x+1)`` = ``x^2+x``). A text without ``$`` is read as one LaTeX expression (an answer tag holds
    just the answer), falling back to math-verify's own extraction.

    math-verify's own timeouts use ``signal.alarm`` (main thread only), so they are off here: the
    guard's ``env.guard.step_timeout_s`` bounds a step instead."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise UserError("env.dataset.scorer 'math' needs math-verify: pip install 'asyncrl[math]'") from None

    def read(text: str) -> Any:
        found = parse(f"${text}$", parsing_timeout=None) if "$" not in text else []  # type: ignore[arg-type]
        return found or parse(text, parsing_timeout=None)  # type: ignore[arg-type]

    g, a = read(gold), read(answer)
    if not g or not a:
        return 0.0
    return 1.0 if verify(g, a, timeout_seconds=None) else 0.0


BUILTIN_SCORERS: dict[str, Callable[..., float]] = {
    "exact": exact_score,
    "numeric": numeric_score,
    "math": math_score,
}


def load_scorer(spec: str, *, tolerance: float, field: str = "env.dataset.scorer") -> Scorer:
    """A built-in scorer by name or a ``module:function`` taking ``(answer, gold)``; a clear
    :class:`UserError` for a bad name or path."""
    if spec == "numeric":
        return lambda answer, gold: numeric_score(answer, gold, tolerance)
    if spec in BUILTIN_SCORERS:
        return BUILTIN_SCORERS[spec]
    if ":" not in spec:
        raise UserError(
            f"{field} {spec!r}: use one of {sorted(BUILTIN_SCORERS)} or 'package.module:function'"
        )
    fn = import_object(spec, what="function")
    if not callable(fn):
        raise UserError(f"{field} {spec!r} is a {type(fn).__name__}, not a function (answer, gold) -> float")
    return fn  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------
# Hygiene
# ---------------------------------------------------------------------------------------------
def refuse_lenient_scorer(where: str, score: Callable[[str, int], float], golds: Sequence[str]) -> None:
    """Raise :class:`ScorerRefused` if ``score(answer, i)`` (the scorer on task ``i``) does not give
    ``golds[i]`` full credit, or gives full credit to a deliberately wrong answer: a nonsense one or
    the reference answer with one mistake (:func:`~asyncrl.envs.demos.corrupt_answer`, as a
    corrupted demonstration makes it). Another task's answer is not tried: puzzles with many
    solutions (``n_queens``) legitimately accept it."""
    rng = random.Random(0)
    for i, gold in enumerate(golds):
        if _try_score(score, gold, i)[0] < 1.0:
            raise ScorerRefused(
                f"{where}: the scorer gives the reference answer {gold[:80]!r} less than full credit "
                "on a generated task, so no answer could count as a success"
            )
        for wrong in (*NONSENSE_ANSWERS, corrupt_answer(gold, rng), corrupt_answer(gold, rng)):
            if normalize(wrong) == normalize(gold):
                continue
            if _try_score(score, wrong, i)[0] >= 1.0:
                raise ScorerRefused(
                    f"{where}: the scorer gives full credit to the wrong answer {wrong[:80]!r} "
                    f"(reference {gold[:80]!r}); refusing to train on a verifier that rewards wrong "
                    "answers (pick another dataset or fix its scorer)"
                )
