"""The OpenAI-compatible gateway: the official openai client against it, sessions, token-exact
merged samples, error paths (401/400/413/429), back-pressure from the staleness bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
import torch

from asyncrl.config import GatewayConfig
from asyncrl.engine import GenerationEngine, Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.gateway import Gateway, build_trajectories
from asyncrl.policy.chat import TextRenderer
from asyncrl.policy.tokenizer import build_tokenizer
from asyncrl.records import SamplingParams, Task
from asyncrl.staleness import StalenessPolicy

TOK = build_tokenizer("char")
RENDER = TextRenderer(TOK)
MODEL = "asyncrl-policy"
TASK = Task(id="t", task_type="arithmetic", payload={"prompt": "3 bags of 4 pens. How many?", "answer": "12"})
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


class ScriptedEngine(GenerationEngine):
    """Answers each prompt with the next scripted text (as sampled char ids), log-prob -0.5 each."""

    def __init__(self, texts: list[str], version: int = 3) -> None:
        self.texts, self.version, self.max_context = list(texts), version, 512
        self.batch_sizes: list[int] = []

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        self.batch_sizes.append(len(prompts))
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        out = []
        for _p, sp in zip(prompts, params, strict=True):
            ids = RENDER.encode_content(self.texts.pop(0) if self.texts else "<answer>12</answer>")
            ids = ids[: sp.max_new_tokens]
            out.append(
                Sample(ids, [-0.5] * len(ids), "stop" if ids[-1] in RENDER.stop_token_ids else "length")
            )
        return out

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:  # pragma: no cover - unused
        self.version = version


def make_gateway(engine: GenerationEngine, **cfg: Any) -> Gateway:
    batcher = TurnBatcher(engine, max_wait_s=0.005, max_batch=64)
    batcher.live_episodes = 1000
    return Gateway(
        GatewayConfig(**cfg), batcher, RENDER, 512, SamplingParams(temperature=1.0, max_new_tokens=40)
    )


def serve(gw: Gateway, body: Callable[[Gateway], Awaitable[Any]]) -> Any:
    """Run ``body`` against the gateway served on a free loopback port."""

    async def go() -> Any:
        await gw.start(port=0)
        try:
            return await body(gw)
        finally:
            gw.batcher.close()
            await gw.stop()

    return asyncio.run(go())


def client(gw: Gateway, key: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, **kw)


async def calc_loop(c: openai.AsyncOpenAI, task: Task, turns: int = 4) -> str:
    """A plain openai tool-calling loop (the shape of examples/calculator_openai.py)."""
    messages: list[Any] = [{"role": "user", "content": task.payload["prompt"]}]
    for _ in range(turns):
        r = await c.chat.completions.create(model=MODEL, messages=messages, tools=[CALC])
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            return msg.content or ""
        for tc in msg.tool_calls:
            expr = json.loads(tc.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(eval(expr))})
    return ""


# -- the official client, sessions, merged samples ------------------------------------------------
def test_openai_client_tool_loop_becomes_one_token_exact_trajectory() -> None:
    engine = ScriptedEngine(["<tool>calc(3*4)</tool>", "<tool>calc(12+0)</tool>", "<answer>12</answer>"])
    gw = make_gateway(engine)

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK, group_id="g")
        answer = await calc_loop(client(gw, s.key), TASK)
        gw.sessions.close(s)
        return s, answer

    s, answer = serve(gw, body)
    assert answer == "<answer>12</answer>"
    assert len(s.calls) == 3 and gw.counts["appended_prompts"] == 2
    [traj] = build_trajectories(s, 1.0, "success")
    assert [t.role for t in traj.turns] == ["env", "model", "tool", "model", "tool", "model"]
    # the trajectory's ids are exactly the last call's prompt + completion: nothing re-tokenised
    last = s.calls[-1]
    assert traj.token_ids() == last.prompt_ids + last.completion_ids
    # observation tokens are masked; model tokens carry behaviour log-probs and the version
    assert TOK.decode(traj.turns[2].token_ids, skip_special_tokens=False) == "<obs>12</obs>"
    assert sum(traj.loss_mask()) == sum(len(c.completion_ids) for c in s.calls)
    assert traj.model_versions() == [3, 3, 3] and traj.reward_components["gateway/per_call"] == 0.0
    # and the layout is the one an environment episode renders (same warm start, same model)
    assert traj.turns[0].token_ids == [RENDER.bos, *RENDER.encode_content(TASK.payload["prompt"])]


def test_tool_call_and_logprobs_and_streaming_follow_the_openai_schema() -> None:
    gw = make_gateway(ScriptedEngine(["<tool>calc(3*4)</tool>", "done<eos>"]))

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK)
        c = client(gw, s.key)
        msgs: Any = [{"role": "user", "content": "hi"}]
        r = await c.chat.completions.create(model=MODEL, messages=msgs, tools=[CALC], logprobs=True)
        chunks = [ch async for ch in await c.chat.completions.create(model=MODEL, messages=msgs, stream=True)]
        models = await c.models.list()
        return r, chunks, models

    r, chunks, models = serve(gw, body)
    tc = r.choices[0].message.tool_calls[0]
    assert (tc.type, tc.function.name, json.loads(tc.function.arguments)) == (
        "function",
        "calc",
        {"expression": "3*4"},
    )
    assert r.choices[0].finish_reason == "tool_calls"
    assert [lp.logprob for lp in r.choices[0].logprobs.content] == [-0.5] * r.usage.completion_tokens
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "done"
    assert [m.id for m in models.data] == [MODEL]


def test_tool_choice_none_returns_text_and_unmet_choices_are_counted_not_forced() -> None:
    """``none``: the reply is not parsed for calls (the tools stay in the prompt, so it still extends
    the session's); ``required`` / a named function are not forced by constrained decoding — the
    policy's own reply comes back and the miss is counted."""
    replies = ["<tool>calc(3*4)</tool>", "just text<eos>", "<tool>calc(1+1)</tool>"]
    gw = make_gateway(ScriptedEngine(replies))
    named = {"type": "function", "function": {"name": "calc"}}

    async def body(gw: Gateway) -> Any:
        c = client(gw, gw.sessions.open(TASK).key)
        msgs: Any = [{"role": "user", "content": "hi"}]
        none = await c.chat.completions.create(model=MODEL, messages=msgs, tools=[CALC], tool_choice="none")
        req = await c.chat.completions.create(
            model=MODEL, messages=msgs, tools=[CALC], tool_choice="required"
        )
        fn = await c.chat.completions.create(model=MODEL, messages=msgs, tools=[CALC], tool_choice=named)
        return none, req, fn

    none, req, fn = serve(gw, body)
    assert none.choices[0].message.tool_calls is None and "calc(3*4)" in (
        none.choices[0].message.content or ""
    )
    assert req.choices[0].message.content == "just text" and req.choices[0].finish_reason == "stop"
    assert fn.choices[0].message.tool_calls[0].function.name == "calc"
    assert gw.counts["tool_choice_unmet"] == 1  # "required" answered with text; the named call was met


def test_edited_history_gives_flagged_per_call_samples_never_retokenised() -> None:
    gw = make_gateway(ScriptedEngine(["<tool>calc(3*4)</tool>", "<answer>12</answer>"]))

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK, group_id="g")
        c = client(gw, s.key)
        await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a"}], tools=[CALC]
        )
        # the agent rewrites its history (a summariser would): the next prompt does not extend the last
        await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])
        return s

    s = serve(gw, body)
    trajs = build_trajectories(s, 0.5, "success")
    assert len(trajs) == 2
    for t, c in zip(trajs, s.calls, strict=True):
        assert t.token_ids() == c.prompt_ids + c.completion_ids
        assert t.final_reward == 0.5 and t.group_id == "g" and t.reward_components["gateway/per_call"] == 1.0
        assert t.render_diff is None  # exact by construction: unchecked, not counted exact


