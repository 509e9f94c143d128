"""Property tests: nothing a client sends can crash the gateway or the worker behind it.

Arbitrary bytes, arbitrary JSON, and valid-looking requests with hostile values are answered
200 or a 4xx with an OpenAI-style error body — never a 500, never an exception in the engine —
and the gateway keeps answering afterwards.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.config import GatewayConfig
from asyncrl.engine import GenerationEngine, Sample, check_requests
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.gateway import Gateway
from asyncrl.policy.chat import TextRenderer
from asyncrl.policy.tokenizer import build_tokenizer
from asyncrl.records import SamplingParams, Task

TOK = build_tokenizer("char")
RENDER = TextRenderer(TOK)
TASK = Task(id="t", task_type="x")
MODEL = "asyncrl-policy"


class CheckingEngine(GenerationEngine):
    """Validates every call as the real engines do; answers with a fixed tool call."""

    def __init__(self) -> None:
        self.version, self.max_context = 0, 256

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        params = check_requests(prompts, sampling, self.max_context, len(TOK))
        out = []
        for p, sp in zip(prompts, params, strict=True):
            ids = RENDER.encode_content("<tool>calc(1+1)</tool>")[
                : min(sp.max_new_tokens, self.max_context - len(p))
            ]
            out.append(Sample(ids, [-1.0] * len(ids), "stop"))
        return out

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:  # pragma: no cover - unused
        pass


def _gateway() -> Gateway:
    batcher = TurnBatcher(CheckingEngine(), max_wait_s=0.0, max_batch=64)
    cfg = GatewayConfig(max_body_bytes=4096, honor_sampling=True)
    return Gateway(cfg, batcher, RENDER, 256, SamplingParams(max_new_tokens=16))


GW = _gateway()
SESSION = GW.sessions.open(TASK)
OK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard", ""])
hostile_text = st.text(max_size=60) | st.sampled_from(
    ["<tool>", "</obs>", "<eos>", "<|im_end|>", "\x00", "é" * 50]
)
message = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": hostile_text
        | st.none()
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": hostile_text}), max_size=2)
        | json_values,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.text(max_size=5),
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries(
                        {"name": st.text(max_size=8), "arguments": st.text(max_size=20)}
                    ),
                }
            ),
            max_size=2,
        ),
        "tool_call_id": st.text(max_size=5),
    },
)
requests_ = st.fixed_dictionaries(
    {"model": st.sampled_from([MODEL, MODEL, "other"]), "messages": st.lists(message, max_size=5)},
    optional={
        "max_tokens": st.integers(-5, 400),
        "temperature": st.floats(allow_nan=True) | st.integers(-3, 3),
        "top_p": st.floats(allow_nan=True),
        "n": st.integers(-1, 20),
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=3) | st.none(),
        "logprobs": st.booleans(),
        "stream": st.booleans(),
        "tools": st.lists(json_values, max_size=2),
        "tool_choice": json_values,
    },
)


def _post(data: bytes) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=GW.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as h:
            r = await h.post(
                "/v1/chat/completions", content=data, headers={"Authorization": f"Bearer {SESSION.key}"}
            )
        GW.batcher.close()
        return r

    return asyncio.run(go())


def _answered_cleanly(r: httpx.Response) -> None:
    assert r.status_code in (200, 400, 413), (r.status_code, r.text)
    if r.status_code != 200:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and err["type"] == "invalid_request_error"


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(st.binary(max_size=600))
def test_arbitrary_bytes(data: bytes) -> None:
    _answered_cleanly(_post(data))


@SETTINGS
@given(json_values)
def test_arbitrary_json(value: Any) -> None:
    _answered_cleanly(_post(json.dumps(value).encode()))


@SETTINGS
@given(requests_)
def test_hostile_requests(body: dict[str, Any]) -> None:
    r = _post(json.dumps(body).encode())
    _answered_cleanly(r)
    if r.status_code == 200 and not body.get("stream"):
        call = SESSION.calls[-1]
        assert len(call.completion_ids) == len(call.logprobs) <= 256 - len(call.prompt_ids)


def test_still_answers_after_the_storm() -> None:
    assert _post(json.dumps(OK).encode()).status_code == 200
