"""Chat messages as the renderers take them: OpenAI-style, typed."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class CallFunction(TypedDict):
    name: str
    arguments: Any
    """The parsed JSON arguments (a dict), or the raw text when they are not JSON."""


class ToolCall(TypedDict):
    type: str
    id: str
    function: CallFunction


class FunctionSchema(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: NotRequired[dict[str, Any]]
    """A JSON schema of the arguments."""


class ToolSchema(TypedDict):
    """An OpenAI-style tool: what chat templates take as ``tools=``."""

    type: str
    function: FunctionSchema


class Message(TypedDict):
    """``system``/``user``/``assistant`` (with ``tool_calls`` and ``reasoning_content``)/``tool``
    (with ``tool_call_id``); ``developer`` is taken as ``system``."""

    role: str
    content: NotRequired[str | None]
    tool_calls: NotRequired[list[ToolCall]]
    tool_call_id: NotRequired[str]
    reasoning_content: NotRequired[str]
    name: NotRequired[str]
