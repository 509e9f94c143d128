"""Conversations as token ids: chat templates, tool-call formats, and token-exact multi-turn.

An episode is a chat: a system message, the environment's prompt as the user message, then model
turns and environment observations in turn. A :class:`Renderer` turns that chat into token ids
*by appending only*:

* :meth:`Renderer.start` renders the opening messages (system + user + the assistant header);
* the model's turn is kept exactly as sampled — the ids are never decoded and re-encoded;
* :meth:`Renderer.observation` renders only the *new* messages (the tool result, and the next
  assistant header) as a delta and appends it.

So the ids the trainer sees are, by construction, the ids that were sampled plus rendered deltas;
the history is never re-rendered. :meth:`Renderer.reference_ids` renders the whole finished chat
once the way a framework that re-tokenises text would, and :func:`count_differences` counts where
the two disagree: every trajectory records that count (``retokenization_diff``), and the run
reports the share of inexact samples. Training never uses the re-rendered ids.

Two renderers:

:class:`TextRenderer`
    the char/byte models built from config: ``<bos> PROMPT`` then ``<obs> TEXT </obs>`` deltas,
    tool calls in asyncrl's ``<tool>NAME(ARGS)</tool>`` protocol.
:class:`HFChatRenderer`
    any Hugging Face tokenizer with a chat template. Tools are passed to the template as JSON
    schemas (``tools=``) when it renders them; otherwise (SmolLM2's template has no tools block
    and no tool role) a generated system prompt lists them with the call format. Observations go
    in the ``tool`` role when the template knows one, else in the ``user`` role wrapped as
    ``<tool_response>``. Deltas are cut out of the template's own rendering of a fixed probe chat,
    so any template that renders a chat as a prefix of its continuation works. Environment text
    is tokenised with special tokens split (an observation holding ``<|im_end|>`` stays text and
    cannot close the turn); the template's own markup keeps its special tokens.

End-of-turn ids come from the model's ``generation_config`` (every id of ``eos_token_id``, then
the tokenizer's eos token); the one the template writes after an assistant message closes a turn;
``model.stop_strings`` may add multi-token stop strings, found by incremental decoding in
:meth:`Renderer.cut_at_stop`. A turn that ended without its end-of-turn token (length, stop
string) gets it as the first token of the next delta, outside the loss mask.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.errors import UserError
from asyncrl.policy.template_probe import end_ids_of
from asyncrl.policy.toolcalls import ToolCallFormat, detect_format, make_format, tool_schema

if TYPE_CHECKING:
    from asyncrl.config import ModelConfig
    from asyncrl.envs.base import Tool

Message = dict[str, Any]


class ChatTemplateError(UserError, ValueError):
    """A tokenizer or chat template asyncrl cannot render episodes with; the message names the fix."""


def count_differences(ids: list[int], reference: list[int]) -> int:
    """Positions where ``ids`` and the re-rendered ``reference`` disagree, plus missing positions.

    Compared over ``len(ids)``: the template's closing text after the last message (which was
    never sampled) is not counted.
    """
    n = len(ids)
    diff = sum(1 for a, b in zip(ids, reference[:n], strict=False) if a != b)
    return diff + max(0, n - len(reference))


@dataclass
class Conversation:
    """One episode's chat, grown by appending: its messages and its token ids."""

    messages: list[Message]
    ids: list[int]
    tools: list[Tool] = field(default_factory=list)
    turn_closed: bool = True
    """Whether the last model turn ended with an end-of-turn token."""
    turn_ids: list[list[int]] = field(default_factory=list)
    """Each model turn's sampled ids, as sampled."""


