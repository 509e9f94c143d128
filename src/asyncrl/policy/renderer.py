"""The renderer protocol (:class:`Renderer`) and asyncrl's own text layout (:class:`TextRenderer`).

The chat-template renderer and the factory are in :mod:`asyncrl.policy.chat`, whose docstring
describes the protocol and both renderers.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asyncrl.errors import UserError
from asyncrl.policy.exactness import count_differences
from asyncrl.policy.messages import Message, ToolCall, ToolSchema
from asyncrl.policy.toolcalls import ToolCallFormat, make_format, tool_schema

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.envs.base import Tool

_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
"""A call id every template accepts (Mistral's refuses any other)."""


def opening(system: str | None, user: str) -> list[Message]:
    """A chat's opening: the system message (when there is one) and the user's."""
    head: list[Message] = [{"role": "system", "content": system}] if system is not None else []
    return [*head, {"role": "user", "content": user}]


def call_id_of(m: Message) -> str | None:
    """The id of a message's (first) tool call; ``None`` when it has none."""
    calls = m.get("tool_calls")
    return str(calls[0]["id"]) if calls else None


class ChatTemplateError(UserError, ValueError):
    """A tokenizer or chat template asyncrl cannot render episodes with; the message names the fix."""


@dataclass
class AssistantTurn:
    """A sampled turn read back: what the environment and the gateway's client get."""

    text: str
    """The whole turn as text, without its end-of-turn token."""
    content: str
    """The text without the reasoning block (the action the environment parses)."""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: str | None = None
    """Why a started tool call could not be read (cut off, bad JSON); ``None`` when fine."""
    prefix: str = ""
    """The content before the tool call (what the gateway returns as ``content``)."""


@dataclass
class Conversation:
    """One episode's chat, grown turn by turn: its messages and (bridge mode) its token ids."""

    messages: list[Message]
    ids: list[int]
    tools: list[Tool] = field(default_factory=list)
    turn_ids: list[list[int]] = field(default_factory=list)
    """Each model turn's sampled ids, as sampled."""

    @property
    def schemas(self) -> list[ToolSchema]:
        return [tool_schema(t) for t in self.tools]


class Renderer(ABC):
    """Turns chats into token ids and sampled turns back into messages; see :mod:`asyncrl.policy.chat`."""

    tokenizer: PreTrainedTokenizerBase
    fmt: ToolCallFormat
    stop_token_ids: list[int]
    stop_strings: list[str]
    multi_turn: str = "bridge"
    """``bridge`` or ``per_turn`` (resolved from ``model.multi_turn``)."""
    prefix_stable: bool = True
    """Whether appending a message only appends text (probed for chat templates)."""
    strip_stop_token: bool = True

    # -- the protocol --------------------------------------------------------------------------
    @abstractmethod
    def render(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        """``messages`` rendered with the next assistant header (ready to sample)."""

    @abstractmethod
    def bridge(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        history: list[Message],
        new: list[Message],
        tools: list[ToolSchema] | None,
    ) -> list[int] | None:
        """The next prompt: ``prompt_ids + completion_ids`` + the delta of ``new`` after
        ``history`` (which ends with the sampled assistant turn); ``None`` if not prefix-stable."""

    def parse(self, completion_ids: list[int]) -> AssistantTurn:
        """A sampled turn as content, reasoning and (the first) tool call."""
        text = self.turn_text(completion_ids)
        reasoning, content = self.split_reasoning(text)
        found = self.fmt.find_call(content)
        turn = AssistantTurn(text, content, reasoning)
        if isinstance(found, str):
            turn.malformed = found
        elif found is not None:
            name, arguments, cid = found
            cid = cid if cid is not None and _CALL_ID.fullmatch(cid) else self.fmt.call_id(0)
            turn.tool_calls.append(
                {"type": "function", "id": cid, "function": {"name": name, "arguments": arguments}}
            )
        at = self.fmt.call_start(content)
        turn.prefix = content if at < 0 else content[:at]
        return turn

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, the rest)``; no reasoning for templates without a reasoning block."""
        return None, text

    def tool_prompt(self, tools: list[ToolSchema]) -> str:
        """The one tools system prompt, for templates that cannot list tools themselves."""
        listing = "\n".join(json.dumps(t) for t in tools)
        return (
            "# Tools\n\nYou may call one of these tools:\n"
            f"<tools>\n{listing}\n</tools>\n\n{self.fmt.instructions()}\n"
            "The result comes back in the next message."
        )

    def observation_message(self, text: str, call_id: str | None = None) -> Message:
        """The one observation message: a tool result (or other environment feedback)."""
        m: Message = {"role": "tool", "content": text}
        if call_id is not None:
            m["tool_call_id"] = call_id
        return m

    def malformed_message(self, reason: str) -> str:
        """What the model is told when its tool call could not be read — in its own format."""
        return f"error: the tool call could not be read ({reason}). {self.fmt.instructions()}"

    def assistant_message(self, turn: AssistantTurn) -> Message:
        """A parsed turn as the assistant message a client would send back."""
        return {"role": "assistant", "content": turn.text}

    @abstractmethod
    def reference_ids(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        """The whole chat rendered as text and tokenised anew (what a re-tokenising framework trains)."""

    # -- episodes: the protocol applied to an environment's chat ---------------------------------
    def system_text(self, tools: list[Tool]) -> str | None:
        return None

    def start(self, prompt: str, tools: list[Tool]) -> Conversation:
        """The opening of an episode: (system and) user message, then the assistant header."""
        conv = Conversation(opening(self.system_text(tools), prompt), [], list(tools))
        conv.ids = self.render(conv.messages, conv.schemas or None)
        return conv

    def add_model_turn(self, conv: Conversation, ids: list[int]) -> str:
        """Append a sampled turn (its ids kept as they are); return the environment's action text."""
        conv.ids.extend(ids)
        conv.turn_ids.append(list(ids))
        turn = self.parse(ids)
        conv.messages.append(self.assistant_message(turn))
        return self.fmt.to_action(turn.content, conv.tools)

    def closes_turn(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] == self.stop_token_ids[0]

    def observation(self, conv: Conversation, text: str) -> list[int]:
        """The delta after a model turn: the observation message and the next assistant header.

        Does not change ``conv``; :meth:`add_observation` appends it."""
        msg = self.observation_message(text, self._last_call_id(conv))
        out = self.bridge(conv.ids, [], conv.messages, [msg], conv.schemas or None)
        if out is None:
            raise ChatTemplateError(
                "the chat template renders this chat differently once a message is added (not "
                "prefix-stable); set model.multi_turn: per_turn (or auto)"
            )
        return out[len(conv.ids) :]

    def add_observation(self, conv: Conversation, text: str, ids: list[int]) -> None:
        conv.ids.extend(ids)
        conv.messages.append(self.observation_message(text, self._last_call_id(conv)))

    def next_prompt(self, conv: Conversation, text: str) -> list[int]:
        """``per_turn`` mode: the chat so far plus the observation, rendered whole by the template."""
        msg = self.observation_message(text, self._last_call_id(conv))
        return self.render([*conv.messages, msg], conv.schemas or None)

    def _last_call_id(self, conv: Conversation) -> str | None:
        return call_id_of(conv.messages[-1]) if conv.messages else None

    def retokenization_diff(self, conv: Conversation) -> int:
        return count_differences(conv.ids, self.reference_ids(conv.messages, conv.schemas or None))

    def splice(
        self, messages: list[Message], turn_ids: list[list[int]], tools: list[ToolSchema] | None
    ) -> list[int] | None:
        """The whole chat rendered at once with each assistant message replaced by the *sampled
        ids* of its turn (``turn_ids``, in order; its text never re-encoded); ``None`` if the
        template cannot be rendered that way."""
        return None

    def spliced_diff(
        self,
        ids: list[int],
        messages: list[Message],
        turn_ids: list[list[int]],
        tools: list[ToolSchema] | None,
    ) -> int | None:
        """Tokens where ``ids`` (sampled turns + rendered deltas) disagree with :meth:`splice` of
        the same chat: 0 means the deltas are exactly what the template renders. ``None`` when that
        cannot be checked: the template is not prefix-stable (a whole-chat rendering differs from
        the prompts it gave by design), cannot render the chat, or its assistant messages are not
        the sampled turns one for one (a chat a gateway client wrote turns into)."""
        if not self.prefix_stable or sum(m["role"] == "assistant" for m in messages) != len(turn_ids):
            return None
        try:
            ref = self.splice(messages, turn_ids, tools)
        except ChatTemplateError:
            return None
        return None if ref is None else count_differences(ids, ref)

    def render_diff(self, conv: Conversation) -> int | None:
        """:meth:`spliced_diff` of an episode's bridged chat (``None``: not checkable)."""
        return self.spliced_diff(conv.ids, conv.messages, conv.turn_ids, conv.schemas or None)

    # -- text ----------------------------------------------------------------------------------
    def turn_text(self, ids: list[int]) -> str:
        """A model turn as text, without its end-of-turn token."""
        if ids and ids[-1] in self.stop_token_ids and self.strip_stop_token:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def encode_content(self, text: str) -> list[int]:
        """Environment or model text as ids, special-token strings kept as plain text."""
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def cut_at_stop(self, ids: list[int], extra: list[str] | None = None) -> int:
        """Tokens to keep of a sampled turn: up to the token that completes a stop string
        (``model.stop_strings`` and a request's ``extra`` ones); ``len(ids)`` when none occurs.

        The text of ``ids[:k]`` only grows with ``k``, so the first ``k`` whose text holds a stop string
        (spread over several tokens or not) is found by bisection, in ``O(log n)`` decodes: a long reply
        whose stop string comes late does not hold the gateway's event loop for seconds.
        """
        stops = [*self.stop_strings, *(extra or [])]
        if not stops:
            return len(ids)

        def holds(k: int) -> bool:
            text = self.tokenizer.decode(ids[:k], skip_special_tokens=False)
            return any(s in text for s in stops)

        if not holds(len(ids)):
            return len(ids)
        lo, hi = 1, len(ids)  # holds(hi); find the smallest such k
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
        return lo

    def demo_turn(self, action_text: str, tools: list[Tool]) -> list[int]:
        """Token ids of a demonstrated model turn (a canonical action), as the model would write it."""
        native = self.fmt.from_action(action_text, tools)
        return self.encode_content(native) + self.turn_end_ids()

    def turn_end_ids(self) -> list[int]:
        """What closes a model turn (the template's end-of-turn token; none for the text protocol)."""
        return [self.stop_token_ids[0]] if self.stop_token_ids else []


# ---------------------------------------------------------------------------------------------
class TextRenderer(Renderer):
    """asyncrl's own layout for the char/byte models: ``<bos> PROMPT | turn | <obs> TEXT </obs> | ...``."""

    strip_stop_token = False

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_strings: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        ids: dict[str, int] = {}
        for t in ("<bos>", "<obs>", "</obs>", "</tool>", "</answer>", "<eos>"):
            i = tokenizer.convert_tokens_to_ids(t)  # one token in, one id (or None) out
            if isinstance(i, int) and i != tokenizer.unk_token_id:
                ids[t] = i
        missing = [t for t in ("<bos>", "<obs>", "</obs>", "</tool>", "</answer>", "<eos>") if t not in ids]
        if missing:
            raise ChatTemplateError(
                f"this tokenizer lacks asyncrl's text-protocol tokens {missing}: it is not a char/byte "
                "tokenizer built by asyncrl; for a pretrained model use model.tokenizer=hf (the default "
                "when model.path is set)"
            )
        self.bos, self.obs_open, self.obs_close = ids["<bos>"], ids["<obs>"], ids["</obs>"]
        self.stop_token_ids = [ids["</tool>"], ids["</answer>"], ids["<eos>"]]
        self.stop_strings = list(stop_strings or [])
        self.fmt = make_format("text")

    def encode_content(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _messages(self, messages: list[Message]) -> list[int]:
        out: list[int] = []
        for m in messages:
            text = str(m.get("content") or "")
            if m["role"] == "tool":
                out += [self.obs_open, *self.encode_content(text), self.obs_close]
                continue
            out += self.encode_content(text)
            for call in self.fmt.write_calls(m.get("tool_calls") or []):
                out += self.encode_content(call)
        return out

    def render(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        return [self.bos, *self._messages(messages)]

    def bridge(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        history: list[Message],
        new: list[Message],
        tools: list[ToolSchema] | None,
    ) -> list[int]:
        return [*prompt_ids, *completion_ids, *self._messages(new)]

    def parse(self, completion_ids: list[int]) -> AssistantTurn:
        ids = completion_ids
        if ids and ids[-1] == self.stop_token_ids[-1]:  # <eos> ends a text-protocol turn
            ids = ids[:-1]
        return super().parse(ids)

    def closes_turn(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] in self.stop_token_ids

    def reference_ids(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        return self.render(messages, tools)

    def splice(
        self, messages: list[Message], turn_ids: list[list[int]], tools: list[ToolSchema] | None
    ) -> list[int] | None:
        out, turns = [self.bos], iter(turn_ids)
        for m in messages:
            out += next(turns) if m["role"] == "assistant" else self._messages([m])
        return out

    def malformed_message(self, reason: str) -> str:
        return f"error: {reason}"

    def demo_turn(self, action_text: str, tools: list[Tool]) -> list[int]:
        return self.encode_content(action_text)  # the closing tag is the stop token

    def turn_end_ids(self) -> list[int]:
        return []
