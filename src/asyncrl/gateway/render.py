"""OpenAI ``messages`` (+ ``tools``) as prompt token ids, and a completion as content + ``tool_calls``.

Built on the episode renderers of :mod:`asyncrl.policy.chat`, so a gateway call sees the very
layout an environment episode would:

* char/byte models (:class:`~asyncrl.policy.chat.TextRenderer`): ``<bos>`` + system/user text,
  assistant turns as their text with tool calls written ``<tool>NAME(ARGS)</tool>``, tool results
  as ``<obs> TEXT </obs>``. A completion's ``<tool>NAME(ARGS)</tool>`` is reported as a tool call
  whose arguments are ``{"<the tool's single parameter>": ARGS}`` (``input`` when unknown).
* pretrained models (:class:`~asyncrl.policy.chat.HFChatRenderer`): the model's chat template
  with the request's ``tools`` as JSON schemas, message contents tokenised with special tokens
  split (a client cannot inject ``<|im_end|>``); tool calls in the model's format.

:meth:`MessageRenderer.delta` renders only the messages that follow an assistant turn (tool
results, a new user message) plus the next assistant header: the gateway appends it to the
previous call's prompt + sampled completion, so an agent's ordinary loop yields prompts that
extend each other token-exactly (the sampled ids are never decoded and re-encoded).
"""

from __future__ import annotations

import json
from typing import Any

from asyncrl.gateway.protocol import Message, ToolDef
from asyncrl.policy.chat import ChatTemplateError, HFChatRenderer, Renderer, TextRenderer, _mark


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _single_param(tools: list[ToolDef], name: str) -> str:
    for t in tools:
        if t.function.name == name:
            props = list((t.function.parameters or {}).get("properties") or {})
            if len(props) == 1:
                return str(props[0])
    return "input"


class MessageRenderer:
    """Chat-completions rendering over one episode :class:`Renderer`."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.text = isinstance(renderer, TextRenderer)

    # -- prompts ---------------------------------------------------------------------------------
    def render(self, messages: list[Message], tools: list[ToolDef]) -> list[int]:
        """The whole chat with the assistant header (a first call, or one that does not extend)."""
        if isinstance(self.renderer, TextRenderer):
            return [self.renderer.bos, *self._text_delta(messages)]
        return self._hf_render(self._with_tool_prompt(messages, tools), tools)

    def _with_tool_prompt(self, messages: list[Message], tools: list[ToolDef]) -> list[Message]:
        """For a template that cannot render tools: list them (and the call format) in the system
        message, as :meth:`HFChatRenderer.system_text` does for environment episodes."""
        r = self.renderer
        if not tools or not isinstance(r, HFChatRenderer) or r.native_tools:
            return messages
        listing = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
        text = (
            "# Tools\n\nYou may call one of these tools:\n"
            f"<tools>\n{listing}\n</tools>\n\n{r.fmt.instructions()}\n"
            "The result comes back in the next message."
        )
        if messages and messages[0].role in ("system", "developer"):
            first = messages[0].model_copy(update={"content": f"{messages[0].text()}\n\n{text}"})
            return [first, *messages[1:]]
        return [Message(role="system", content=text), *messages]

    def delta(
        self, before: list[Message], new: list[Message], tools: list[ToolDef], closed: bool
    ) -> list[int]:
        """Ids of ``new`` (messages after the assistant turn that ends ``before``) + the next header.

        ``closed``: whether the sampled turn ended with its end-of-turn token; if not, the
        template's turn end is rendered first (outside the loss mask)."""
        if isinstance(self.renderer, TextRenderer):
            return self._text_delta(new)
        assert isinstance(self.renderer, HFChatRenderer)
        r = self.renderer
        schemas = self._schemas(tools)
        before = self._with_tool_prompt(before, tools)
        base = r._apply(self._hf_messages(before), schemas, False)
        marked = [self._hf_message(m, _mark(i)) for i, m in enumerate(new)]
        full = r._apply(self._hf_messages(before) + marked, schemas, True)
        if not full.startswith(base):
            raise ChatTemplateError("the chat template is not prefix-stable for these messages")
        head = r._after_eot if closed else r._tail
        ids = r._encode_marked(head + full[len(base) :], [m.text() for m in new])
        if ids is None:
            raise ChatTemplateError("the chat template transforms message contents")
        return ids

    def _text_delta(self, messages: list[Message]) -> list[int]:
        r = self.renderer
        assert isinstance(r, TextRenderer)
        out: list[int] = []
        for m in messages:
            if m.role == "tool":
                out += [r.obs_open, *r.encode_content(m.text()), r.obs_close]
            elif m.role == "assistant":
                out += r.encode_content(m.text())
                for tc in m.tool_calls or []:
                    out += r.encode_content(
                        r.fmt.write_call(tc.function.name, _as_dict(tc.function.arguments))
                    )
            else:
                out += r.encode_content(m.text())
        return out

    def _schemas(self, tools: list[ToolDef]) -> list[dict[str, Any]] | None:
        r = self.renderer
        if not tools or not (isinstance(r, HFChatRenderer) and r.native_tools):
            return None
        return [t.model_dump(exclude_none=True) for t in tools]

    def _hf_message(self, m: Message, content: str | None = None) -> dict[str, Any]:
        role = "system" if m.role == "developer" else m.role
        out: dict[str, Any] = {"role": role, "content": m.text() if content is None else content}
        if m.role == "tool":
            r = self.renderer
            if isinstance(r, HFChatRenderer) and r.observation_role != "tool":
                text = m.text() if content is None else content
                out = {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)},
                }
                for tc in m.tool_calls
            ]
        return out

    def _hf_messages(self, messages: list[Message]) -> list[dict[str, Any]]:
        return [self._hf_message(m) for m in messages]

    def _hf_render(self, messages: list[Message], tools: list[ToolDef]) -> list[int]:
        r = self.renderer
        assert isinstance(r, HFChatRenderer)
        schemas = self._schemas(tools)
        marked = [self._hf_message(m, _mark(i)) for i, m in enumerate(messages)]
        ids = r._encode_marked(r._apply(marked, schemas, True), [m.text() for m in messages])
        if ids is None:
            ids = r._encode_plain(r._apply(self._hf_messages(messages), schemas, True))
        return ids

    # -- completions -----------------------------------------------------------------------------
    def parse(self, ids: list[int], tools: list[ToolDef]) -> tuple[str | None, list[tuple[str, str]]]:
        """A completion as ``(content, [(tool name, arguments JSON)])``; the first call only."""
        r = self.renderer
        if self.text and ids and ids[-1] == r.stop_token_ids[-1]:  # <eos> ends a text-protocol turn
            ids = ids[:-1]
        text = r.turn_text(ids)
        found = r.fmt.find_call(text) if tools else None
        if not isinstance(found, tuple):
            return text, []
        name, args = found
        if self.text:
            arguments = json.dumps({_single_param(tools, name): args})
            at = text.find("<tool>")
            content = text[:at] if at > 0 else None
        else:
            arguments = args if isinstance(args, str) else json.dumps(args)
            content = None
        return content, [(name, arguments)]

    def token_strings(self, ids: list[int]) -> list[str]:
        return [str(self.renderer.tokenizer.decode([i], skip_special_tokens=False)) for i in ids]


def _as_dict(arguments: str) -> dict[str, Any]:
    parsed = _arguments(arguments)
    return parsed if isinstance(parsed, dict) else {"input": parsed}