class Renderer(ABC):
    """Turns an episode's chat into token ids and model turns into environment actions."""

    tokenizer: Any
    fmt: ToolCallFormat
    stop_token_ids: list[int]
    stop_strings: list[str]

    # -- the episode ---------------------------------------------------------------------------
    @abstractmethod
    def start(self, prompt: str, tools: list[Tool]) -> Conversation:
        """The opening of an episode: system and user messages, then the assistant header."""

    def add_model_turn(self, conv: Conversation, ids: list[int]) -> str:
        """Append a sampled turn (its ids kept as they are); return the environment's action text."""
        conv.ids.extend(ids)
        conv.turn_ids.append(list(ids))
        text = self.turn_text(ids)
        conv.messages.append({"role": "assistant", "content": text})
        conv.turn_closed = bool(ids) and ids[-1] in self.stop_token_ids
        return self.fmt.to_action(text, conv.tools)

    @abstractmethod
    def observation(self, conv: Conversation, text: str) -> list[int]:
        """The delta after a model turn: the observation message and the next assistant header.

        Does not change ``conv``; :meth:`add_observation` appends it.
        """

    def add_observation(self, conv: Conversation, text: str, ids: list[int]) -> None:
        conv.ids.extend(ids)
        conv.messages.append({"role": "observation", "content": text})
        conv.turn_closed = True

    @abstractmethod
    def reference_ids(self, conv: Conversation) -> list[int]:
        """The whole chat rendered and tokenised at once (the re-tokenising way), for the check."""

    def retokenization_diff(self, conv: Conversation) -> int:
        return count_differences(conv.ids, self.reference_ids(conv))

    @abstractmethod
    def spliced_ids(self, conv: Conversation) -> list[int] | None:
        """The whole chat rendered at once with each model turn's *sampled ids* spliced in (its
        text is never re-encoded); ``None`` if the template cannot be rendered that way."""

    def render_diff(self, conv: Conversation) -> int | None:
        """Tokens where the appended ids disagree with a whole-chat rendering of the same sampled
        turns: 0 means the deltas are exactly what the template renders (token-exact)."""
        ref = self.spliced_ids(conv)
        return None if ref is None else count_differences(conv.ids, ref)

    # -- text ----------------------------------------------------------------------------------
    def turn_text(self, ids: list[int]) -> str:
        """A model turn as text, without its end-of-turn token."""
        if ids and ids[-1] in self.stop_token_ids and self.strip_stop_token:
            ids = ids[:-1]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    strip_stop_token: bool = True

    def encode_content(self, text: str) -> list[int]:
        """Environment or model text as ids, special-token strings kept as plain text."""
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def cut_at_stop(self, ids: list[int]) -> int:
        """Tokens to keep of a sampled turn: up to the token that completes a stop string.

        Incremental decoding: the text of ``ids[:k]`` is checked as ``k`` grows, so a stop string
        spread over several tokens (or sharing a token with other text) is found at the first
        token where it is complete. ``len(ids)`` when no stop string occurs.
        """
        if not self.stop_strings:
            return len(ids)
        full = self.tokenizer.decode(ids, skip_special_tokens=False)
        if not any(s in full for s in self.stop_strings):
            return len(ids)
        for k in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:k], skip_special_tokens=False)
            if any(s in text for s in self.stop_strings):
                return k
        return len(ids)  # pragma: no cover - the full text held a stop string

    def demo_turn(self, action_text: str, tools: list[Tool]) -> list[int]:
        """Token ids of a demonstrated model turn (a canonical action), as the model would write it."""
        native = self.fmt.from_action(action_text, tools)
        return self.encode_content(native) + self.turn_end_ids()

    def turn_end_ids(self) -> list[int]:
        """What closes a model turn (the first end-of-turn token; none for the text protocol)."""
        return [self.stop_token_ids[0]] if self.stop_token_ids else []


