"""Tool-call formats: how a model writes a tool call, and how asyncrl reads it back.

Environments speak one canonical protocol (``<tool>NAME(ARGS)</tool>`` / ``<answer>TEXT</answer>``,
parsed by :func:`asyncrl.envs.parse_action`), so environment code never changes with the model.
A *tool-call format* (``model.tool_format``: ``text``, ``hermes``/``qwen25``, ``llama3_json``,
``mistral``; the writings and the ``auto`` rule, :func:`detect_format`, are tabled in
``docs/models.md#episodes-are-chats``) sits between the model's native writing and that protocol:
:meth:`ToolCallFormat.to_action` turns a model turn into the canonical action text the environment
receives, :meth:`ToolCallFormat.from_action` a canonical action (a demonstration) into native
writing, and :meth:`ToolCallFormat.instructions` teaches the format in a generated system prompt.

The renderer splits reasoning (``<think>...</think>``) off before a format reads the turn. A turn
with no tool call is the final answer (``<answer>TEXT</answer>`` inside it kept as it is, else the
whole text); only the first call of a turn is run; a call whose JSON does not parse reaches the
environment as raw text, which it reports as malformed.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from asyncrl import jsontext
from asyncrl.envs.base import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    TOOL_CLOSE,
    TOOL_OPEN,
    AnswerAction,
    ToolCallAction,
    parse_action,
)
from asyncrl.policy.messages import ToolCall, ToolSchema

if TYPE_CHECKING:
    from asyncrl.envs.base import Tool

FoundCall = tuple[str, Any, str | None]
"""A call read from a turn: ``(name, arguments, the call id the model wrote or None)``."""


def tool_schema(tool: Tool) -> ToolSchema:
    """The OpenAI-style function schema of an environment tool (what chat templates take as ``tools=``)."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters()},
    }


def args_text(tool: Tool | None, arguments: Any) -> str:
    """The raw ARGS text the environment expects, from a call's JSON arguments.

    The tool's single parameter (or a lone value, unless the tool has several parameters) is passed
    as its plain text; anything else as compact JSON, so nothing the model wrote is lost.
    """
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict):
        names = list(tool.parameters().get("properties", {})) if tool is not None else []
        if len(names) == 1 and names[0] in arguments and len(arguments) == 1:
            value = arguments[names[0]]
            return value if isinstance(value, str) else json.dumps(value)
        if len(arguments) == 1 and len(names) <= 1:  # several parameters: always a JSON object
            value = next(iter(arguments.values()))
            return value if isinstance(value, str) else json.dumps(value)
    return json.dumps(arguments, separators=(",", ":"))


def call_arguments(tool: Tool | None, args: str) -> dict[str, Any]:
    """The JSON arguments of a canonical call ``NAME(ARGS)``: the tool's single parameter holds ARGS."""
    if tool is not None:
        names = list(tool.parameters().get("properties", {}))
        if len(names) == 1:
            return {names[0]: args}
    try:
        parsed = jsontext.loads(args)
    except json.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"input": args}


class ToolCallFormat(ABC):
    """One native tool-call writing; see the module docstring."""

    name: ClassVar[str]

    @abstractmethod
    def find_call(self, text: str) -> FoundCall | str | None:
        """The first call in ``text``; ``None`` when there is none; a string (the reason) when a
        call was started but cannot be read."""

    @abstractmethod
    def call_start(self, text: str) -> int:
        """Where the first call in ``text`` begins; -1 when there is none."""

    def call_id(self, n: int) -> str:
        """The id of the ``n``-th call of a chat: nine alphanumerics, which every template accepts."""
        return f"call{n:05d}"

    @abstractmethod
    def write_call(self, name: str, arguments: dict[str, object]) -> str:
        """Native text of one call."""

    def write_calls(self, calls: list[ToolCall]) -> list[str]:
        """Native text of each call of an assistant message (arguments that are not a JSON object
        as ``{"input": ...}``)."""
        return [
            self.write_call(c["function"]["name"], a if isinstance(a, dict) else {"input": a})
            for c in calls
            for a in [c["function"]["arguments"]]
        ]

    @abstractmethod
    def instructions(self) -> str:
        """How to call a tool, for a generated system prompt."""

    def to_action(self, text: str, tools: list[Tool]) -> str:
        """The canonical action text the environment receives for this model turn."""
        found = self.find_call(text)
        if isinstance(found, str):
            return text  # unreadable call: the environment reports it as malformed
        if found is not None:
            name, arguments, _ = found
            tool = next((t for t in tools if t.name == name), None)
            return f"<tool>{name}({args_text(tool, arguments)})</tool>"
        body = text.strip()
        if ANSWER_OPEN in body and ANSWER_CLOSE in body:
            return body[: body.rindex(ANSWER_CLOSE) + len(ANSWER_CLOSE)]
        return f"{ANSWER_OPEN}{body}{ANSWER_CLOSE}"

    def from_action(self, action_text: str, tools: list[Tool]) -> str:
        """Native text of a canonical action (demonstrations for the warm start); the text before the
        action's opening tag (reasoning, a worked solution) stays in front of it."""
        action = parse_action(action_text)
        if isinstance(action, ToolCallAction):
            tool = next((t for t in tools if t.name == action.name), None)
            thought = action_text[: action_text.rfind(TOOL_OPEN, 0, action_text.find(TOOL_CLOSE))]
            return thought + self.write_call(action.name, call_arguments(tool, action.args))
        if isinstance(action, AnswerAction):
            thought = action_text[: action_text.rfind(ANSWER_OPEN, 0, action_text.find(ANSWER_CLOSE))]
            return f"{thought}{ANSWER_OPEN}{action.answer}{ANSWER_CLOSE}"
        return action_text