def test_auxiliary_calls_are_recorded_but_not_trained() -> None:
    gw = make_gateway(ScriptedEngine(["summary<eos>", "<answer>1</answer>"]))

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK)
        c = client(gw, s.key)
        msgs: Any = [{"role": "user", "content": "q"}]
        await c.chat.completions.create(
            model=MODEL, messages=msgs, extra_headers={"X-Asyncrl-Auxiliary": "1"}
        )
        await c.chat.completions.create(model=MODEL, messages=msgs)
        return s

    s = serve(gw, body)
    [t] = build_trajectories(s, 1.0, "success")
    assert len(s.calls) == 2 and t.token_ids() == s.calls[1].prompt_ids + s.calls[1].completion_ids


def test_concurrent_sessions_share_engine_batches() -> None:
    engine = ScriptedEngine([], version=0)
    gw = make_gateway(engine)

    async def body(gw: Gateway) -> Any:
        sessions = [gw.sessions.open(TASK) for _ in range(16)]
        await asyncio.gather(
            *(
                client(gw, s.key).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}]
                )
                for s in sessions
            )
        )
        return sessions

    sessions = serve(gw, body)
    assert all(len(s.calls) == 1 for s in sessions)
    assert sum(engine.batch_sizes) == 16 and len(engine.batch_sizes) < 16  # batched, not one by one


