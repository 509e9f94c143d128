"""The OpenAI chat-completions wire format: request validation, error bodies, response building.

Requests are validated with pydantic models that accept (and ignore) fields asyncrl does not use,
so SDKs that send extra parameters (``user``, ``metadata``, ``parallel_tool_calls``, ...) work.
A request that fails validation is answered ``400`` with an OpenAI-style error body whose
``param`` names the offending field (``messages.2.content``, ``max_tokens``, ...).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


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

    def body(self) -> dict[str, Any]:
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
    stop: str | list[str] | None = None
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
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise GatewayError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    if not isinstance(data, dict):
        raise GatewayError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise GatewayError(400, f"{param}: {err['msg']}", param=param, code="invalid_value") from None
    except RecursionError:
        raise GatewayError(400, "the request body is nested too deeply", code="invalid_json") from None


def completion_id() -> str:
    import uuid

    return "chatcmpl-" + uuid.uuid4().hex


def choice_message(content: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def logprobs_block(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ],
        "refusal": None,
    }


def response_body(
    cid: str, model: str, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": cid,
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


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished completion as ``chat.completion.chunk`` events (one delta per choice, then the end)."""
    base = {
        "id": body["id"],
        "object": "chat.completion.chunk",
        "created": body["created"],
        "model": body["model"],
    }
    chunks: list[dict[str, Any]] = []
    for ch in body["choices"]:
        delta: dict[str, Any] = {"role": "assistant", "content": ch["message"]["content"]}
        if ch["message"].get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(ch["message"]["tool_calls"])]
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": ch["index"],
                        "delta": delta,
                        "logprobs": ch.get("logprobs"),
                        "finish_reason": None,
                    }
                ],
            }
        )
        chunks.append(
            {
                **base,
                "choices": [
                    {
                        "index": ch["index"],
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": ch["finish_reason"],
                    }
                ],
            }
        )
    chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks
