"""Conversations as token ids: ONE renderer protocol for episodes, evaluation and the gateway.

A :class:`Renderer` is the only place that knows a model's chat layout. Every caller — the
environment episode runner, held-out evaluation, the OpenAI-compatible gateway — goes through its
public protocol (after PrimeIntellect's renderers and verifiers):

* :meth:`Renderer.render` ``(messages, tools) -> ids``: a chat (:class:`~asyncrl.policy.messages.Message`
  dicts) rendered with the assistant header, ready to sample;
* :meth:`Renderer.bridge` ``(prompt_ids, completion_ids, history, new, tools) -> ids | None``: the
  next prompt as the previous prompt + the *sampled* completion ids + the rendered delta of the
  ``new`` messages; ``None`` when the template renders the longer chat differently (not
  prefix-stable for it);
* :meth:`Renderer.parse` ``(completion_ids) -> AssistantTurn``: content, reasoning and tool calls;
* ``stop_token_ids`` and :meth:`Renderer.cut_at_stop` (the one stop-string cut);
* :meth:`Renderer.tool_prompt` (the one tools system prompt, for templates that cannot list
  tools) and :meth:`Renderer.observation_message` (the one observation wrapping).

Sampled ids are never changed. :class:`TextRenderer` is asyncrl's own layout for the char/byte
models (tool calls in the ``<tool>NAME(ARGS)</tool>`` protocol); :class:`HFChatRenderer` renders with a
Hugging Face tokenizer's chat template, adapting the messages to what the template takes (tools, the
observation role, a missing system role) and taking contents the template trims or rewrites from its
real rendering, so the ids are always what the template renders. The ``bridge`` and ``per_turn``
modes, those adaptations and the end-of-turn ids: ``docs/models.md#episodes-are-chats`` and
``docs/models.md#token-exact-multi-turn-by-construction``.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from asyncrl.policy.messages import CallFunction, Message, ToolSchema
from asyncrl.policy.renderer import (
    AssistantTurn,
    ChatTemplateError,
    Conversation,
    Renderer,
    TextRenderer,
    call_id_of,
    opening,
)
from asyncrl.policy.template_probe import (
    NAMES_TOOL_ROLE,
    PROBE_TOOLS,
    TemplateRenderer,
    closing_id,
    end_ids_of,
    renders_tools,
)
from asyncrl.policy.toolcalls import detect_format, make_format

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from asyncrl.config import ModelConfig
    from asyncrl.envs.base import Tool
    from asyncrl.policy.model import Policy

__all__ = ["ChatTemplateError", "Conversation", "Message", "Renderer", "TextRenderer"]  # re-exported
ANSWER_HINT = "When you know the final answer, reply with <answer>ANSWER</answer> and nothing else."


# ---------------------------------------------------------------------------------------------
_PROBE = "\ue002"
_PRIVATE_USE = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))
Spans = tuple[str, list[tuple[int, int]]]
"""Template text and the character spans of message contents in it (encoded with specials split)."""


class _Marks:
    """Marks ``OPEN index CLOSE`` for contents, made of two (private-use) characters that occur in
    none of ``texts``: a rendering holds them only where they were put, whatever the chat's text
    (a fixed mark could be written by an environment or a model, and would be taken for one)."""

    def __init__(self, *texts: str) -> None:
        seen = set("".join(texts))
        free = (chr(c) for span in _PRIVATE_USE for c in span if chr(c) not in seen)
        self.open, self.close = next(free, ""), next(free, "")
        if not self.close:  # every private-use character in the chat: no mark is safe
            raise ChatTemplateError("this chat holds every private-use character; cannot mark its contents")
        self.pattern = re.compile(f"{re.escape(self.open)}(\\d+){re.escape(self.close)}")

    def __call__(self, i: int) -> str:
        return f"{self.open}{i}{self.close}"


def _forms(content: str) -> list[str]:
    """What a template may leave of a content: all of it, or with its surrounding whitespace
    trimmed (Jinja's ``trim`` is ``str.strip``) on both sides or one."""
    return list(dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())))