# ---------------------------------------------------------------------------------------------
class TextRenderer(Renderer):
    """asyncrl's own layout for the char/byte models: ``<bos> PROMPT | turn | <obs> TEXT </obs> | ...``."""

    strip_stop_token = False

    def __init__(self, tokenizer: Any, stop_strings: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        ids = {
            t: tokenizer.convert_tokens_to_ids(t)
            for t in ("<bos>", "<obs>", "</obs>", "</tool>", "</answer>", "<eos>")
        }
        missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
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

    def start(self, prompt: str, tools: list[Tool]) -> Conversation:
        return Conversation(
            [{"role": "user", "content": prompt}], [self.bos, *self.encode_content(prompt)], tools
        )

    def observation(self, conv: Conversation, text: str) -> list[int]:
        return [self.obs_open, *self.encode_content(text), self.obs_close]

    def reference_ids(self, conv: Conversation) -> list[int]:
        out = [self.bos]
        for m in conv.messages:
            if m["role"] == "observation":
                out += [self.obs_open, *self.encode_content(m["content"]), self.obs_close]
            else:
                out += self.encode_content(m["content"])
        return out

    def spliced_ids(self, conv: Conversation) -> list[int] | None:
        out, turns = [self.bos], iter(conv.turn_ids)
        for m in conv.messages:
            if m["role"] == "observation":
                out += [self.obs_open, *self.encode_content(m["content"]), self.obs_close]
            elif m["role"] == "assistant":
                out += next(turns)
            else:
                out += self.encode_content(m["content"])
        return out

    def demo_turn(self, action_text: str, tools: list[Tool]) -> list[int]:
        return self.encode_content(action_text)  # the closing tag is the stop token

    def turn_end_ids(self) -> list[int]:
        return []


# ---------------------------------------------------------------------------------------------
_SENTINEL = re.compile("\ue000(\\d+)\ue001")
_PROBE_ASSISTANT = "\ue002"


def _mark(i: int) -> str:
    return f"\ue000{i}\ue001"


class HFChatRenderer(Renderer):
    """Episodes in a pretrained model's own chat template; see the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        tool_format: str,
        observation_role: str,
        system_prompt: str | None = None,
        stop_strings: list[str] | None = None,
        name: str = "the model",
    ) -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ChatTemplateError(
                f"{name} has no chat template (tokenizer_config.json / chat_template.jinja): asyncrl "
                "renders episodes with the model's own template; use an instruct/chat model, or add a "
                "template to the tokenizer (tokenizer.chat_template = ...; save_pretrained)"
            )
        self.template_source = template if isinstance(template, str) else str(template)
        self.fmt = make_format(detect_format(self.template_source) if tool_format == "auto" else tool_format)
        stops = [int(i) for i in eos_token_ids if i is not None]
        if not stops:
            raise ChatTemplateError(
                f"{name} names no end-of-turn token (generation_config.eos_token_id or the tokenizer's "
                "eos_token): add one, or a turn could never end"
            )
        self.stop_token_ids = list(dict.fromkeys(stops))
        self.stop_strings = list(stop_strings or [])
        self.eot_text = ""  # set by _probe_turn_end: the end id the template closes a turn with
        self.native_tools = self._renders_tools()
        if observation_role == "auto":
            observation_role = "tool" if re.search(r"['\"]tool['\"]", self.template_source) else "user"
        self.observation_role = observation_role
        self.system_prompt = system_prompt
        added = {str(t): int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self._added_ids = added
        self._added_re = (
            re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True)))
            if added
            else None
        )
        self._after_eot, self._tail = self._probe_turn_end()
        self._marked_delta = self._observation_delta(_mark(0))

    # -- probing the template --------------------------------------------------------------------
    def _apply(self, messages: list[Message], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        try:
            out = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=gen
            )
        except Exception as exc:  # jinja raises for chats a template refuses (e.g. a role it lacks)
            raise ChatTemplateError(f"the chat template cannot render this chat ({exc})") from None
        return str(out)

    def _renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "x"}]
        schema = [
            {
                "type": "function",
                "function": {"name": "zq_probe_tool", "description": "d", "parameters": {"type": "object"}},
            }
        ]
        try:
            return "zq_probe_tool" in self._apply(probe, schema, True)
        except ChatTemplateError:
            return False

    def _probe_turn_end(self) -> tuple[str, str]:
        """The template text after an assistant message's content: ``(after the eot, whole tail)``."""
        chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE_ASSISTANT}]
        text = self._apply(chat, None, False)
        at = text.rfind(_PROBE_ASSISTANT)
        if at < 0:
            raise ChatTemplateError("the chat template drops assistant messages; cannot render episodes")
        tail = text[at + len(_PROBE_ASSISTANT) :]
        for i in self.stop_token_ids:  # every end id counts; the one the template writes comes first
            eot = str(self.tokenizer.decode([i], skip_special_tokens=False))
            if eot and tail.startswith(eot):
                self.stop_token_ids = [i, *(j for j in self.stop_token_ids if j != i)]
                self.eot_text = eot
                return tail[len(eot) :], tail
        names = [str(self.tokenizer.decode([i], skip_special_tokens=False)) for i in self.stop_token_ids]
        raise ChatTemplateError(
            f"the chat template closes an assistant turn with {tail[:20]!r}, none of the end-of-turn "
            f"tokens {names} the model stops on (generation_config.eos_token_id and eos_token); add "
            "that token's id to generation_config.json's eos_token_id"
        )

    # -- messages ------------------------------------------------------------------------------
    def system_text(self, tools: list[Tool]) -> str:
        if self.system_prompt is not None:
            return self.system_prompt
        answer = "When you know the final answer, reply with <answer>ANSWER</answer> and nothing else."
        if not tools:
            return f"You are a helpful assistant. {answer}"
        if self.native_tools:
            return f"You are a helpful assistant with tools. Call a tool when it helps. {answer}"
        import json

        listing = "\n".join(json.dumps(tool_schema(t)) for t in tools)
        return (
            "You are a helpful assistant with tools.\n\n# Tools\n\nYou may call one of these tools:\n"
            f"<tools>\n{listing}\n</tools>\n\n{self.fmt.instructions()}\n"
            f"The result comes back in the next message. {answer}"
        )

    def _observation_message(self, text: str) -> Message:
        if self.observation_role == "tool":
            return {"role": "tool", "content": text}
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}

    def _chat_messages(self, conv: Conversation) -> list[Message]:
        out: list[Message] = []
        for m in conv.messages:
            out.append(self._observation_message(m["content"]) if m["role"] == "observation" else dict(m))
        return out

    def _schemas(self, tools: list[Tool]) -> list[dict[str, Any]] | None:
        return [tool_schema(t) for t in tools] if tools and self.native_tools else None

    # -- rendering with marked content -----------------------------------------------------------
    def _encode_marked(self, text: str, contents: list[str] | list[str | list[int]]) -> list[int] | None:
        """Tokenise template text whose message contents are sentinels, as the tokenizer would
        tokenise the filled-in text — except that special-token strings inside the contents stay
        text (environment text cannot close a turn). A content given as ids is spliced in as it
        is. ``None`` when the template did not copy every sentinel through verbatim (e.g. it
        JSON-escapes content).

        The tokenizer itself splits text at added tokens before pre-tokenising each piece, so
        splitting the filled-in text at the markup's added tokens and encoding each piece with
        special tokens split gives the same ids as encoding it whole, at every boundary."""
        found = list(_SENTINEL.finditer(text))
        if sorted(int(m.group(1)) for m in found) != list(range(len(contents))):
            return None
        ids: list[int] = []
        filled: list[str] = []
        protected: list[tuple[int, int]] = []  # content spans in the filled text
        pos = length = 0
        for m in found:
            filled.append(text[pos : m.start()])
            length += m.start() - pos
            pos = m.end()
            content = contents[int(m.group(1))]
            if isinstance(content, list):  # sampled ids: encode what came before, then splice
                ids += self._encode_outside("".join(filled), protected)
                ids += content
                filled, protected, length = [], [], 0
                continue
            filled.append(content)
            protected.append((length, length + len(content)))
            length += len(content)
        filled.append(text[pos:])
        return ids + self._encode_outside("".join(filled), protected)

    def _encode_outside(self, text: str, protected: list[tuple[int, int]]) -> list[int]:
        """Ids of ``text`` with added tokens matched only outside the ``protected`` spans."""
        ids: list[int] = []
        pos = 0
        for m in self._added_re.finditer(text) if self._added_re is not None else ():
            if any(lo < m.end() and m.start() < hi for lo, hi in protected):
                continue
            if m.start() > pos:
                ids += self.encode_content(text[pos : m.start()])
            ids.append(self._added_ids[m.group(0)])
            pos = m.end()
        if pos < len(text):
            ids += self.encode_content(text[pos:])
        return [int(i) for i in ids]

    def _encode_plain(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def start(self, prompt: str, tools: list[Tool]) -> Conversation:
        messages = [
            {"role": "system", "content": self.system_text(tools)},
            {"role": "user", "content": prompt},
        ]
        marked = [{"role": m["role"], "content": _mark(i)} for i, m in enumerate(messages)]
        ids = self._encode_marked(
            self._apply(marked, self._schemas(tools), True), [m["content"] for m in messages]
        )
        if ids is None:  # a template that transforms content: render it as it is
            ids = self._encode_plain(self._apply(messages, self._schemas(tools), True))
        return Conversation(messages, ids, list(tools))

    def _observation_delta(self, content: str) -> str:
        """Template text of an observation message and the next assistant header, after the
        previous assistant turn's end-of-turn token."""
        probe = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _PROBE_ASSISTANT},
        ]
        base = self._apply(probe, None, False)
        full = self._apply([*probe, self._observation_message(content)], None, True)
        if not full.startswith(base):
            raise ChatTemplateError(
                "the chat template renders a chat differently once a message is added (not prefix-stable); "
                "asyncrl cannot append turns token-exactly with it"
            )
        return full[len(base) :]

    def observation(self, conv: Conversation, text: str) -> list[int]:
        head = self._after_eot if conv.turn_closed else self._tail
        ids = self._encode_marked(head + self._marked_delta, [text])
        if ids is None:
            ids = self._encode_plain(head + self._observation_delta(text))
        return ids

    def reference_ids(self, conv: Conversation) -> list[int]:
        ends_open = bool(conv.messages) and conv.messages[-1]["role"] != "assistant"
        text = self._apply(self._chat_messages(conv), self._schemas(conv.tools), ends_open)
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def spliced_ids(self, conv: Conversation) -> list[int] | None:
        messages = self._chat_messages(conv)
        ends_open = bool(messages) and conv.messages[-1]["role"] != "assistant"
        marked = [{"role": m["role"], "content": _mark(i)} for i, m in enumerate(messages)]
        text = self._apply(marked, self._schemas(conv.tools), ends_open)
        contents: list[str | list[int]] = []
        turns = iter(conv.turn_ids)
        for m, original in zip(messages, conv.messages, strict=True):
            if original["role"] == "assistant":
                ids = next(turns)
                contents.append(ids[:-1] if ids and ids[-1] in self.stop_token_ids else list(ids))
            else:
                contents.append(str(m["content"]))
        return self._encode_marked(text, contents)