# -- error paths -----------------------------------------------------------------------------------
async def _post(gw: Gateway, body: bytes | dict[str, Any], key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw") as h:
        return await h.post("/v1/chat/completions", content=data, headers=headers)


def _call(gw: Gateway, body: bytes | dict[str, Any], key: str | None) -> httpx.Response:
    async def go() -> httpx.Response:
        try:
            return await _post(gw, body, key)
        finally:
            gw.batcher.close()

    return asyncio.run(go())


OK = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}


def test_unknown_and_finished_keys_are_401_with_an_openai_error_body() -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)

    async def body(gw: Gateway) -> Any:
        errors = []
        for key in ("sk-nope", s.key):
            try:
                await client(gw, key, max_retries=0).chat.completions.create(
                    model=MODEL, messages=OK["messages"]
                )
            except openai.AuthenticationError as exc:
                errors.append(exc)
            gw.sessions.close(s)
        return errors

    errors = serve(gw, body)
    assert len(errors) == 2 and all(e.status_code == 401 for e in errors)
    assert errors[0].code == "invalid_api_key" and "unknown or finished" in errors[1].message
    assert _call(gw, OK, None).status_code == 401


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        ({**OK, "model": "gpt-4o"}, "model"),
        ({**OK, "max_tokens": 100_000}, "max_tokens"),
        ({**OK, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({**OK, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({**OK, "messages": []}, "messages"),
        ({**OK, "temperature": "hot"}, "temperature"),
        ({**OK, "messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
        ({"messages": OK["messages"]}, "model"),
        ({**OK, "tool_choice": "always"}, "tool_choice"),
        ({**OK, "tool_choice": "required"}, "tool_choice"),  # no tools
        (
            {**OK, "tools": [CALC], "tool_choice": {"type": "function", "function": {"name": "web"}}},
            "tool_choice",
        ),
    ],
)
def test_bad_requests_are_400_naming_the_field(body: Any, param: str | None) -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)
    r = _call(gw, body, s.key)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert not s.calls


def test_body_over_the_limit_is_413() -> None:
    gw = make_gateway(ScriptedEngine([]), max_body_bytes=2048)
    s = gw.sessions.open(TASK)
    r = _call(gw, {**OK, "messages": [{"role": "user", "content": "x" * 4000}]}, s.key)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]


# -- back-pressure ---------------------------------------------------------------------------------
def _stale_gateway(mode: str, newest: list[int]) -> Gateway:
    gw = make_gateway(ScriptedEngine([], version=0), stale_calls=mode, hold_s=2.0, retry_after_s=7)
    gw.policy = StalenessPolicy.from_config("async", 1, 1, "drop")
    gw.newest_version = lambda: newest[0]
    gw.max_staleness = lambda: 1
    return gw


def test_stale_worker_answers_429_with_retry_after() -> None:
    gw = _stale_gateway("reject", [5])
    s = gw.sessions.open(TASK)
    r = _call(gw, OK, s.key)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["type"] == "rate_limit_error" and not s.calls


def test_held_call_proceeds_once_weights_catch_up() -> None:
    newest = [5]
    gw = _stale_gateway("hold", newest)
    s = gw.sessions.open(TASK)

    async def go() -> httpx.Response:
        async def load() -> None:
            await asyncio.sleep(0.2)
            gw.batcher.engine.version = 5  # the worker loaded new weights

        loader = asyncio.create_task(load())
        r = await _post(gw, OK, s.key)
        await loader
        gw.batcher.close()
        return r

    r = asyncio.run(go())
    assert r.status_code == 200 and s.calls[0].version == 5 and gw.counts["held_seconds"] >= 0.15


def test_session_older_than_the_bound_is_finished_and_counted_stale() -> None:
    newest = [0]
    gw = _stale_gateway("reject", newest)
    s = gw.sessions.open(TASK)
    assert _call(gw, OK, s.key).status_code == 200
    newest[0] = 2
    gw.batcher.engine.version = 2  # the worker is current, but the session began on version 0
    r = _call(gw, OK, s.key)
    assert r.status_code == 401 and r.json()["error"]["code"] == "session_stale"
    assert s.finished and s.stale and gw.sessions.stale == 1
    assert _call(gw, OK, s.key).status_code == 401  # the key is dead


def test_reward_endpoint() -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw") as h:
            hdr = {"Authorization": f"Bearer {s.key}"}
            return [
                await h.post(f"/v1/sessions/{s.id}/reward", json={"reward": 0.75}, headers=hdr),
                await h.post(f"/v1/sessions/{s.id}/reward", json={"reward": "lots"}, headers=hdr),
                await h.post("/v1/sessions/other/reward", json={"reward": 1}, headers=hdr),
            ]

    ok, bad, other = asyncio.run(go())
    assert ok.status_code == 200 and s.reward == 0.75
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    assert other.status_code == 401


# -- the OpenAI Agents SDK, unmodified -------------------------------------------------------------
def test_agents_sdk_example_completes_episodes_through_the_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    from examples.calculator_agents_sdk import run

    task = Task(
        id="t", task_type="arithmetic", payload={"prompt": "3 bags of 4 pens. How many?", "answer": "12"}
    )
    gw = make_gateway(ScriptedEngine(["<tool>calc(3*4)</tool>", "<answer>12</answer>"]))

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(task)
        reward = await run(task, client(gw, s.key))
        gw.sessions.close(s)
        return s, reward

    s, reward = serve(gw, body)
    assert reward == 1.0 and len(s.calls) == 2
    [traj] = build_trajectories(s, reward, "success")
    assert [t.role for t in traj.turns] == ["env", "model", "tool", "model"]
    assert TOK.decode(traj.turns[2].token_ids, skip_special_tokens=False) == "<obs>12</obs>"


class SlowEngine(ScriptedEngine):
    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        import time

        time.sleep(0.3)
        return super().generate(prompts, sampling)


def test_a_session_killed_mid_call_loses_nothing_else() -> None:
    gw = make_gateway(SlowEngine(["<answer>1</answer>", "<answer>2</answer>"]))

    async def body(gw: Gateway) -> Any:
        a, b = gw.sessions.open(TASK), gw.sessions.open(TASK)
        msgs: Any = OK["messages"]
        call_a = asyncio.create_task(client(gw, a.key).chat.completions.create(model=MODEL, messages=msgs))
        call_b = asyncio.create_task(client(gw, b.key).chat.completions.create(model=MODEL, messages=msgs))
        await asyncio.sleep(0.1)
        call_a.cancel()  # the agent is killed mid-call (timeout, shutdown): its session closes
        gw.sessions.close(a)
        r = await call_b
        await asyncio.sleep(0.1)  # a's handler finishes its generation and finds the session closed
        return a, b, r

    a, b, r = serve(gw, body)
    # a's call is not recorded (its handler was cancelled with the connection, or finished and found
    # the session closed), it is not counted as a client error, and the gateway's books balance
    assert not a.calls and gw.counts["errors_4xx"] == 0 and gw.pending == 0 and a.in_flight == 0
    assert r.choices[0].message.content in ("<answer>1</answer>", "<answer>2</answer>") and len(b.calls) == 1
    [t] = build_trajectories(b, 1.0, "success")
    assert t.token_ids() == b.calls[0].prompt_ids + b.calls[0].completion_ids


def test_a_client_that_disconnects_mid_request_is_a_cancelled_call_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An agent cancelled while its request body is in flight: counted as cancelled, logged as nothing."""
    from starlette.requests import Request

    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"authorization", f"Bearer {s.key}".encode())],
        "query_string": b"",
    }
    response = asyncio.run(gw._http_chat(Request(scope, receive)))
    assert response.status_code == 499
    assert gw.counts["cancelled_calls"] == 1 and gw.counts["errors_4xx"] == 0
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    gw.batcher.close()


# -- defects found in review (issue 29): each test failed before its fix -------------------------------
async def _post_reward(gw: Gateway, s: Any, data: bytes) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw") as h:
        hdr = {"Authorization": f"Bearer {s.key}", "Content-Type": "application/json"}
        return await h.post(f"/v1/sessions/{s.id}/reward", content=data, headers=hdr)


@pytest.mark.parametrize(
    "data",
    [
        b'{"reward": Infinity}',
        b'{"reward": -Infinity}',
        b'{"reward": NaN}',
        b'{"reward": 1e400}',
        b'{"reward": 1' + b"0" * 400 + b"}",  # 10**400: an int no float holds
        b'{"reward": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested past the recursion limit
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["inf", "-inf", "nan", "1e400", "10**400", "deep-reward", "deep-body"],
)
def test_reward_route_refuses_what_is_no_finite_number_and_stores_nothing(data: bytes) -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)
    r = asyncio.run(_post_reward(gw, s, data))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "reward"
    assert s.reward is None


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": "a \ud800 b"}], "messages.0.content"),
        ([{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}], "messages.0.content.0.text"),
        (
            [
                {"role": "user", "content": "3*4?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "12\ud800"},
            ],
            "messages.2.content",
        ),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(messages: list[Any], param: str) -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)
    body = json.dumps({**OK, "tools": [CALC], "messages": messages}).encode()  # ensure_ascii: valid JSON
    r = _call(gw, body, s.key)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]
    assert not s.calls


def test_stop_is_bounded_as_openai_bounds_it() -> None:
    gw = make_gateway(ScriptedEngine(["<answer>12</answer>"] * 2))
    s = gw.sessions.open(TASK)
    t0 = time.monotonic()
    r = _call(gw, {**OK, "stop": ["x"] * 100_000}, s.key)  # ~600 kB: under the body limit
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop", r.text
    assert time.monotonic() - t0 < 5 and not s.calls
    assert _call(
        make_gateway(ScriptedEngine([])), {**OK, "stop": ["a", "b", "c", "d", "e"]}, s.key
    ).status_code
    gw = make_gateway(ScriptedEngine(["<answer>12</answer>"]))
    s = gw.sessions.open(TASK)
    r = _call(gw, {**OK, "stop": ["X", "Y", "Z", "</answer>"]}, s.key)  # four are fine
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("<answer>12")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**OK, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages.0.content.0.text",
        ),
        ({**OK, "stop": 5}, "stop"),
        ({**OK, "stop": [5]}, "stop.0"),
    ],
)
def test_400_bodies_name_the_field_not_a_union_branch(body: Any, param: str) -> None:
    gw = make_gateway(ScriptedEngine([]))
    s = gw.sessions.open(TASK)
    r = _call(gw, body, s.key)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["message"].startswith(f"{param}: ")


def test_ipv6_loopback_base_url_has_brackets() -> None:
    gw = make_gateway(ScriptedEngine([]), host="::1")
    gw.port = 8123
    assert gw.base_url == "http://[::1]:8123/v1"
    assert httpx.URL(gw.base_url).host == "::1" and httpx.URL(gw.base_url).port == 8123
    gw = make_gateway(ScriptedEngine([]), host="127.0.0.1")
    gw.port = 8123
    assert gw.base_url == "http://127.0.0.1:8123/v1"


def test_the_session_id_reveals_nothing_of_the_key() -> None:
    gw = make_gateway(ScriptedEngine([]))
    sessions = [gw.sessions.open(TASK) for _ in range(50)]
    assert all(s.id not in s.key and s.key[-8:] not in s.id for s in sessions)
    assert len({s.id for s in sessions}) == 50
    ok = asyncio.run(_post_reward(gw, sessions[0], b'{"reward": 0.5}'))
    assert ok.status_code == 200 and sessions[0].reward == 0.5


def test_a_streamed_reply_carries_its_reasoning_as_the_message_does() -> None:
    from asyncrl.gateway.protocol import stream_chunks

    message = {"role": "assistant", "content": "", "reasoning_content": "I should look x up."}
    body = {
        "id": "c1",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {},
    }
    first, end, usage = stream_chunks(body)
    assert first["choices"][0]["delta"]["reasoning_content"] == "I should look x up."
    assert end["choices"][0]["finish_reason"] == "tool_calls" and usage["choices"] == []
    message.pop("reasoning_content")
    assert "reasoning_content" not in stream_chunks(body)[0]["choices"][0]["delta"]
