"""The environment contract: protocol, action parser, task sources and process-reward rules.

Everything an environment needs to agree on with the rest of asyncrl lives here:

* :class:`Environment` -- ``reset(task) -> prompt`` and ``step(model_text) -> StepResult``.
  Environments may be ``async`` (preferred) or plain synchronous methods; the wrappers run a
  synchronous method in its own thread (see :func:`call_env`) so it cannot block the event loop.
* :func:`parse_action` -- the ONE parser of the shared text protocol
  (``<tool>NAME(ARGS)</tool>`` / ``<answer>TEXT</answer>``) used by every built-in environment,
  so that "what counts as a well-formed action" is identical everywhere.
* :class:`TaskSource` / :class:`HashSplitTaskSource` -- task generation with a held-out split that
  is disjoint from training tasks *by construction* (a task's content key hashes into the held-out
  bucket or not; :meth:`HashSplitTaskSource.sample` rejects held-out tasks).
* :class:`EpisodeRewards` -- the shared rule-based process rewards, so all built-ins pay the same
  bonuses and penalties for the same behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import math
import numbers
import random
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeAlias, runtime_checkable

from asyncrl.records import OUTCOMES, Fault, FaultKind, Outcome, ToolCall

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig
    from asyncrl.records import Task

__all__ = [
    "REWARD_MALFORMED",
    "REWARD_TOOL_ERROR",
    "REWARD_USES_RESULT",
    "REWARD_WELL_FORMED",
    "AnswerAction",
    "CallTimeout",
    "Environment",
    "EpisodeRewards",
    "HashSplitTaskSource",
    "MalformedAction",
    "StepResult",
    "SyncEnvironment",
    "TaskSource",
    "Tool",
    "ToolCallAction",
    "call_env",
    "call_with_timeout",
    "close_env",
    "is_async_method",
    "parse_action",
    "repeat_final",
]


# ---------------------------------------------------------------------------------------------
# Step results, tools, the environment protocol
# ---------------------------------------------------------------------------------------------
@dataclass
class StepResult:
    """What one environment step returns.

    ``observation`` is plain text; the framework wraps it as ``<obs>TEXT</obs>`` itself.
    ``reward`` and ``outcome`` only mean something when ``done`` is true: ``reward`` is the
    final (outcome) reward of the episode and ``outcome`` one of :data:`asyncrl.records.OUTCOMES`.
    ``process_reward`` is the rule-based reward of this single turn (in [-1, 1] for built-ins).
    ``malformed``: the model's action could not be parsed or named no tool (counts towards
    ``orchestrator.exploration.early_stop_invalid``). ``fault`` and ``retried_faults`` are the guard's: set by
    :class:`~asyncrl.envs.wrappers.GuardedEnv` when the step failed (the observation is then the
    configured fault observation) or succeeded only after retries; an environment leaves them unset.
    """

    observation: str
    process_reward: float = 0.0
    done: bool = False
    reward: float = 0.0
    outcome: Outcome | None = None
    info: dict[str, Any] = field(default_factory=dict)
    tool_call: ToolCall | None = None
    malformed: bool = False
    fault: Fault | None = None
    retried_faults: list[Fault] = field(default_factory=list)


@dataclass(frozen=True)
class Tool:
    """A tool the model may call as ``<tool>NAME(ARGS)</tool>``.

    ``args_schema`` is a small JSON-schema-like dict describing the raw ARGS text, e.g.
    ``{"type": "string", "description": "an arithmetic expression", "example": "3*4"}``.
    The optional ``example`` is what ``check_environment`` sends as a well-formed call, and the
    optional ``name`` names the argument in the JSON schema shown to pretrained models.

    Pretrained chat models call tools with JSON arguments; :meth:`parameters` is the JSON schema
    they see (``parameters_schema`` when given, else one string argument derived from
    ``args_schema``). The environment still receives ``NAME(ARGS)`` text either way: a single
    argument arrives as its plain value, several as compact JSON (see docs/models.md).
    """

    name: str
    description: str
    args_schema: dict[str, Any] = field(default_factory=dict)
    parameters_schema: dict[str, Any] | None = None
    """An explicit JSON schema (``{"type": "object", "properties": ...}``) of the arguments."""

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the call's arguments (see the class docstring)."""
        if self.parameters_schema is not None:
            return self.parameters_schema
        arg = str(self.args_schema.get("name") or "input")
        prop: dict[str, str] = {"type": "string"}
        if self.args_schema.get("description"):
            prop["description"] = str(self.args_schema["description"])
        return {"type": "object", "properties": {arg: prop}, "required": [arg]}


