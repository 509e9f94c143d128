"""``class``: an environment class written for TRL's ``environment_factory``, trained unchanged.

The contract is TRL's (``GRPOTrainer(environment_factory=...)``):

* the factory (``env.class_env.factory``, a class or zero-argument callable) builds an instance;
  one per asyncrl environment, reset for every episode (TRL: "construct once, reset often");
* ``reset(**row)`` starts an episode on a row of ``env.class_env.rows`` and returns ``None`` or a
  string appended to the row's prompt;
* every other public method is a tool (:mod:`asyncrl.envs.class_tools`: schema from the signature
  and docstring, arguments coerced to their types, an exception is a tool error the model reads);
* the reward: a TRL reward function ``reward_func(environments, prompts, completions, **row
  columns) -> list[float | None]`` called with this episode's instance, plus the instance's
  ``get_reward()`` when it has one (sync or async; ``None`` counts 0).

A model turn is read by asyncrl's own tool-call parser (``<tool>NAME(ARGS)</tool>``, into which
:mod:`asyncrl.policy.toolcalls` turns a native JSON call); a turn without a call is the final answer
and ends the episode with the reward. Success is a reward of at least ``success_reward``. There are
no process rewards (TRL has none): only the reward function's. An episode that uses up
``env.max_turns`` ends ``truncated`` with reward 0, without calling the reward function.

Tasks are the rows, read and split by :class:`~asyncrl.envs.tasks.RowTasks` (the
``dataset`` kind's loader); a task carries its whole row (``payload["row"]``), so every column
reaches ``reset`` and the reward function, and the held-out split is by a hash of the row.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import random
import time
from typing import TYPE_CHECKING, Any

import msgspec

from asyncrl.envs.base import (
    AnswerAction,
    MalformedAction,
    StepResult,
    Tool,
    call_env,
    parse_action,
    repeat_final,
    task_id,
    tool_call,
)
from asyncrl.envs.class_tools import call_tool, class_tools, load_object
from asyncrl.envs.demos import UserDemonstrator, answer_demonstrate, corrupt_turns
from asyncrl.envs.imports import EnvPluginError
from asyncrl.envs.tasks import RowTasks, cached_source
from asyncrl.records import Outcome, Task

if TYPE_CHECKING:
    from asyncrl.config import ClassEnvConfig, EnvConfig

__all__ = ["ClassEnv", "ClassTasks", "DemoClassEnv"]

FIELD = "env.class_env"


def _section(cfg: EnvConfig) -> ClassEnvConfig:
    assert cfg.class_env is not None  # EnvConfig's validator requires it for this kind
    return cfg.class_env


class ClassTasks(RowTasks):
    """The rows of ``env.class_env.rows`` as tasks (``task_type`` ``class``); held out by column
    or by a hash of the whole row (the split column left out)."""

    task_types = ("class",)
    salt = "class"
    path_field = f"{FIELD}.rows"

    def __init__(self, cc: ClassEnvConfig, **kwargs: int) -> None:
        self.cc = cc
        super().__init__(cc.rows, cc, **kwargs)

    def row_task(self, i: int, row: dict[str, Any]) -> Task:
        cc = self.cc
        fields = (cc.prompt_field, cc.system_field, cc.difficulty_field, cc.split_field, cc.demo_field)
        difficulty = self.checked_difficulty(i, row, fields, cc.difficulty_field)
        key = self.json_row(i, row)
        system, prompt = _prompt_of(row[cc.prompt_field]) if cc.prompt_field else (None, "")
        if cc.system_field:
            system = str(row[cc.system_field])
        payload = {"row": msgspec.json.decode(key), "prompt": prompt}
        if system:
            payload["system"] = system
        if cc.demo_field:
            demo = row[cc.demo_field]
            payload["demo"] = [str(t) for t in demo] if isinstance(demo, list) else str(demo).strip()
        return Task(id=task_id("cls", key), task_type="class", difficulty=difficulty, payload=payload)

    def content_key(self, task: Task) -> str:
        row = {k: v for k, v in task.payload["row"].items() if k != self.split}
        return json.dumps(row, sort_keys=True)


def _prompt_of(value: Any) -> tuple[str | None, str]:
    """(system, prompt) of a prompt column: a string, or TRL's conversational form (a list of
    messages: the system messages are the system prompt, the last user message the prompt)."""
    if not isinstance(value, list):
        return None, str(value)
    messages = [m for m in value if isinstance(m, dict)]
    system = "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
    users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    return system or None, users[-1] if users else ""


def _noop(*args: Any, **kwargs: Any) -> None:
    """TRL's ``log_extra`` / ``log_metric`` hooks, which a reward function may call."""