def _between(literals: list[str], text: str, contents: list[str] | None = None) -> list[str] | None:
    """The pieces of ``text`` between consecutive ``literals`` (``text`` = L0 + c0 + L1 + ... + Ln).

    Piece ``k`` is ``contents[k]`` as the template may have left it (:func:`_forms`) where that is
    followed by the next literal, else the text up to the literal's first occurrence (a template
    that rewrites the content); the first choice that leads to a whole split wins. A content that
    holds a copy of the markup after it is so found whole, not cut at the copy. Without
    ``contents`` this is the first-occurrence scan: where it fails, so does any other split (each
    literal can only come later there), so there is nothing to backtrack to."""
    if len(literals) == 1 or not text.startswith(literals[0]):
        return [] if text == literals[0] else None
    last, tail = len(literals) - 2, len(text) - len(literals[-1])
    if not text.endswith(literals[-1]):
        return None

    def ends(k: int, pos: int) -> list[int]:
        """Where piece ``k``, starting at ``pos``, may end: its content's forms, then the scan."""
        lit, out = literals[k + 1], []
        for form in _forms(contents[k]) if contents is not None else ():
            end = pos + len(form)
            if text.startswith(form, pos) and (end == tail if k == last else text.startswith(lit, end)):
                out.append(end)
        at = tail if k == last else text.find(lit, pos)
        return [*out, at] if at >= pos and at not in out else out

    # depth-first over the choices, without recursion (an episode has many contents); a piece
    # start that led nowhere once is not tried again
    starts, pieces, failed = [len(literals[0])], list[str](), set[tuple[int, int]]()
    choices = [iter(ends(0, starts[0]))]
    while choices:
        k = len(choices) - 1
        end = next(choices[k], None)
        if end is None:
            failed.add((k, starts.pop()))
            choices.pop()
            if pieces:
                pieces.pop()
            continue
        if k == last:
            return [*pieces, text[starts[k] : end]]
        nxt = end + len(literals[k + 1])
        if (k + 1, nxt) in failed:
            continue
        pieces.append(text[starts[k] : end])
        starts.append(nxt)
        choices.append(iter(ends(k + 1, nxt)))
    return None


