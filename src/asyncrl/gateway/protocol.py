"""The OpenAI chat-completions wire format: request validation, error bodies, response building.

Requests are validated with pydantic models that accept (and ignore) fields asyncrl does not use,
so SDKs that send extra parameters (``user``, ``metadata``, ``parallel_tool_calls``, ...) work.
A request that fails validation is answered ``400`` with an OpenAI-style error body whose
``param`` names the offending field (``messages.2.content``, ``max_tokens``, ...) — the field, never
the union branch pydantic tried (``messages.0.content.str``). Text that is not valid Unicode (a lone
surrogate such as ``"\ud800"``, which JSON can spell) is refused the same way, before anything is
rendered. ``stop`` holds at most 4 strings, as OpenAI's API allows.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from asyncrl import jsontext


class GatewayError(Exception):
    """An error answered to the client (never raised past the HTTP handler)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Loose):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Loose):
    type: Literal["text", "input_text", "output_text"]
    text: str


class Message(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(_Loose):
    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(_Loose):
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatRequest(_Loose):
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    n: int = Field(1, ge=1, le=16)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool | None = None

    def tool_choice_mode(self) -> tuple[str, str | None]:
        """``(mode, function name)``: mode is ``auto``, ``none``, ``required`` or ``function``.

        Raises :class:`GatewayError` (400, ``param="tool_choice"``) for anything else, or for a
        function that is not among ``tools``."""
        tc = self.tool_choice
        names = [t.function.name for t in self.tools or []]
        if tc is None:
            return "auto", None
        if tc in ("auto", "none", "required"):
            if tc == "required" and not names:
                raise GatewayError(400, "tool_choice: 'required' needs tools", param="tool_choice")
            return str(tc), None
        fn = tc.get("function") if isinstance(tc, dict) and tc.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise GatewayError(
                400,
                "tool_choice: must be 'auto', 'none', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if name not in names:
            raise GatewayError(
                400, f"tool_choice: function {name!r} is not among tools {names}", param="tool_choice"
            )
        return "function", name

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    def token_limit(self) -> tuple[int | None, str]:
        """The requested completion length and the field that asked for it."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


def parse_request(raw: bytes) -> ChatRequest:
    """Validate a request body; :class:`GatewayError` (400) names the field on failure."""
    try:
        data = jsontext.loads(raw)
    except ValueError as exc:
        raise GatewayError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_json")
    bad = _surrogate_at(data) if _ESCAPED_SURROGATE.search(raw) else None
    if bad is not None:
        raise GatewayError(
            400,
            f"{bad or 'the request body'}: contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
            param=bad or None,
            code="invalid_value",
        )
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        param, message = _first_error(exc.errors())
        raise GatewayError(400, f"{param}: {message}", param=param, code="invalid_value") from None


_MODELS = (FunctionCall, ToolCallIn, ContentPart, Message, FunctionDef, ToolDef, ChatRequest)
_FIELDS = frozenset(name for m in _MODELS for name in m.model_fields)


def _first_error(errors: list[ErrorDetails]) -> tuple[str | None, str]:
    """The field at fault — list indices and field names, without the union branches pydantic tried
    (``messages.0.content.str`` is ``messages.0.content``); the deepest one, since a branch that got
    past the field's own type is the one the client meant — and what was wrong with it: the reason a
    branch that matched the type gave, else the types the field takes."""

    def field(err: ErrorDetails) -> str:
        return ".".join(str(p) for p in err["loc"] if isinstance(p, int) or p in _FIELDS)

    param = field(max(errors, key=lambda e: len(field(e).split("."))))
    same = [e for e in errors if field(e) == param]
    reasons = [e["msg"] for e in same if not e["type"].endswith("_type")]
    if reasons:
        return param or None, reasons[0]
    wanted = [e["msg"].removeprefix("Input should be ") for e in same]
    return param or None, "Input should be " + " or ".join(dict.fromkeys(wanted))


_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: only then can the decoded body hold a lone one."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_at(data: Any) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate; ``""`` for the top level."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str) and _SURROGATE.search(value):
            return path
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        )
        for k, v in items:
            if isinstance(k, str) and _SURROGATE.search(k):
                return path
            stack.append((f"{path}.{k}" if path else str(k), v))
    return None


def parse_reward(raw: bytes) -> float:
    """The ``reward`` of a ``POST /v1/sessions/{id}/reward`` body; :class:`GatewayError` (400, naming
    ``reward``) for anything but a finite number — ``Infinity``, ``1e400``, ``10**400``, a body nested past
    the parser's depth — so nothing but a finite float is ever stored."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not a finite number")

    try:
        data = jsontext.loads(raw or b"null", parse_constant=refuse)
    except ValueError as exc:
        raise GatewayError(
            400, f'reward: the body must be {{"reward": <finite number>}} ({exc})', param="reward"
        ) from None
    reward = data.get("reward") if isinstance(data, dict) else None
    try:
        value = (
            float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else math.nan
        )
    except OverflowError:
        value = math.nan
    if not math.isfinite(value):
        raise GatewayError(400, "reward: must be a finite number", param="reward")
    return value


def logprobs_block(tokens: list[str], logprobs: list[float]) -> dict[str, object]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ],
        "refusal": None,
    }


def response_body(
    model: str, choices: list[dict[str, object]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, object]]:
    """A finished completion as ``chat.completion.chunk`` events (one delta per choice, then the end)."""
    base = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
    }
    chunks: list[dict[str, object]] = []
    for ch in body["choices"]:
        msg = ch["message"]
        delta = {"role": "assistant", "content": msg["content"]}
        if msg.get("reasoning_content"):  # as the non-streamed message carries it
            delta["reasoning_content"] = msg["reasoning_content"]
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(msg["tool_calls"])]
        end = {"index": ch["index"], "delta": {}, "logprobs": None, "finish_reason": ch["finish_reason"]}
        first = {**end, "delta": delta, "logprobs": ch.get("logprobs"), "finish_reason": None}
        chunks += [{**base, "choices": [first]}, {**base, "choices": [end]}]
    chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks
