"""OpenAI ``messages`` (+ ``tools``) to the renderer protocol, and a completion back to a reply.

The gateway keeps only the OpenAI-message conversion; every rendering decision (the chat layout,
the tools prompt, observation wrapping, template quirks, stop strings) is the episode renderer's
(:class:`asyncrl.policy.chat.Renderer`), so a gateway call sees the very layout an environment
episode would. How messages and tool calls map: docs/agents.md ("Tool calls").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from asyncrl import jsontext
from asyncrl.gateway.protocol import Message, ToolDef
from asyncrl.policy.chat import Renderer, TextRenderer
from asyncrl.policy.messages import Message as ChatMessage
from asyncrl.policy.messages import ToolSchema


def _arguments(raw: str) -> Any:
    try:
        return jsontext.loads(raw)
    except ValueError:
        return raw


def _single_param(tools: list[ToolDef], name: str) -> str:
    for t in tools:
        if t.function.name == name:
            props = list((t.function.parameters or {}).get("properties") or {})
            if len(props) == 1:
                return str(props[0])
    return "input"


@dataclass
class Reply:
    """A completion as the client sees it."""

    content: str | None
    reasoning: str | None
    calls: list[tuple[str, str, str]]
    """``(tool name, arguments JSON, call id)``; the first call only."""


class MessageRenderer:
    """Chat-completions conversion over one episode :class:`Renderer`."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.text = isinstance(renderer, TextRenderer)

    # -- prompts ---------------------------------------------------------------------------------
    def message(self, m: Message) -> ChatMessage:
        """One OpenAI message as a renderer message."""
        if m.role == "tool":
            return self.renderer.observation_message(m.text(), m.tool_call_id)
        out: ChatMessage = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "type": "function",
                    "id": tc.id,
                    "function": {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)},
                }
                for tc in m.tool_calls
            ]
        reasoning = (m.model_extra or {}).get("reasoning_content")
        if m.role == "assistant" and isinstance(reasoning, str) and reasoning:
            out["reasoning_content"] = reasoning
        return out

    def messages(self, msgs: list[Message]) -> list[ChatMessage]:
        return [self.message(m) for m in msgs]

    @staticmethod
    def schemas(tools: list[ToolDef]) -> list[ToolSchema] | None:
        return [cast("ToolSchema", t.model_dump(exclude_none=True)) for t in tools] or None

    def render(self, messages: list[Message], tools: list[ToolDef]) -> list[int]:
        """The whole chat with the assistant header (a first call, or one that does not extend)."""
        return self.renderer.render(self.messages(messages), self.schemas(tools))

    # -- completions -----------------------------------------------------------------------------
    def parse(self, ids: list[int], tools: list[ToolDef], first_id: int) -> Reply:
        """A completion as content, reasoning and ``(name, arguments JSON, id)`` of its first call;
        calls are read only when ``tools`` are offered. ``first_id`` numbers fresh call ids."""
        turn = self.renderer.parse(ids)
        if not tools or not turn.tool_calls:
            return Reply(turn.content, turn.reasoning, [])
        calls = []
        for k, c in enumerate(turn.tool_calls):
            name, args = c["function"]["name"], c["function"]["arguments"]
            if self.text:
                args = {_single_param(tools, name): args}
            fresh = c["id"] == self.renderer.fmt.call_id(0)  # the model wrote no usable id of its own
            cid = self.renderer.fmt.call_id(first_id + k) if fresh else c["id"]
            calls.append((name, args if isinstance(args, str) else json.dumps(args), cid))
        return Reply(turn.prefix if turn.prefix.strip() else None, turn.reasoning, calls)

    def token_strings(self, ids: list[int]) -> list[str]:
        return [str(self.renderer.tokenizer.decode([i], skip_special_tokens=False)) for i in ids]