class HFChatRenderer(Renderer):
    """Chats in a pretrained model's own chat template; see the module docstring and docs/models.md."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_token_ids: list[int],
        tool_format: str,
        observation_role: str,
        multi_turn: str,
        system_prompt: str | None = None,
        stop_strings: list[str] | None = None,
        name: str = "the model",
    ) -> None:
        self.tokenizer = tokenizer
        self._render = TemplateRenderer(tokenizer)
        template = tokenizer.chat_template
        if not template:
            raise ChatTemplateError(
                f"{name} has no chat template (tokenizer_config.json / chat_template.jinja): asyncrl "
                "renders episodes with the model's own template; use an instruct/chat model, or add a "
                "template to the tokenizer (tokenizer.chat_template = ...; save_pretrained)"
            )
        self.template_source = template if isinstance(template, str) else str(template)
        self.fmt = make_format(detect_format(self.template_source) if tool_format == "auto" else tool_format)
        stops = list(dict.fromkeys(int(i) for i in eos_token_ids if i is not None))
        if not stops:
            raise ChatTemplateError(
                f"{name} names no end-of-turn token (generation_config.eos_token_id or the tokenizer's "
                "eos_token): add one, or a turn could never end"
            )
        self.stop_strings = list(stop_strings or [])
        self.system_prompt = system_prompt
        self.thinks = "</think>" in self.template_source
        if observation_role == "auto":
            observation_role = "tool" if NAMES_TOOL_ROLE.search(self.template_source) else "user"
        self.observation_role = observation_role
        self._added_ids = {str(t): int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        longest_first = sorted(self._added_ids, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        self.systemless = not self._accepts(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        )
        self.alternates = not self._accepts(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
        self.native_tools = renders_tools(self._render)
        self.native_calls = self._renders_calls()
        if self.native_calls:
            self._check_call_format(tool_format)
        self.stop_token_ids = self._probe_turn_end(stops)
        self.eot_text = str(tokenizer.decode([self.stop_token_ids[0]], skip_special_tokens=False))
        self.prefix_stable = self._prefix_stable()
        auto = "bridge" if self.prefix_stable else "per_turn"
        self.multi_turn = auto if multi_turn == "auto" else multi_turn

    # -- probing the template --------------------------------------------------------------------
    def _apply(self, messages: list[Message], tools: list[ToolSchema] | None, gen: bool) -> str:
        out, error = self._render(messages, gen=gen, tools=tools)
        if out is None:  # jinja raises for chats a template refuses (e.g. a role it lacks)
            raise ChatTemplateError(f"the chat template cannot render this chat ({error})")
        return out

    def _accepts(self, messages: list[Message]) -> bool:
        return self._render(messages, gen=True)[0] is not None

    def _renders_calls(self) -> bool:
        text, _ = self._render([{"role": "user", "content": "x"}, self._probe_assistant(0)])
        return text is not None and "zq_probe_call" in text

    def _check_call_format(self, tool_format: str) -> None:
        """A template that writes tool calls must write them in the format asyncrl reads."""
        text = self._apply([{"role": "user", "content": _PROBE}, self._probe_assistant(0)], None, False)
        found = self.fmt.find_call(text[text.rfind(_PROBE) + 1 :])
        if not (isinstance(found, tuple) and found[0] == "zq_probe_call"):
            how = "read from the template" if tool_format == "auto" else "set"
            raise ChatTemplateError(
                f"the chat template writes tool calls in a format other than {self.fmt.name!r} ({how} by "
                "model.tool_format); set model.tool_format to the template's own format (hermes, "
                "llama3_json, mistral)"
            )

    def _probe_turn_end(self, stops: list[int]) -> list[int]:
        """The stop ids with the one the template closes an assistant turn with first."""
        chat: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
        text = self._apply(chat, None, False)
        at = text.rfind(_PROBE)
        if at < 0:
            raise ChatTemplateError("the chat template drops assistant messages; cannot render episodes")
        tail = text[at + len(_PROBE) :]
        if found := closing_id(self.tokenizer, tail, stops):
            return [found[0], *(s for s in stops if s != found[0])]
        names = [str(self.tokenizer.decode([i], skip_special_tokens=False)) for i in stops]
        raise ChatTemplateError(
            f"the chat template closes an assistant turn with {tail[:20]!r}, none of the end-of-turn "
            f"tokens {names} the model stops on (generation_config.eos_token_id and eos_token); add "
            "that token's id to generation_config.json's eos_token_id"
        )

    def _prefix_stable(self) -> bool:
        """Whether rendering a chat and then appending a message only appends (the probe chat has
        reasoning, a tool call and an observation when the template has them)."""
        for reasoning in (False, True) if self.thinks else (False,):
            for calls in (False, True) if self.native_calls else (False,):
                history = [*opening("s", "u"), self._probe_assistant(0, reasoning, calls)]
                try:
                    for k in range(1, 3):
                        new = [self.observation_message("o", call_id_of(history[-1]))]
                        if self.bridge([], [], history, new, PROBE_TOOLS) is None:
                            return False
                        history = [*history, *new, self._probe_assistant(k, reasoning, calls)]
                except ChatTemplateError:
                    return False
        return True

    def _probe_assistant(self, k: int, reasoning: bool = False, calls: bool = True) -> Message:
        m: Message = {
            "role": "assistant",
            "content": f"<think>\nr{k}\n</think>\n\na{k}" if reasoning else f"a{k}",
        }
        if calls:
            call: CallFunction = {"name": "zq_probe_call", "arguments": {"x": k}}
            m["tool_calls"] = [{"type": "function", "id": self.fmt.call_id(k), "function": call}]
        return m

    # -- messages as the template takes them ------------------------------------------------------
    def system_text(self, tools: list[Tool]) -> str | None:
        if self.system_prompt is not None:
            return self.system_prompt
        if not tools:
            return f"You are a helpful assistant. {ANSWER_HINT}"
        return f"You are a helpful assistant with tools. Call a tool when it helps. {ANSWER_HINT}"

    def observation_message(self, text: str, call_id: str | None = None) -> Message:
        if call_id is None and self.native_calls:  # feedback on a turn without a call (e.g. a cut-off
            return {"role": "user", "content": text}  # one): a tool result would answer no call
        return super().observation_message(text, call_id)

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        if not self.thinks:
            return None, text
        end = text.find("</think>")
        if end < 0 and text.lstrip().startswith("<think>"):  # cut off while reasoning: no action yet
            return text.lstrip().removeprefix("<think>").strip(), ""
        if end < 0:
            return None, text
        return text[:end].strip().removeprefix("<think>").strip(), text[end + len("</think>") :].lstrip("\n")

    def assistant_message(self, turn: AssistantTurn) -> Message:
        if not (self.native_calls and turn.tool_calls):
            return {"role": "assistant", "content": turn.text}
        m: Message = {
            "role": "assistant",
            "content": turn.prefix.strip(),
            "tool_calls": list(turn.tool_calls),
        }
        if turn.reasoning is not None:
            m["reasoning_content"] = turn.reasoning
        return m

    def _template_messages(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[Message]:
        """Messages as this template takes them: the tools prompt in the system message (templates
        that cannot list tools), observations in the user role when the template has no tool role,
        the system text folded into the first user turn (systemless templates), consecutive user
        turns joined (templates that require alternating roles)."""
        out: list[Message] = []
        for m in messages:
            m = m.copy()
            if m["role"] == "developer":
                m["role"] = "system"
            if m["role"] == "tool" and self.observation_role != "tool":
                m = {
                    "role": "user",
                    "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
                }
            if m.get("tool_calls") and self.observation_role != "tool":  # results come as user turns:
                calls = self.fmt.write_calls(m.get("tool_calls") or [])  # so do the calls
                m = {"role": "assistant", "content": "\n".join([str(m.get("content") or ""), *calls]).strip()}
            out.append(m)
        if tools and not self.native_tools:
            prompt = self.tool_prompt(tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}"}
            else:
                out.insert(0, {"role": "system", "content": prompt})
        if self.systemless and out and out[0]["role"] == "system":
            system = str(out.pop(0).get("content") or "")
            if out and out[0]["role"] == "user":
                out[0] = {**out[0], "content": f"{system}\n\n{out[0].get('content') or ''}"}
            else:
                out.insert(0, {"role": "user", "content": system})
        if self.alternates:
            merged: list[Message] = []
            for m in out:
                if merged and m["role"] == "user" and merged[-1]["role"] == "user":
                    merged[-1] = {**merged[-1], "content": f"{merged[-1]['content']}\n\n{m['content']}"}
                else:
                    merged.append(m)
            out = merged
        return out

    def _schemas(self, tools: list[ToolSchema] | None) -> list[ToolSchema] | None:
        return tools if tools and self.native_tools else None

    # -- rendering: template text with the contents' spans ---------------------------------------
    def _spans(self, messages: list[Message], tools: list[ToolSchema] | None, gen: bool) -> Spans:
        """The template's real rendering of ``messages`` and where each message content lies in it.

        The chat is rendered twice: with sentinels for contents (to find the template's own text)
        and as it is (the truth). Filling the sentinels in must give the true text; a template that
        trims or rewrites contents (Gemma's ``| trim``, Qwen3's reasoning split) is matched
        instead: its literal text between contents is found in the true text."""
        real = self._apply(self._template_messages(messages, tools), self._schemas(tools), gen)
        mark = _Marks(real, self.template_source)  # what the marked rendering holds besides marks
        contents: list[str] = []
        marked: list[Message] = []
        for m in messages:
            mm = m.copy()
            if content := m.get("content"):
                mm["content"] = mark(len(contents))
                contents.append(content)
            if reasoning := m.get("reasoning_content"):
                mm["reasoning_content"] = mark(len(contents))
                contents.append(reasoning)
            marked.append(mm)
        text = self._apply(self._template_messages(marked, tools), self._schemas(tools), gen)
        pieces = mark.pattern.split(text)  # literal, index, literal, index, ..., literal
        literals, order = pieces[0::2], [int(i) for i in pieces[1::2]]
        filled = literals[0] + "".join(contents[i] + lit for i, lit in zip(order, literals[1:], strict=True))
        ordered = [contents[i] for i in order]
        found = ordered if filled == real else _between(literals, real, ordered)
        if found is None:
            return real, []  # contents not separable: the true text, markup parsed everywhere
        spans, pos = [], len(literals[0])
        for lit, content in zip(literals[1:], found, strict=True):
            spans.append((pos, pos + len(content)))
            pos += len(content) + len(lit)
        return real, spans

    def _encode(self, text: str, protected: list[tuple[int, int]]) -> list[int]:
        """Ids of ``text``: the template's added tokens (matched only outside ``protected`` spans)
        as themselves, everything else with special tokens split. The tokenizer itself splits text
        at added tokens before pre-tokenising each piece, so this gives the ids of encoding the
        text whole, except that contents cannot inject markup."""
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

    def render(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        return self._encode(*self._spans(messages, tools, True))

    def bridge(
        self,
        prompt_ids: list[int],
        completion_ids: list[int],
        history: list[Message],
        new: list[Message],
        tools: list[ToolSchema] | None,
    ) -> list[int] | None:
        base = self._apply(self._template_messages(history, tools), self._schemas(tools), False)
        close = base.rfind(self.eot_text)  # the end of the sampled turn (a finished chat may add
        end = close + len(self.eot_text)  # text after it, e.g. Phi's closing eos)
        full, spans = self._spans([*history, *new], tools, True)
        if close < 0 or not full.startswith(base[:end]):
            return None
        closed = self.closes_turn(completion_ids or prompt_ids)
        cut = end if closed else close
        delta = self._encode(full[cut:], [(lo - cut, hi - cut) for lo, hi in spans if hi > cut])
        return [*prompt_ids, *completion_ids, *delta]

    def reference_ids(self, messages: list[Message], tools: list[ToolSchema] | None) -> list[int]:
        gen = bool(messages) and messages[-1]["role"] != "assistant"
        text = self._apply(self._template_messages(messages, tools), self._schemas(tools), gen)
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def splice(
        self, messages: list[Message], turn_ids: list[list[int]], tools: list[ToolSchema] | None
    ) -> list[int] | None:
        """The whole chat with each sampled turn's ids spliced in where the template puts an
        assistant message's content; ``None`` when a turn's place cannot be found."""
        gen = bool(messages) and messages[-1]["role"] != "assistant"
        mark = _Marks(json.dumps([messages, tools], ensure_ascii=False, default=str), self.template_source)
        turns = iter(turn_ids)
        marked: list[Message] = []
        parts: dict[str, list[int]] = {}
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                ids = next(turns)
                parts[mark(i)] = ids[:-1] if self.closes_turn(ids) else list(ids)
                marked.append({"role": "assistant", "content": mark(i)})
            else:
                marked.append(m)
        text, spans = self._spans(marked, tools, gen)
        out: list[int] = []
        pos = 0
        for found in mark.pattern.finditer(text):
            if found.group(0) not in parts:  # a turn the template writes twice: no one place for it
                return None
            before = [(lo - pos, hi - pos) for lo, hi in spans if pos <= lo and hi <= found.start()]
            out += self._encode(text[pos : found.start()], before) + parts.pop(found.group(0))
            pos = found.end()
        if parts:
            return None
        return out + self._encode(text[pos:], [(lo - pos, hi - pos) for lo, hi in spans if lo >= pos])


# ---------------------------------------------------------------------------------------------
def eos_ids(policy_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-turn ids: the generation config's ``eos_token_id`` (one or a list), then the tokenizer's."""
    gen = getattr(policy_model, "generation_config", None)
    return end_ids_of(getattr(gen, "eos_token_id", None) if gen is not None else None, tokenizer)


def make_renderer(cfg: ModelConfig, policy: Policy) -> Renderer:
    """The renderer for ``cfg``'s tokenizer kind and tool format, over ``policy``'s tokenizer."""
    if cfg.tokenizer_kind in ("char", "byte"):
        if cfg.tool_format not in ("auto", "text"):
            raise ChatTemplateError(
                f"model.tool_format {cfg.tool_format!r} needs a pretrained model's chat template; the "
                "char/byte models speak asyncrl's text protocol (tool_format 'text' or 'auto')"
            )
        return TextRenderer(policy.tokenizer, cfg.stop_strings)
    return chat_renderer(cfg, policy.tokenizer, eos_ids(policy.model, policy.tokenizer))


def chat_renderer(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, eos: list[int]) -> HFChatRenderer:
    """The chat-template renderer ``cfg`` describes (training, evaluation and preflight alike)."""
    return HFChatRenderer(
        tokenizer,
        eos_token_ids=eos,
        tool_format=cfg.tool_format,
        observation_role=cfg.observation_role,
        multi_turn=cfg.multi_turn,
        system_prompt=cfg.system_prompt,
        stop_strings=cfg.stop_strings,
        name=f"model {cfg.path!r}" if cfg.path else "the model",
    )