@runtime_checkable
class Environment(Protocol):
    """An asynchronous environment. ``close()`` is optional (see :func:`close_env`).

    One instance runs one episode at a time: ``reset`` starts an episode and returns the prompt
    text, each ``step`` consumes one model turn. Instances are not shared between concurrent
    episodes, so per-episode state can live on ``self``.
    """

    @property
    def tools(self) -> list[Tool]: ...

    async def reset(self, task: Task) -> str: ...

    async def step(self, model_text: str) -> StepResult: ...


class SyncEnvironment(Protocol):
    """The synchronous flavour of :class:`Environment` (plain ``def`` methods).

    Supported everywhere an environment is accepted: each call runs in its own thread, so a
    method that blocks cannot stall the event loop, and the guard's timeout still applies.
    """

    @property
    def tools(self) -> list[Tool]: ...

    def reset(self, task: Task) -> str: ...

    def step(self, model_text: str) -> StepResult: ...


AnyEnvironment: TypeAlias = Environment | SyncEnvironment
"""What every caller of an environment accepts: either flavour (each call goes through :func:`call_env`)."""


def finite(x: object) -> bool:
    """Whether ``x`` is a real number (not a bool) whose float is finite."""
    try:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def step_problems(res: object) -> list[tuple[FaultKind, str]]:
    """What breaks the step contract in ``res``, in words, each with its :class:`~asyncrl.records.Fault`
    kind: ``bad_reward`` for a reward that is not a finite number, else ``malformed``."""
    if not isinstance(res, StepResult):
        return [("malformed", f"step() returned {type(res).__name__}, expected asyncrl.envs.StepResult")]
    out: list[tuple[FaultKind, str]] = []
    if not isinstance(res.observation, str):
        out.append(("malformed", f"observation is {type(res.observation).__name__}, expected str"))
    for name, x in (("process_reward", res.process_reward), ("reward", res.reward)):
        if not finite(x):
            number = isinstance(x, numbers.Real) and not isinstance(x, bool)
            out.append(
                ("bad_reward", f"{name} is {x if number else type(x).__name__}, expected a finite number")
            )
    if not isinstance(res.done, bool):
        out.append(("malformed", f"done is {type(res.done).__name__}, expected bool"))
    if res.outcome is not None and res.outcome not in OUTCOMES:
        out.append(("malformed", f"outcome {res.outcome!r} is not one of {', '.join(OUTCOMES)}"))
    if res.done and res.outcome is None:
        out.append(("malformed", "done=True needs an outcome (e.g. 'success' or 'failure')"))
    if not isinstance(res.info, dict):
        out.append(("malformed", f"info is {type(res.info).__name__}, expected dict"))
    if res.tool_call is not None and not isinstance(res.tool_call, ToolCall):
        out.append(("malformed", f"tool_call is {type(res.tool_call).__name__}, expected ToolCall"))
    if not isinstance(res.malformed, bool):
        out.append(("malformed", f"malformed is {type(res.malformed).__name__}, expected bool"))
    return out


def repeat_final(final: StepResult) -> StepResult:
    """The result of a step after the episode ended (a retried final step): the same ending again."""
    return StepResult(
        final.observation, done=True, reward=final.reward, outcome=final.outcome, info={"after_done": True}
    )


def is_async_method(fn: object) -> bool:
    """True when calling ``fn`` returns an awaitable without doing the work synchronously."""
    target = getattr(fn, "__func__", fn)
    if inspect.iscoroutinefunction(target):
        return True
    if inspect.isroutine(fn) or fn is None:
        return False
    call = inspect.getattr_static(type(fn), "__call__", None)  # objects with an async __call__
    return inspect.iscoroutinefunction(call)


