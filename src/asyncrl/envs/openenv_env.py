"""``openenv``: an OpenEnv ``Environment`` class in process, its MCP tools as asyncrl tools.

The class (``env.openenv.path``) is instantiated in this process -- no Docker, no HTTP server. Its
tools are listed once with ``step(ListToolsAction())`` and become asyncrl :class:`Tool`\\ s with the
MCP input schema as their JSON schema; ``<tool>NAME(ARGS)</tool>`` becomes
``step(CallToolAction(tool_name=NAME, arguments=...))`` (ARGS: a JSON object, or the plain value of
a one-argument tool, coerced to its schema type). A task is a seed (:class:`~asyncrl.envs.tasks.SeedTasks`):
the episode starts with ``reset(seed=seed)``, and ends when an observation says ``done``; its
``reward`` is the outcome reward (a success from ``success_reward`` up). ``<answer>X</answer>`` calls
``answer_tool`` with X when one is set, else it ends the episode as a failure (reward 0).

Methods are synchronous (OpenEnv's ``MCPEnvironment.step`` runs its own event loop), so asyncrl runs
each call in a worker thread. Installed without dependencies: docs/environments.md#openenv.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncrl import jsontext
from asyncrl.envs.base import (
    AnswerAction,
    EpisodeRewards,
    MalformedAction,
    StepResult,
    Tool,
    parse_action,
    repeat_final,
)
from asyncrl.envs.imports import import_object
from asyncrl.envs.tasks import SeedTasks
from asyncrl.envs.toolenv import env_section
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig
    from asyncrl.config.ecosystem import OpenEnvConfig

__all__ = ["OpenEnvEnv", "call_arguments", "observation_text"]

INSTALL = "pip install --no-deps 'openenv-core==0.3.0' (docs/environments.md#openenv)"
_QUIET = {"done", "reward", "metadata", "tool_name", "error"}


def _mcp_types() -> Any:
    try:
        from openenv.core.env_server import mcp_types
    except ImportError as exc:
        raise UserError(f"env.kind 'openenv' needs {exc.name or 'openenv-core'}: {INSTALL}") from None
    return mcp_types


def observation_text(obs: Any) -> str:
    """An observation as the model reads it: a tool's text content, else the observation's own
    fields (``done``, ``reward``, ``metadata``, ``tool_name``, ``error`` left out) -- one string field as itself, several as JSON."""
    result = getattr(obs, "result", None)
    if result is not None:
        content = getattr(result, "content", None)
        if isinstance(content, list):
            texts = [str(getattr(c, "text", "")) for c in content if getattr(c, "text", None) is not None]
            if texts:
                return "\n".join(texts)
        data = getattr(result, "data", result)
        return data if isinstance(data, str) else json.dumps(data, default=str)
    fields = obs.model_dump(exclude=_QUIET) if hasattr(obs, "model_dump") else {"observation": obs}
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return str(next(iter(fields.values())))
    return json.dumps(fields, default=str)


_CASTS: dict[str, Callable[[str], Any]] = {
    "integer": int,
    "number": float,
    "boolean": lambda s: s.strip().lower() in ("true", "1"),
}


def call_arguments(args: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The MCP arguments of ``NAME(ARGS)``: a JSON object as is; one argument's plain value coerced
    to its schema type. ``ValueError`` in words otherwise."""
    text = args.strip()
    if text.startswith("{"):
        try:
            value = jsontext.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON: {exc.msg}") from None
        if isinstance(value, dict):
            return value
    props = dict(schema.get("properties") or {})
    if not props and not text:
        return {}
    if len(props) != 1:
        raise ValueError(f"give the arguments as a JSON object with {sorted(props)}")
    name, prop = next(iter(props.items()))
    cast = _CASTS.get(str((prop or {}).get("type")), str)
    try:
        return {name: cast(text)}
    except ValueError:
        raise ValueError(f"{name} must be {(prop or {}).get('type')}, got {text!r}") from None


class OpenEnvEnv:
    """One OpenEnv environment instance per asyncrl environment, one episode at a time."""

    kind = "openenv"

    def __init__(self, oc: OpenEnvConfig) -> None:
        self.types = _mcp_types()
        self.oc = oc
        cls = import_object(oc.path)
        if not callable(getattr(cls, "reset", None)) or not callable(getattr(cls, "step", None)):
            raise UserError(f"env.openenv.path {oc.path}: not an OpenEnv Environment (no reset/step)")
        try:
            self.env = cls(**oc.kwargs)
            listed = self.env.step(self.types.ListToolsAction())
        except Exception as exc:
            raise UserError(f"env.openenv.path {oc.path}: {type(exc).__name__}: {exc}") from exc
        specs = list(getattr(listed, "tools", None) or [])
        self.schemas = {t.name: dict(t.input_schema or {}) for t in specs}
        self.tools = [
            Tool(t.name, t.description or t.name, parameters_schema=self.schemas[t.name]) for t in specs
        ]
        if oc.answer_tool is not None and oc.answer_tool not in self.schemas:
            raise UserError(
                f"env.openenv.answer_tool {oc.answer_tool!r} is not a tool of {oc.path}: {sorted(self.schemas)}"
            )
        self.rewards = EpisodeRewards()
        self._final: StepResult | None = None

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> OpenEnvEnv:
        return cls(env_section(cfg, cfg.openenv))

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> SeedTasks:
        oc = env_section(cfg, cfg.openenv)
        return SeedTasks(oc.path, oc.seeds, seed=cfg.seed, heldout_size=cfg.heldout_size, prefix="openenv")

    def reset(self, task: Task) -> str:
        self.rewards = EpisodeRewards()
        self._final = None
        return observation_text(self.env.reset(seed=int(task.payload["seed"])))

    def step(self, model_text: str) -> StepResult:
        if self._final is not None:
            return repeat_final(self._final)
        action = parse_action(model_text)
        if isinstance(action, MalformedAction):
            return self.rewards.malformed(action.reason)
        if isinstance(action, AnswerAction):
            if self.oc.answer_tool is None:  # the model gave up: the episode ends, a failure
                self._final = StepResult(
                    "episode over: this environment takes tool calls", done=True, outcome="failure"
                )
                return self._final
            name = self.oc.answer_tool
            arg = next(iter(self.schemas[name].get("properties") or {"answer": 0}))
            args = json.dumps({arg: action.answer})
        else:
            name, args = action.name, action.args
        if name not in self.schemas:
            return self.rewards.malformed(f"unknown tool {name!r}; tools: {', '.join(self.schemas)}")
        return self._call(name, args)

    def _call(self, name: str, args: str) -> StepResult:
        started = time.monotonic()
        try:
            arguments = call_arguments(args, self.schemas[name])
        except ValueError as exc:
            obs, error = None, str(exc)
        else:
            obs = self.env.step(self.types.CallToolAction(tool_name=name, arguments=arguments))
            err = getattr(obs, "error", None)
            error = str(getattr(err, "message", err)) if err is not None else ""
        text = error or observation_text(obs)
        result = self.rewards.tool_step(name, args, not error, text, started, lambda a, b: False)
        if obs is not None and getattr(obs, "done", False):
            final = float(obs.reward or 0.0)
            result.done, result.reward = True, final
            result.outcome = "success" if final >= self.oc.success_reward else "failure"
            self._final = result
        return result

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
