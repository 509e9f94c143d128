"""What a chat template does, found by rendering small probe chats with it.

Model families differ in ways that decide how asyncrl can run multi-turn episodes with them, and
the template text alone does not say so reliably (Gemma 2 raises on a system message, Gemma 3
folds it into the first user turn, Mistral v0.3 moves it into the *last* user turn, Qwen3 strips
``<think>`` reasoning from assistant turns before the latest user query, Gemma and Mistral trim
message content). :func:`probe_template` renders a handful of chats whose contents are private-use
sentinels and reads the answers off the output (all of them: docs/models.md, "The preflight"). The
subtle ones: ``prefix_stable`` — the opening followed by an assistant turn is a prefix of the chat
holding that turn, and that chat of the chat with an observation appended (in ``observation_role``),
an ``eos_token`` the template writes only at the end of a closed chat (Phi) not counted;
``unstable_at`` names the first step where it is not. ``tool_role`` — the template names a ``tool``
role and a ``tool`` message renders (ChatML renders any role name). ``turn_end_id`` — the first of
the end ids whose text the template writes right after an assistant message (``None``: none).

Nothing here decides a mode or a format: callers (the preflight, the renderer's ``auto``
choices) read the profile.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from asyncrl.policy.messages import Message, ToolSchema

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SYS, _USER, _TURN, _OBS, _THINK = "\ue010", "\ue011", "\ue012", "\ue013", "\ue014"
_PROBE_TOOL = "zq_probe_tool"
_PROBE_ID = "a1b2c3d4e"  # 9 alphanumerics: the length Mistral's template demands
# Markers a template text holds when the model writes tool calls in that family's native way.
TOOL_MARKERS = (
    "<tool_call>",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "<|python_tag|>",
    "<|tool_call|>",
    "<|tool|>",
    '"parameters"',
    "<function=",
)
NAMES_TOOL_ROLE = re.compile(r"['\"]tool['\"]")
_ID_LENGTH = re.compile(r"(?:tool_call\.id|tool_call_id)\s*\|\s*length\s*!=\s*(\d+)")


@dataclass(frozen=True)
class TemplateProfile:
    """The answers of :func:`probe_template` (see the module docstring)."""

    system_supported: bool
    system_error: str | None
    tool_role: bool
    observation_role: str
    prefix_stable: bool
    unstable_at: str | None
    strips_reasoning: bool
    trims_content: bool
    end_ids: tuple[int, ...]
    turn_end_id: int | None
    turn_end_text: str | None
    renders_tools: bool
    tool_markers: tuple[str, ...]
    tool_call_id_length: int | None


class TemplateRenderer:
    """``apply_chat_template`` to text; a template's exception becomes ``(None, message)``."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def __call__(
        self, messages: list[Message], *, gen: bool = False, tools: list[ToolSchema] | None = None
    ) -> tuple[str | None, str | None]:
        try:
            out = self.tokenizer.apply_chat_template(
                cast("list[dict[str, str]]", messages),  # transformers' annotation; any JSON works
                tools=[dict(t) for t in tools] if tools is not None else None,
                tokenize=False,
                add_generation_prompt=gen,
            )
        except Exception as exc:  # jinja raise_exception, a missing role, a bad filter
            return None, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return str(out), None


def _observation(role: str, text: str) -> Message:
    if role == "tool":
        return {"role": "tool", "content": text, "tool_call_id": _PROBE_ID, "name": _PROBE_TOOL}
    return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}


def _system(render: TemplateRenderer) -> tuple[bool, str | None]:
    text, err = render([{"role": "system", "content": _SYS}, {"role": "user", "content": _USER}], gen=True)
    if text is None:
        return False, err
    return _SYS in text, None if _SYS in text else "the template drops the system message"


def _tool_role(render: TemplateRenderer, head: list[Message], source: str) -> bool:
    if not NAMES_TOOL_ROLE.search(source):  # ChatML renders any role name: that is not a tool role
        return False
    chat: list[Message] = [*head, {"role": "assistant", "content": _TURN}, _observation("tool", _OBS)]
    text, _ = render(chat, gen=True)
    return text is not None and _OBS in text


def _stability(render: TemplateRenderer, head: list[Message], role: str) -> str | None:
    """``None`` when prefix-stable, else the step where the rendering changed."""
    opening, err = render(head, gen=True)
    turn: list[Message] = [*head, {"role": "assistant", "content": _TURN}]
    closed, err2 = render(turn)
    grown, err3 = render([*turn, _observation(role, _OBS)], gen=True)
    if opening is None or closed is None or grown is None:
        return f"a probe chat does not render ({err or err2 or err3})"
    eos = render.tokenizer.eos_token
    if eos and closed.endswith(str(eos)) and not grown.startswith(closed):
        closed = closed[: -len(str(eos))]  # Phi: a closed chat ends with eos_token, an open one does not
    at = closed.find(_TURN)
    if at < 0 or closed[:at].rstrip() != opening.rstrip():  # a space before the turn is the model's
        return "the opening renders differently once the model's turn follows it"
    if not grown.startswith(closed):
        return f"the chat renders differently once an observation ({role} role) is added"
    return None