# ---------------------------------------------------------------------------------------------
def eos_ids(policy_model: Any, tokenizer: Any) -> list[int]:
    """End-of-turn ids: the generation config's ``eos_token_id`` (one or a list), then the tokenizer's."""
    gen = getattr(policy_model, "generation_config", None)
    return end_ids_of(getattr(gen, "eos_token_id", None) if gen is not None else None, tokenizer)


def make_renderer(cfg: ModelConfig, policy: Any) -> Renderer:
    """The renderer for ``cfg``'s tokenizer kind and tool format, over ``policy``'s tokenizer."""
    if cfg.tokenizer_kind in ("char", "byte"):
        if cfg.tool_format not in ("auto", "text"):
            raise ChatTemplateError(
                f"model.tool_format {cfg.tool_format!r} needs a pretrained model's chat template; the "
                "char/byte models speak asyncrl's text protocol (tool_format 'text' or 'auto')"
            )
        return TextRenderer(policy.tokenizer, cfg.stop_strings)
    return HFChatRenderer(
        policy.tokenizer,
        eos_token_ids=eos_ids(policy.model, policy.tokenizer),
        tool_format=cfg.tool_format,
        observation_role=cfg.observation_role,
        system_prompt=cfg.system_prompt,
        stop_strings=cfg.stop_strings,
        name=f"model {cfg.path!r}" if cfg.path else "the model",
    )