class TextFormat(ToolCallFormat):
    """asyncrl's own text protocol (char/byte models): the environment parses the turn itself."""

    name = "text"

    def find_call(self, text: str) -> FoundCall | str | None:
        action = parse_action(text)
        return (action.name, action.args, None) if isinstance(action, ToolCallAction) else None

    def call_start(self, text: str) -> int:
        return text.find("<tool>") if isinstance(parse_action(text), ToolCallAction) else -1

    def write_call(self, name: str, arguments: dict[str, object]) -> str:
        return f"<tool>{name}({args_text(None, arguments)})</tool>"

    def instructions(self) -> str:
        return "Call a tool with <tool>NAME(ARGS)</tool>."

    def to_action(self, text: str, tools: list[Tool]) -> str:
        return text

    def from_action(self, action_text: str, tools: list[Tool]) -> str:
        return action_text


def _json_object_at(text: str, start: int) -> tuple[dict[str, Any], int] | None:
    try:
        obj, end = jsontext.raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    return (obj, end) if isinstance(obj, dict) else None


def _call_of(obj: dict[str, Any], *arg_keys: str) -> FoundCall | str:
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return 'a tool call needs a "name"'
    cid = obj.get("id") if isinstance(obj.get("id"), str) else None
    for key in arg_keys:
        if key in obj:
            return name, obj[key], cid
    return name, {}, cid


class _TaggedFormat(ToolCallFormat):
    """A call opened by the tag ``OPEN``, its JSON right after it."""

    OPEN: ClassVar[str]

    def call_start(self, text: str) -> int:
        return text.find(self.OPEN)

    def find_call(self, text: str) -> FoundCall | str | None:
        at = text.find(self.OPEN)
        if at < 0:
            return None
        rest = text[at + len(self.OPEN) :].lstrip()  # the JSON after the tag
        return self._call_at(text, len(text) - len(rest))

    @abstractmethod
    def _call_at(self, text: str, start: int) -> FoundCall | str:
        """The call whose JSON starts at ``start``; a string (the reason) when it cannot be read."""


class HermesFormat(_TaggedFormat):
    """``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`` (Hermes, ChatML, Qwen2.5)."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def _call_at(self, text: str, start: int) -> FoundCall | str:
        found = _json_object_at(text, start)
        if found is None:
            return f"the JSON after {self.OPEN} does not parse"
        return _call_of(found[0], "arguments", "parameters")

    def write_call(self, name: str, arguments: dict[str, object]) -> str:
        return f"{self.OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{self.CLOSE}"

    def instructions(self) -> str:
        return (
            "To call a tool, reply with exactly:\n"
            f'{self.OPEN}\n{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}\n{self.CLOSE}'
        )


class Qwen25Format(HermesFormat):
    """Qwen2.5 writes Hermes-style calls."""

    name = "qwen25"


class Llama3JsonFormat(ToolCallFormat):
    """A bare JSON object ``{"name": NAME, "parameters": {...}}`` (Llama 3.1+ JSON tool calling)."""

    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    _START = re.compile(r"\{\s*\"name\"")

    def call_start(self, text: str) -> int:
        tag = text.find(self.PYTHON_TAG)
        m = self._START.search(text)
        return tag if tag >= 0 else (m.start() if m else -1)

    def find_call(self, text: str) -> FoundCall | str | None:
        body = text.replace(self.PYTHON_TAG, "")
        m = self._START.search(body)
        if m is None:
            return None
        found = _json_object_at(body, m.start())
        if found is None:
            return "the tool-call JSON does not parse"
        return _call_of(found[0], "parameters", "arguments")

    def write_call(self, name: str, arguments: dict[str, object]) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

    def instructions(self) -> str:
        return (
            "To call a tool, reply with only a JSON object of the form "
            '{"name": "<tool name>", "parameters": {<arguments as JSON>}}'
        )


class MistralFormat(_TaggedFormat):
    """``[TOOL_CALLS] [{"name": NAME, "arguments": {...}, "id": ID}]`` (Mistral v0.3; ID: 9 alphanumerics)."""

    name = "mistral"
    OPEN = "[TOOL_CALLS]"

    def _call_at(self, text: str, start: int) -> FoundCall | str:
        try:
            obj, _ = jsontext.raw_decode(text, start)
        except json.JSONDecodeError:
            return f"the JSON after {self.OPEN} does not parse"
        first = obj[0] if isinstance(obj, list) and obj else obj
        if not isinstance(first, dict):
            return f"{self.OPEN} needs a list of call objects"
        return _call_of(first, "arguments", "parameters")

    def write_call(self, name: str, arguments: dict[str, object]) -> str:
        call = {"name": name, "arguments": arguments, "id": self.call_id(0)}
        return f"{self.OPEN} {json.dumps([call], ensure_ascii=False)}"

    def instructions(self) -> str:
        return (
            f"To call a tool, reply with exactly:\n{self.OPEN} "
            '[{"name": "<tool name>", "arguments": {<arguments as JSON>}, "id": "<9 letters or digits>"}]'
        )


FORMATS: dict[str, type[ToolCallFormat]] = {
    "text": TextFormat,
    "hermes": HermesFormat,
    "qwen25": Qwen25Format,
    "llama3_json": Llama3JsonFormat,
    "mistral": MistralFormat,
}


def detect_format(chat_template: str | None) -> str:
    """``auto`` for an HF chat template, from the template's own tool-call markers (see the
    module docstring); Hermes only for a template that writes ``<tool_call>`` or no calls at all."""
    source = chat_template or ""
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source or "<|start_header_id|>" in source:
        return "llama3_json"
    return "hermes"


def make_format(name: str) -> ToolCallFormat:
    """The format ``model.tool_format`` names (``auto`` must be resolved first, see :func:`detect_format`)."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool_format {name!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[name]()