def _strips_reasoning(render: TemplateRenderer, head: list[Message]) -> bool:
    chat: list[Message] = [
        *head,
        {"role": "assistant", "content": f"<think>\n{_THINK}\n</think>\n\n{_TURN}"},
        {"role": "user", "content": "u2"},
    ]
    text, _ = render(chat, gen=True)
    return text is not None and _TURN in text and _THINK not in text


def _trims(render: TemplateRenderer, head: list[Message]) -> bool:
    padded: list[Message] = [*head[:-1], {"role": "user", "content": f" {_USER} \n"}]
    chat: list[Message] = [*padded, {"role": "assistant", "content": f" {_TURN} \n"}]
    text, _ = render(chat)
    return text is not None and (f" {_USER} \n" not in text or f" {_TURN} \n" not in text)


def closing_id(
    tokenizer: PreTrainedTokenizerBase, tail: str, end_ids: Sequence[int]
) -> tuple[int, str] | None:
    """The first of ``end_ids`` whose text starts ``tail`` (what a template writes after an assistant
    message's content), with that text."""
    for i in end_ids:
        eot = str(tokenizer.decode([int(i)], skip_special_tokens=False))
        if eot and tail.startswith(eot):
            return int(i), eot
    return None


def _turn_end(
    render: TemplateRenderer, tokenizer: PreTrainedTokenizerBase, head: list[Message], end_ids: Sequence[int]
) -> tuple[int | None, str | None]:
    text, _ = render([*head, {"role": "assistant", "content": _TURN}])
    if text is None or _TURN not in text:
        return None, None
    return closing_id(tokenizer, text[text.rfind(_TURN) + len(_TURN) :], end_ids) or (None, None)


PROBE_TOOLS: list[ToolSchema] = [
    {
        "type": "function",
        "function": {"name": _PROBE_TOOL, "description": "d", "parameters": {"type": "object"}},
    }
]
"""A tool list whose schema a template that renders tools shows by name."""


def renders_tools(render: TemplateRenderer) -> bool:
    """Whether the template shows a tool list passed as ``tools=``."""
    text, _ = render([{"role": "user", "content": _USER}], gen=True, tools=PROBE_TOOLS)
    return text is not None and _PROBE_TOOL in text


def probe_template(tokenizer: PreTrainedTokenizerBase, end_ids: Sequence[int]) -> TemplateProfile:
    """The :class:`TemplateProfile` of ``tokenizer``'s chat template (it must have one), with
    ``end_ids`` the model's end-of-turn candidates in order (see :func:`end_ids_of`)."""
    source = str(tokenizer.chat_template)
    render = TemplateRenderer(tokenizer)
    system_ok, system_error = _system(render)
    head: list[Message] = [{"role": "system", "content": _SYS}] if system_ok else []
    head.append({"role": "user", "content": _USER})
    tool_role = _tool_role(render, head, source)
    role = "tool" if tool_role else "user"
    turn_id, turn_text = _turn_end(render, tokenizer, head, end_ids)
    unstable = _stability(render, head, role)
    id_len = _ID_LENGTH.search(source)
    return TemplateProfile(
        system_supported=system_ok,
        system_error=system_error,
        tool_role=tool_role,
        observation_role=role,
        prefix_stable=unstable is None,
        unstable_at=unstable,
        strips_reasoning=_strips_reasoning(render, head),
        trims_content=_trims(render, head),
        end_ids=tuple(int(i) for i in end_ids),
        turn_end_id=turn_id,
        turn_end_text=turn_text,
        renders_tools=renders_tools(render),
        tool_markers=tuple(m for m in TOOL_MARKERS if m in source),
        tool_call_id_length=int(id_len.group(1)) if id_len else None,
    )


def end_ids_of(generation_eos: Any, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-turn candidates in order: every id of ``generation_config.eos_token_id`` (one id or
    a list, in the published order), then the tokenizer's eos token; duplicates dropped."""
    ids: list[int] = []
    if isinstance(generation_eos, int):
        ids.append(generation_eos)
    elif isinstance(generation_eos, (list, tuple)):
        ids.extend(int(i) for i in generation_eos)
    eos = tokenizer.eos_token_id
    if eos is not None:
        ids.append(int(eos))
    return list(dict.fromkeys(ids))
