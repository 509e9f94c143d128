"""The tools of a TRL-style environment class: schemas, argument coercion and dispatch.

TRL's ``environment_factory`` contract: every public method of the instance (no leading
underscore; not ``reset`` nor ``get_reward``) is a tool. Its JSON schema comes from its signature
and Google-style docstring through ``transformers.utils.get_json_schema`` -- the function TRL's chat
templates use -- so a method TRL accepts is accepted here and one it refuses is refused, in words,
when the environment is built.

A call arrives as canonical ``NAME(ARGS)`` text (:mod:`asyncrl.policy.toolcalls` renders a
model's JSON call so): a tool of one parameter gets the plain value, a tool of several a JSON
object (plain text is also taken as the one required argument). Each argument is coerced to its annotated type (pydantic, lax mode: ``"3"`` is an ``int``),
and a call whose arguments do not fit, or whose method raises, is a tool error whose text is the
observation -- never a crash of the episode.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from asyncrl import jsontext
from asyncrl.envs.base import Tool, call_env
from asyncrl.envs.imports import EnvPluginError, import_object

__all__ = ["RESERVED", "ClassTool", "ToolArgsError", "call_tool", "class_tools", "load_object"]

RESERVED = ("reset", "get_reward")
"""Public methods that are not tools (TRL's rule)."""


class ToolArgsError(ValueError):
    """The arguments of a call do not fit the tool's signature (a tool error, not a crash)."""


def load_object(spec: str, field: str) -> Any:
    """``package.module:NAME`` or ``path/to/file.py:NAME`` (relative to the working directory);
    :class:`EnvPluginError` naming ``field`` for anything that cannot be loaded."""
    where, _, name = spec.rpartition(":")
    if not where.endswith(".py"):
        try:
            return import_object(spec, what="Name")
        except EnvPluginError as exc:
            raise EnvPluginError(f"{field}: {exc}") from None
    path = Path(where).resolve()
    if not path.is_file():
        raise EnvPluginError(f"{field}: file {where!r} does not exist (relative to {Path.cwd()})")
    module = _module_from_file(str(path))
    if not hasattr(module, name):
        raise EnvPluginError(f"{field}: {where!r} defines no {name!r}")
    return getattr(module, name)


@functools.lru_cache(maxsize=64)
def _module_from_file(path: str) -> Any:
    """The module of a file, loaded once per process (so its classes keep one identity)."""
    name = f"asyncrl_user_{Path(path).stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"  # one per file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing resolve their module through it
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise EnvPluginError(f"importing {path!r} failed: {type(exc).__name__}: {exc}") from exc
    return module


@dataclass(frozen=True)
class ClassTool:
    """One public method of the instance as a tool: its asyncrl :class:`Tool` (the schema the
    model sees) and a pydantic adapter per parameter (the coercion)."""

    tool: Tool
    adapters: dict[str, TypeAdapter[Any]]
    required: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.tool.name

    def arguments(self, text: str) -> dict[str, Any]:
        """The keyword arguments of a call from its ARGS text; :class:`ToolArgsError` if they do not fit."""
        names = list(self.adapters)
        obj = _json_object(text)
        if obj is not None and (len(names) != 1 or set(obj) == set(names)):
            raw = obj
        elif not names:
            if text.strip():
                raise ToolArgsError(f"{self.name} takes no arguments")
            raw = {}
        elif len(names) == 1 or len(self.required) == 1:  # plain text: the one (required) argument
            name = names[0] if len(names) == 1 else self.required[0]
            return {name: self._one(name, text)}
        else:
            raise ToolArgsError(f"{self.name} takes a JSON object of arguments {names}")
        unknown = sorted(set(raw) - set(names))
        missing = [n for n in self.required if n not in raw]
        if unknown or missing:
            what = f"unknown argument(s) {unknown}" if unknown else f"missing argument(s) {missing}"
            raise ToolArgsError(f"{self.name}: {what}; its arguments are {names}")
        return {k: self._coerce(k, v) for k, v in raw.items()}

    def _one(self, name: str, text: str) -> Any:
        """The single parameter from plain text: as text for ``str``, else JSON first, then the text."""
        if self.adapters[name].json_schema().get("type") != "string":
            try:
                return self._coerce(name, jsontext.loads(text))
            except (json.JSONDecodeError, ToolArgsError):
                pass
        return self._coerce(name, text)

    def _coerce(self, name: str, value: Any) -> Any:
        try:
            return self.adapters[name].validate_python(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ToolArgsError(f"{self.name}: argument {name!r}: {err['msg']} (got {value!r})") from None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        obj = jsontext.loads(text)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def class_tools(instance: Any, where: str) -> dict[str, ClassTool]:
    """The tools of ``instance`` by name (TRL's rule, module docstring); :class:`EnvPluginError`
    for a method ``get_json_schema`` refuses (no docstring, an undocumented argument, no type hint)."""
    from transformers.utils.chat_template_utils import get_json_schema

    tools: dict[str, ClassTool] = {}
    for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
        if name.startswith("_") or name in RESERVED:
            continue
        try:
            fn = get_json_schema(method)["function"]
            hints = typing.get_type_hints(method)
        except Exception as exc:
            raise EnvPluginError(
                f"{where}: method {name!r} cannot be a tool: {exc}. A tool needs type hints and a Google-style "
                "docstring with an 'Args:' line per argument (TRL's rule); make helpers private (_name)"
            ) from None
        params = [
            p
            for p in inspect.signature(method).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        adapters = {p.name: TypeAdapter(hints.get(p.name, Any)) for p in params}
        required = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        tool = Tool(
            name=name,
            description=str(fn.get("description", "")),
            args_schema={"example": _example(fn["parameters"], required)},
            parameters_schema=fn["parameters"],
        )
        tools[name] = ClassTool(tool, adapters, required)
    return tools


_PLACEHOLDER = {"integer": 1, "number": 1.0, "boolean": True, "string": "a", "array": [], "object": {}}


def _example(parameters: dict[str, Any], required: tuple[str, ...]) -> str:
    """A well-formed ARGS text for ``asyncrl env check``: a placeholder per required argument."""
    props = parameters.get("properties", {})
    values = {n: _PLACEHOLDER.get(str(props.get(n, {}).get("type")), "a") for n in required}
    if len(props) == 1 and len(values) == 1:
        value = next(iter(values.values()))
        return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(values) if values else ""


async def call_tool(instance: Any, tool: ClassTool, args: str) -> tuple[bool, str]:
    """Run the method on the coerced arguments: ``(True, str(result))``, or ``(False, the error
    text)`` when the arguments do not fit or the method raises (TRL counts both as tool failures)."""
    try:
        kwargs = tool.arguments(args)
    except ToolArgsError as exc:
        return False, str(exc)
    try:
        result = await call_env(functools.partial(getattr(instance, tool.name), **kwargs))
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return True, str(result)