async def _run_in_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a fresh daemon thread and await its result.

    A dedicated thread (not the loop's default executor) is used on purpose: a synchronous
    environment that blocks forever leaks exactly one daemon thread, instead of occupying a slot
    of a small shared pool and eventually starving every other episode. Every exception
    (including ``SystemExit``) is delivered to the awaiting coroutine.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def deliver(ok: bool, value: Any) -> None:
        if fut.done():  # the awaiting side gave up (timeout) -- drop the late result
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def target() -> None:
        try:
            value = fn(*args)
            ok = True
        except BaseException as exc:  # everything must reach the guard, even SystemExit
            value, ok = _as_exception(exc), False
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(deliver, ok, value)

    threading.Thread(
        target=target, name=f"asyncrl-env-{getattr(fn, '__name__', 'call')}", daemon=True
    ).start()
    return await fut


def _as_exception(exc: BaseException) -> Exception:
    """Futures cannot carry ``SystemExit``/``KeyboardInterrupt`` safely; wrap them."""
    if isinstance(exc, Exception):
        return exc
    wrapped = RuntimeError(f"{type(exc).__name__}: {exc}")
    wrapped.__cause__ = exc
    return wrapped


class CallTimeout(Exception):
    """A call gave no result within its time limit; it was cancelled and abandoned."""


async def call_with_timeout(fn: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """``await fn()`` for at most ``timeout`` seconds, else :class:`CallTimeout`.

    A call that times out is cancelled but not awaited, so an environment that swallows the
    cancellation cannot stall the caller. Whatever ``fn`` raises (``SystemExit``, its own
    ``CancelledError``) arrives as an ``Exception``; cancelling the caller cancels the call.
    """

    async def run() -> tuple[bool, Any]:
        try:
            return True, await fn()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit etc. must not reach the loop
            return False, exc

    task = asyncio.ensure_future(run())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        raise CallTimeout(f"no result within {timeout:g}s")
    if task.cancelled():  # not by us: the call raised CancelledError itself
        raise _as_exception(asyncio.CancelledError("raised by the environment"))
    ok, value = task.result()
    if not ok:
        raise _as_exception(value)
    return value


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def call_env(fn: Callable[..., Any], *args: Any) -> Any:
    """Call an environment method that may be sync or async, without blocking the loop.

    Async methods are awaited directly. Sync methods run in their own thread; if a sync
    method returns an awaitable (a decorated or partial coroutine function), it is awaited too.
    Note: an ``async def`` method that blocks synchronously (``time.sleep`` inside) blocks the
    event loop; no wrapper can preempt that.
    """
    if is_async_method(fn):
        return await fn(*args)
    result = await _run_in_own_thread(fn, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def close_env(env: AnyEnvironment) -> None:
    """Call ``env.close()`` if the environment has one (sync or async)."""
    close = getattr(env, "close", None)
    if callable(close):
        await call_env(close)


# ---------------------------------------------------------------------------------------------
# The action parser
# ---------------------------------------------------------------------------------------------
TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ToolCallAction:
    """``<tool>NAME(ARGS)</tool>``: ``args`` is the raw text between the first ``(`` after NAME
    and the last ``)`` before ``</tool>`` (so code containing parentheses passes through)."""

    name: str
    args: str
    text: str


@dataclass(frozen=True)
class AnswerAction:
    """``<answer>TEXT</answer>``: ``answer`` is TEXT with surrounding whitespace removed."""

    answer: str
    text: str


@dataclass(frozen=True)
class MalformedAction:
    """Anything else; ``reason`` says what is wrong in plain words (it becomes the observation)."""

    reason: str
    text: str


Action = ToolCallAction | AnswerAction | MalformedAction


def parse_action(text: str) -> Action:
    """Parse one model turn into an action.

    Rules (the shared protocol):

    * A turn ends at its FIRST closing tag (``</tool>`` or ``</answer>``); only whitespace may
      follow it. No closing tag (e.g. the turn hit the token limit) is malformed.
    * The matching opening tag is the last one before the closing tag. Free text before the
      opening tag is allowed and ignored (a "thought").
    * Tool call content (whitespace-stripped) must be ``NAME(ARGS)``: NAME an identifier,
      immediately followed by ``(``, and the content must end with ``)``. ARGS is the raw text
      between that first ``(`` and the final ``)``; it is not stripped or unescaped.
    * Answer text is stripped of surrounding whitespace and must not be empty.

    Whether NAME is a tool of the environment is for the environment to decide.
    """
    if not isinstance(text, str):
        return MalformedAction(f"model turn is {type(text).__name__}, not text", str(text))
    positions = [(i, tag) for tag in (TOOL_CLOSE, ANSWER_CLOSE) if (i := text.find(tag)) >= 0]
    if not positions:
        return MalformedAction(
            "no action: end the turn with <tool>NAME(ARGS)</tool> or <answer>TEXT</answer>", text
        )
    close_at, close_tag = min(positions)
    if text[close_at + len(close_tag) :].strip():
        return MalformedAction(f"text after {close_tag}", text)
    open_tag = TOOL_OPEN if close_tag == TOOL_CLOSE else ANSWER_OPEN
    open_at = text.rfind(open_tag, 0, close_at)
    if open_at < 0:
        return MalformedAction(f"{close_tag} without {open_tag}", text)
    content = text[open_at + len(open_tag) : close_at]
    if close_tag == ANSWER_CLOSE:
        answer = content.strip()
        if not answer:
            return MalformedAction("empty answer", text)
        return AnswerAction(answer, text)
    call = content.strip()
    m = _NAME_RE.match(call)
    if m is None:
        return MalformedAction("tool call must look like NAME(ARGS)", text)
    name = m.group(0)
    rest = call[m.end() :]
    if not rest.startswith("("):
        return MalformedAction(f"tool call {name!r} needs ( right after the name", text)
    if not rest.endswith(")") or len(rest) < 2:
        return MalformedAction(f"tool call {name!r} must end with )", text)
    return ToolCallAction(name, rest[1:-1], text)


# ---------------------------------------------------------------------------------------------
# Process rewards
# ---------------------------------------------------------------------------------------------
REWARD_WELL_FORMED = 0.1
"""A well-formed call of a known tool that succeeded and was not already made this episode."""
REWARD_USES_RESULT = 0.1
"""A call (or the answer) that uses the result of an earlier successful call."""
REWARD_MALFORMED = -0.1
"""A malformed action: bad syntax or an unknown tool."""
REWARD_TOOL_ERROR = -0.05
"""A well-formed call whose arguments the tool rejected (e.g. a bad expression)."""


class EpisodeRewards:
    """Per-episode bookkeeping of the rule-based process rewards shared by all built-ins.

    Rules are designed to be hard to farm: the well-formed bonus is paid once per distinct
    successful call, and the "uses a result" bonus once per earlier result. A step's reward is
    emitted when the step happens, so the "result used later" bonus is paid on the turn that
    *uses* the result (the later call or the answer), not retroactively on the producing turn.
    Every value returned is clamped to [-1, 1].
    """

    def __init__(self) -> None:
        self.calls: set[tuple[str, str]] = set()
        self.results: list[str] = []
        self.used: set[int] = set()

    def _uses(self, text: str, matches: Callable[[str, str], bool]) -> float:
        hits = [i for i, r in enumerate(self.results) if i not in self.used and matches(text, r)]
        self.used.update(hits)
        return REWARD_USES_RESULT if hits else 0.0

    def tool_ok(
        self, name: str, args: str, result: str, matches: Callable[[str, str], bool]
    ) -> tuple[float, dict[str, float]]:
        """Reward of a successful call; registers ``result`` for later "uses" bonuses."""
        parts: dict[str, float] = {}
        key = (name, args.strip())
        if key not in self.calls:
            parts["well_formed"] = REWARD_WELL_FORMED
            self.calls.add(key)
        bonus = self._uses(args, matches)
        if bonus:
            parts["uses_result"] = bonus
        self.results.append(result)
        return max(-1.0, min(1.0, sum(parts.values()))), parts

    def tool_error(self) -> tuple[float, dict[str, float]]:
        return REWARD_TOOL_ERROR, {"tool_error": REWARD_TOOL_ERROR}

    def tool_step(
        self, name: str, args: str, ok: bool, text: str, started: float, matches: Callable[[str, str], bool]
    ) -> StepResult:
        """The step that answers a tool call: its result ``text`` (``error: TEXT`` when not ``ok``), its
        process reward and its :class:`ToolCall` (``started``: ``time.monotonic()`` before the call)."""
        call = tool_call(name, args, ok, text, started)
        reward, parts = self.tool_ok(name, args, text, matches) if ok else self.tool_error()
        info = {"action": "tool", "reward_parts": parts}
        return StepResult(text if ok else f"error: {text}", reward, info=info, tool_call=call)

    def malformed(self, reason: str) -> StepResult:
        """The step that answers a malformed action (or a call of an unknown tool): ``error: REASON``."""
        info = {"action": "malformed", "reward_parts": {"malformed": REWARD_MALFORMED}}
        return StepResult(f"error: {reason}", process_reward=REWARD_MALFORMED, malformed=True, info=info)

    def answer(self, answer: str, matches: Callable[[str, str], bool]) -> tuple[float, dict[str, float]]:
        bonus = self._uses(answer, matches)
        return (bonus, {"uses_result": bonus}) if bonus else (0.0, {})


def tool_call(name: str, args: str, ok: bool, text: str, started: float | None = None) -> ToolCall:
    """The record of a call that returned ``text`` (its result, or its error when not ``ok``), started
    at ``time.monotonic()`` value ``started`` (latency 0 when unknown)."""
    result, error = (text, "") if ok else ("", text)
    latency = 0.0 if started is None else time.monotonic() - started
    return ToolCall(name=name, arguments=args, ok=ok, result=result, error=error, latency_s=latency)


_NUM_RE = re.compile(r"-?\d+")


def mentions_number(text: str, result: str) -> bool:
    """True when the integer ``result`` appears as a whole number token in ``text``."""
    r = result.strip()
    return bool(_NUM_RE.fullmatch(r)) and r in _NUM_RE.findall(text)


def normalize(text: str) -> str:
    """Case- and whitespace-insensitive form used to compare answers and entity names."""
    return " ".join(text.split()).casefold()


# ---------------------------------------------------------------------------------------------
# Task sources
# ---------------------------------------------------------------------------------------------
@runtime_checkable
class TaskSource(Protocol):
    """Where tasks come from.

    ``sample`` draws a TRAINING task (never a held-out one); ``heldout`` returns the fixed
    evaluation split, the same list on every call. ``task_types`` names the task families and
    ``difficulties`` the difficulty levels the source supports.
    """

    @property
    def task_types(self) -> tuple[str, ...]: ...

    @property
    def difficulties(self) -> tuple[int, ...]: ...

    def sample(self, rng: random.Random, difficulty: int | None = None) -> Task: ...

    def heldout(self) -> list[Task]: ...


class HashSplitTaskSource(ABC):
    """Base task source whose held-out split is disjoint from training BY CONSTRUCTION.

    Each task has a *content key* (what makes it the same problem, e.g. the numbers and
    operations, not the names in the story). The key hashes into 1000 buckets; the first
    ``heldout_permille`` buckets are held out. :meth:`sample` rejects held-out tasks, and
    :meth:`heldout` only keeps them, so no training task ever shares a content key with an
    evaluation task, for any seed and any run. Subclasses implement :meth:`generate` and
    :meth:`content_key`; the key must be canonical (operands of symmetric operations sorted, parts
    that do not change the problem dropped), or a held-out problem's twin -- ``b+a`` for ``a+b``
    -- lands in training (issue #35; docs/environments.md).
    """

    task_types: tuple[str, ...] = ()
    difficulties: tuple[int, ...] = ()
    salt: str = "asyncrl"
    """Mixed into the split hash; a different salt gives a different (still disjoint) split."""
    heldout_permille: int = 100
    """Share of the task space (in 1/1000) reserved for evaluation."""
    max_attempts: int = 10_000
    widen_hint: str = "widen the difficulty range"
    """How to get more held-out tasks, in the error when there are too few."""

    def __init__(
        self,
        *,
        seed: int,
        heldout_size: int,
        min_difficulty: int | None = None,
        max_difficulty: int | None = None,
    ) -> None:
        if not self.difficulties:
            raise TypeError(f"{type(self).__name__} must define difficulties")
        lo = self.difficulties[0] if min_difficulty is None else min_difficulty
        hi = self.difficulties[-1] if max_difficulty is None else max_difficulty
        allowed = [d for d in self.difficulties if lo <= d <= hi]
        if not allowed:
            raise ValueError(
                f"{type(self).__name__} supports difficulties {list(self.difficulties)}; "
                f"env.min_difficulty..max_difficulty = {lo}..{hi} contains none of them"
            )
        self.seed = seed
        self.active_difficulties: tuple[int, ...] = tuple(allowed)
        self.heldout_size = heldout_size
        self._heldout: list[Task] | None = None

    @classmethod
    def from_config(cls, cfg: EnvConfig, **kwargs: Any) -> Self:
        """Build from an :class:`~asyncrl.config.EnvConfig` (seed, difficulty range, held-out size)."""
        lo, hi = cfg.min_difficulty, cfg.max_difficulty
        return cls(
            seed=cfg.seed, min_difficulty=lo, max_difficulty=hi, heldout_size=cfg.heldout_size, **kwargs
        )

    # -- to implement -------------------------------------------------------------------------
    @abstractmethod
    def generate(self, rng: random.Random, difficulty: int) -> Task:
        """Draw any task (training or held-out) of this difficulty."""

    @abstractmethod
    def content_key(self, task: Task) -> str:
        """What makes two tasks the same problem; decides the split."""

    # -- provided -----------------------------------------------------------------------------
    def is_heldout(self, task: Task) -> bool:
        return in_heldout_bucket(self.salt, self.content_key(task), self.heldout_permille)

    def sample(self, rng: random.Random, difficulty: int | None = None) -> Task:
        """A training task: uniform over the active difficulties unless one is given."""
        if difficulty is None:
            difficulty = rng.choice(self.active_difficulties)
        if difficulty not in self.difficulties:
            raise ValueError(
                f"{type(self).__name__} has no difficulty {difficulty}; supported: {list(self.difficulties)}"
            )
        for _ in range(self.max_attempts):
            task = self.generate(rng, difficulty)
            if not self.is_heldout(task):
                return task
        raise RuntimeError(f"{type(self).__name__}: no training task found for difficulty {difficulty}")

    def heldout(self) -> list[Task]:
        """The evaluation split: ``heldout_size`` distinct tasks, round-robin over active difficulties.

        Deterministic for a given seed; computed once and cached.
        """
        if self._heldout is None:
            rng = random.Random(f"{self.salt}-heldout-{self.seed}")
            found: dict[str, Task] = {}  # content key -> the first task with it
            for _ in range(self.max_attempts * max(1, self.heldout_size)):
                if len(found) == self.heldout_size:
                    break
                task = self.generate(
                    rng, self.active_difficulties[len(found) % len(self.active_difficulties)]
                )
                if self.is_heldout(task):
                    found.setdefault(self.content_key(task), task)
            if len(found) < self.heldout_size:
                raise ValueError(
                    f"{type(self).__name__}: could only find {len(found)} distinct held-out tasks; "
                    f"lower env.heldout_size (now {self.heldout_size}) or {self.widen_hint}"
                )
            self._heldout = list(found.values())
        return list(self._heldout)


def in_heldout_bucket(salt: str, key: str, permille: int) -> bool:
    """Whether content ``key`` hashes (with ``salt``) into the first ``permille`` of 1000 buckets."""
    return int.from_bytes(hashlib.sha256(f"{salt}|{key}".encode()).digest()[:8], "big") % 1000 < permille


def task_id(prefix: str, key: str) -> str:
    """Deterministic task id from the content key (same problem -> same id)."""
    return f"{prefix}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