class ClassEnv:
    """A TRL-style environment class as an asyncrl environment (module docstring)."""

    kind = "class"

    def __init__(self, cc: ClassEnvConfig, options: dict[str, object]) -> None:
        self.cc = cc
        factory = load_object(cc.factory, f"{FIELD}.factory")
        if not callable(factory):
            raise EnvPluginError(f"{FIELD}.factory {cc.factory!r} is a {type(factory).__name__}, not a class")
        self.instance = factory(**options)
        if not callable(getattr(self.instance, "reset", None)):
            raise EnvPluginError(
                f"{FIELD}.factory {cc.factory!r}: the environment must define a callable reset"
            )
        self.reward_fn = load_object(cc.reward, f"{FIELD}.reward") if cc.reward else None
        if self.reward_fn is not None and not callable(self.reward_fn):
            raise EnvPluginError(
                f"{FIELD}.reward {cc.reward!r} is a {type(self.reward_fn).__name__}, not a function"
            )
        get_reward = getattr(self.instance, "get_reward", None)
        self.get_reward = get_reward if callable(get_reward) else None
        if self.reward_fn is None and self.get_reward is None:
            raise EnvPluginError(
                f"{FIELD}: no reward source: set {FIELD}.reward to a reward function 'module:function' "
                f"or give {cc.factory} a get_reward() method"
            )
        self._tools = class_tools(self.instance, cc.factory)
        self.tools: list[Tool] = [t.tool for t in self._tools.values()]
        self.task: Task | None = None
        self._final: StepResult | None = None
        self._prompt: list[dict[str, object]] = []
        self._completion: list[dict[str, object]] = []

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> ClassEnv:
        cc = _section(cfg)
        return (DemoClassEnv if cc.demo_field or cc.demonstrator else ClassEnv)(cc, cfg.options)

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> ClassTasks:
        return cached_source(ClassTasks, _section(cfg), cfg)

    async def reset(self, task: Task) -> str:
        self.task, self._final, self._completion = task, None, []
        obs = await call_env(functools.partial(self.instance.reset, **task.payload["row"]))
        if obs is not None and not isinstance(obs, str):
            raise TypeError(
                f"{self.cc.factory}.reset returned {type(obs).__name__}; expected a string or None"
            )
        prompt = str(task.payload["prompt"]) + (obs or "")  # TRL appends it to the last user message
        system = task.payload.get("system")
        self._prompt = [{"role": "system", "content": system}] if system else []
        self._prompt.append({"role": "user", "content": prompt})
        return f"{system}\n\n{prompt}" if system else prompt

    async def step(self, model_text: str) -> StepResult:
        if self.task is None:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset()")
        if self._final is not None:  # a retried final step: the same result again
            return repeat_final(self._final)
        action = parse_action(model_text)
        if isinstance(action, AnswerAction):
            self._completion.append({"role": "assistant", "content": action.answer})
            reward = await self._reward()
            outcome: Outcome = "success" if reward >= self.cc.success_reward else "failure"
            info = {"action": "answer", "answer": action.answer}
            self._final = StepResult(
                f"reward {reward:g}", done=True, reward=reward, outcome=outcome, info=info
            )
            return self._final
        if isinstance(action, MalformedAction) or action.name not in self._tools:
            self._completion.append({"role": "assistant", "content": model_text})
            names = ", ".join(self._tools) or "none"
            reason = (
                action.reason
                if isinstance(action, MalformedAction)
                else f"unknown tool {action.name!r}; tools: {names}"
            )
            return StepResult(f"error: {reason}", info={"action": "malformed"}, malformed=True)
        started = time.monotonic()
        ok, text = await call_tool(self.instance, self._tools[action.name], action.args)
        call = tool_call(action.name, action.args, ok, text, started)
        observation = text if ok else f"error: {text}"
        function = {"name": action.name, "arguments": action.args}
        self._completion.append(
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": function}]}
        )
        self._completion.append({"role": "tool", "name": action.name, "content": observation})
        return StepResult(observation, info={"action": "tool"}, tool_call=call)

    async def _reward(self) -> float:
        """The reward function's value on this episode's instance plus ``get_reward()`` (TRL's sum)."""
        assert self.task is not None
        values: list[Any] = []
        if self.reward_fn is not None:
            row = self.task.payload["row"]
            kwargs: dict[str, object] = {
                k: [v] for k, v in row.items() if k not in ("prompt", "completion", "completion_ids")
            }
            kwargs |= {
                "prompts": [self._prompt],
                "completions": [self._completion],
                "completion_ids": [[]],
                "environments": [self.instance],
                "trainer_state": None,
                "log_extra": _noop,
                "log_metric": _noop,
            }
            out = await call_env(functools.partial(self.reward_fn, **kwargs))
            if not isinstance(out, (list, tuple)) or len(out) != 1:
                raise EnvPluginError(
                    f"{FIELD}.reward {self.cc.reward} returned {out!r}: a reward function returns a list with "
                    "one float (or None) per environment"
                )
            values.append(out[0])
        if self.get_reward is not None:
            values.append(await call_env(self.get_reward))
        for v in values:
            if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(float(v))):
                raise EnvPluginError(f"{FIELD}: a reward of {v!r}; rewards are finite numbers (or None)")
        return float(sum(float(v) for v in values if v is not None))


class DemoClassEnv(ClassEnv):
    """:class:`ClassEnv` with ``demo_field`` or ``demonstrator`` set: the warm start's demonstrations,
    and a reference solution. A ``demo_field`` string is the gold final answer; a list of strings is
    the model turns themselves in asyncrl's text protocol (``<tool>add({"amount": 3})</tool>``,
    ``<answer>7</answer>``), as is what the ``demonstrator(row, rng)`` function returns. Corrupted at
    ``trainer.sft.corruption_rate``: one number changed, in a tool call when there is one (the
    answer's text may not be what the reward reads)."""

    def __init__(self, cc: ClassEnvConfig, options: dict[str, object]) -> None:
        super().__init__(cc, options)
        field = f"{FIELD}.demonstrator"
        self.demonstrator = UserDemonstrator(cc.demonstrator, field) if cc.demonstrator else None

    def solve(self, task: Task) -> list[str]:
        if self.demonstrator is not None:
            return self.demonstrator.solve(task.payload["row"], task)
        demo = task.payload["demo"]
        return [str(t) for t in demo] if isinstance(demo, list) else [f"<answer>{demo}</answer>"]

    def demonstrate(self, task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        if self.demonstrator is not None:
            turns = self.demonstrator.turns(task.payload["row"], rng)
            return corrupt_turns(turns, rng, corruption_rate)
        demo = task.payload["demo"]
        if not isinstance(demo, list):
            return answer_demonstrate(str(demo), rng, corruption_rate)
        return corrupt_turns([str(t) for t in demo], rng, corruption_rate)
