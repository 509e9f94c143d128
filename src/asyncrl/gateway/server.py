"""The gateway: an OpenAI-compatible HTTP endpoint answered by a rollout worker's batched engine.

It lives *inside* the rollout worker (Starlette, served by uvicorn on the worker's own event loop, on
``gateway.port + index``): calls join the worker's :class:`~asyncrl.engine.batcher.TurnBatcher` and
its staleness admission with no extra hop (why: docs/agents.md, "Where the gateway lives, and why").

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /v1/sessions/{id}/reward``.
Errors are OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` bodies (statuses:
docs/agents.md, "Errors and security"). No request can raise past the handler.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from asyncrl import jsontext
from asyncrl.config import GatewayConfig
from asyncrl.engine.base import Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.gateway.protocol import (
    ChatRequest,
    GatewayError,
    Message,
    logprobs_block,
    parse_request,
    parse_reward,
    response_body,
    stream_chunks,
)
from asyncrl.gateway.render import MessageRenderer
from asyncrl.gateway.sessions import CallRecord, LastCall, ReplyKey, Session, SessionTable
from asyncrl.policy.chat import ChatTemplateError, Renderer
from asyncrl.records import SamplingParams
from asyncrl.staleness import StalenessPolicy

log = logging.getLogger("asyncrl.gateway")


class Gateway:
    """Sessions + rendering + generation; :meth:`app` is the HTTP face of it."""

    def __init__(
        self,
        cfg: GatewayConfig,
        batcher: TurnBatcher,
        renderer: Renderer,
        max_context: int,
        sampling: SamplingParams,
        *,
        policy: StalenessPolicy | None = None,
        newest_version: Callable[[], int] | None = None,
        max_staleness: Callable[[], int | None] | None = None,
        refresh: Callable[[], None] | None = None,
    ) -> None:
        self.cfg, self.batcher, self.max_context, self.sampling = cfg, batcher, max_context, sampling
        self.messages = MessageRenderer(renderer)
        self.renderer = renderer
        self.sessions = SessionTable()
        self.policy = policy
        """The staleness rules (none: no staleness checks, e.g. a held-out evaluation's gateway)."""
        self.newest_version = newest_version
        self.max_staleness = max_staleness or (lambda: None)
        self.refresh = refresh
        """Loads newer weights (the worker's, in async mode): tried before a stale call is held."""
        self.pending = 0
        self.counts: dict[str, float] = {
            "calls": 0,
            "rejected_429": 0,
            "errors_4xx": 0,
            "cancelled_calls": 0,
            "held_seconds": 0.0,
            "appended_prompts": 0,
            "rendered_prompts": 0,
            "tool_choice_unmet": 0,
        }
        self.port: int | None = None
        self._server: Any = None

    # -- back-pressure -----------------------------------------------------------------------------
    def _fresh(self) -> bool:
        """Whether the worker's weights may answer a call now (rule 2, asked of the policy)."""
        newest = self.newest_version() if self.newest_version else None
        if self.policy is None or newest is None:
            return True
        return self.policy.admits_call(int(self.batcher.engine.version), newest, self.max_staleness())

    def _bound(self) -> int | None:
        """The ``max_staleness`` in force (the control state's effective one, else the policy's)."""
        bound = self.max_staleness()
        return bound if bound is not None or self.policy is None else self.policy.max_staleness

    def _check_session_age(self, s: Session) -> None:
        first = s.first_version()
        newest = self.newest_version() if self.newest_version else None
        if self.policy is None or first is None or newest is None:
            return
        if self.policy.session_expired(first, newest, self.max_staleness()):
            self.sessions.close(s, stale=True)
            raise _unauthorized(
                f"session finished: it began on weight version {first}, more than max_staleness="
                f"{self._bound()} versions before the newest ({newest}); its samples are dropped",
                "session_stale",
            )

    async def _admit_call(self) -> None:
        if self.pending >= self.cfg.max_pending_calls:
            raise self._busy(f"{self.pending} calls are waiting for generation (gateway.max_pending_calls)")
        if self._fresh():
            return
        if self.refresh is not None:
            async with self.batcher.lock:  # never while a batch is generated
                self.refresh()
            if self._fresh():
                return
        t0 = time.monotonic()
        while self.cfg.stale_calls == "hold" and time.monotonic() - t0 < self.cfg.hold_s:
            await asyncio.sleep(0.05)
            if self._fresh():
                self.counts["held_seconds"] += time.monotonic() - t0
                return
        self.counts["held_seconds"] += time.monotonic() - t0
        raise self._busy(f"the worker's weights lag the newest by more than max_staleness={self._bound()}")

    def _busy(self, why: str) -> GatewayError:
        self.counts["rejected_429"] += 1
        return GatewayError(
            429,
            f"{why}; retry after {self.cfg.retry_after_s} s",
            code="rate_limit_exceeded",
            type_="rate_limit_error",
            headers={"Retry-After": str(self.cfg.retry_after_s)},
        )

    # -- one call ----------------------------------------------------------------------------------
    def session_of(self, authorization: str | None) -> Session:
        key = (authorization or "").removeprefix("Bearer ").strip()
        s = self.sessions.get(key) if key else None
        if s is None:
            raise _unauthorized(
                "unknown or finished session key: each episode's client is given its own key by asyncrl",
                "invalid_api_key",
            )
        return s

    def _prompt(self, s: Session, req: ChatRequest) -> list[int]:
        """Append-only when the request continues the session's last call, else a full render."""
        tools, msgs, last, conv = req.tools or [], req.messages, s.last, self.messages
        n = len(last.messages) if last is not None else 0
        if (
            last is not None
            and len(msgs) > n + 1
            and (tools, msgs[:n]) == (last.tools, last.messages)
            and _reply_key(msgs[n]) in last.replies
        ):
            c, before, new = last.record, conv.messages(msgs[: n + 1]), conv.messages(msgs[n + 1 :])
            ids = self.renderer.bridge(c.prompt_ids, c.completion_ids, before, new, conv.schemas(tools))
            if ids is not None:  # else a template that is not prefix-stable here: render in full
                self.counts["appended_prompts"] += 1
                return ids
        self.counts["rendered_prompts"] += 1
        return self.messages.render(list(msgs), tools)

    def _sampling(self, req: ChatRequest, room: int) -> SamplingParams:
        limit, field = req.token_limit()
        if limit is not None and limit > room:
            raise GatewayError(
                400,
                f"{field}={limit} is past the context: the prompt has {self.max_context - room} tokens "
                f"of {self.max_context}",
                param=field,
                code="context_length_exceeded",
            )
        sp = self.sampling
        temp, top_p = sp.temperature, sp.top_p
        if self.cfg.honor_sampling:
            temp = max(req.temperature, 1e-4) if req.temperature is not None else temp
            top_p = req.top_p if req.top_p is not None else top_p
        return SamplingParams(
            temperature=temp, top_p=top_p, max_new_tokens=min(limit or sp.max_new_tokens, room)
        )

    async def chat(self, s: Session, req: ChatRequest, auxiliary: bool = False) -> dict[str, Any]:
        """Answer one validated request for session ``s`` and record it."""
        if req.model != self.cfg.model_name:
            raise GatewayError(
                400,
                f"model {req.model!r} does not exist; this gateway serves {self.cfg.model_name!r}",
                param="model",
                code="model_not_found",
            )
        self._check_session_age(s)
        req.tool_choice_mode()  # a tool_choice naming no offered tool is a 400 before any work
        prompt = self._prompt_in_context(s, req)
        started = time.time()
        results = await self._generate(s, req, prompt)
        self.counts["calls"] += 1
        choices: list[dict[str, object]] = []
        replies: set[ReplyKey] = set()
        records: list[CallRecord] = []
        for i, (sample, version) in enumerate(results):
            keep = self.renderer.cut_at_stop(sample.token_ids, req.stops())
            ids, lps = list(sample.token_ids[:keep]), list(sample.logprobs[:keep])
            rec = CallRecord(prompt, ids, lps, version, sample.finish_reason, auxiliary, started, time.time())
            s.calls.append(rec)
            records.append(rec)
            choice, reply_key = self._choice(
                i, req, rec, cut=keep < len(sample.token_ids), n_calls=len(s.calls)
            )
            choices.append(choice)
            replies.add(reply_key)
        if req.n == 1 and not auxiliary:
            s.last = LastCall(list(req.messages), list(req.tools or []), replies, records[0])
        completion_tokens = sum(len(r.completion_ids) for r in records)
        return response_body(self.cfg.model_name, choices, len(prompt), completion_tokens)

    def _prompt_in_context(self, s: Session, req: ChatRequest) -> list[int]:
        """The request's prompt ids, or the 400 saying why it cannot be prompted."""
        try:
            prompt = self._prompt(s, req)
        except ChatTemplateError as exc:
            raise GatewayError(400, f"messages: {exc}", param="messages") from None
        if len(prompt) >= self.max_context:
            raise GatewayError(
                400,
                f"messages: the prompt has {len(prompt)} tokens, the context holds {self.max_context}",
                param="messages",
                code="context_length_exceeded",
            )
        return prompt

    async def _generate(self, s: Session, req: ChatRequest, prompt: list[int]) -> list[tuple[Sample, int]]:
        """Sample ``req.n`` completions once admitted; 401 if the session closed meanwhile."""
        sp = self._sampling(req, self.max_context - len(prompt))
        await self._admit_call()
        self.pending += req.n
        s.in_flight += 1
        try:
            results = await asyncio.gather(*(self.batcher.generate(list(prompt), sp) for _ in range(req.n)))
        finally:
            self.pending -= req.n
            s.in_flight -= 1
        if s.finished:  # closed meanwhile (the agent was cancelled): record nothing
            raise _unauthorized("session finished during the call", "session_finished")
        return list(results)

    def _choice(
        self, index: int, req: ChatRequest, rec: CallRecord, *, cut: bool, n_calls: int
    ) -> tuple[dict[str, object], ReplyKey]:
        """One OpenAI choice for a recorded completion, and the key the next call's prompt matches."""
        choice_mode, choice_fn = req.tool_choice_mode()
        ids = rec.completion_ids
        # tool_choice "none": the tools stay in the prompt (so it still extends the session's
        # prompt token-exactly), the reply is not parsed for calls
        reply = self.messages.parse(ids, [] if choice_mode == "none" else req.tools or [], 10 * n_calls)
        content, calls = reply.content, [(n, a) for n, a, _ in reply.calls]
        if (choice_mode == "required" and not calls) or (
            choice_mode == "function" and [n for n, _ in calls] != [choice_fn]
        ):
            # Not enforced by constrained decoding: that would sample tokens the policy did not
            # choose, and their log-probs would no longer be the behaviour policy's. Counted.
            self.counts["tool_choice_unmet"] += 1
        tool_calls = [
            {"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
            for n, a, cid in reply.calls
        ]
        stopped = rec.finish_reason == "stop" or cut
        finish = "tool_calls" if tool_calls else ("stop" if stopped else "length")
        message: dict[str, object] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        if reply.reasoning is not None:  # text before the answer or call is not dropped
            message["reasoning_content"] = reply.reasoning
        logprobs = logprobs_block(self.messages.token_strings(ids), rec.logprobs) if req.logprobs else None
        choice = {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
        return choice, _key(content, calls)

    # -- HTTP --------------------------------------------------------------------------------------
    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._http_chat, methods=["POST"]),
                Route("/v1/models", self._http_models, methods=["GET"]),
                Route("/v1/sessions/{sid}/reward", self._http_reward, methods=["POST"]),
            ]
        )

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.cfg.max_body_bytes:
            raise self._too_large()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.cfg.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> GatewayError:
        return GatewayError(
            413,
            f"the request body is larger than gateway.max_body_bytes={self.cfg.max_body_bytes}",
            code="request_too_large",
        )

    async def _http_chat(self, request: Request) -> Response:
        try:
            s = self.session_of(request.headers.get("authorization"))
            req = parse_request(await self._body(request))
            aux = request.headers.get("x-asyncrl-auxiliary", "") in ("1", "true")
            body = await self.chat(s, req, auxiliary=aux)
        except GatewayError as exc:
            if exc.code == "session_finished":  # the episode was cancelled (shutdown, agent timeout)
                self.counts["cancelled_calls"] += 1
            elif exc.status != 429:
                self.counts["errors_4xx"] += 1
            return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)
        except ClientDisconnect:  # the agent went away mid-request (its episode was cancelled): not an error
            self.counts["cancelled_calls"] += 1
            return Response(status_code=499)
        except Exception as exc:  # an engine failure: the client sees a 500, the worker keeps going
            log.exception("gateway: call failed")
            err = GatewayError(500, f"generation failed: {type(exc).__name__}: {exc}", type_="server_error")
            return JSONResponse(err.body(), status_code=500)
        if req.stream:
            chunks = stream_chunks(body)

            async def events() -> AsyncIterator[str]:
                for c in chunks:
                    yield f"data: {json.dumps(c)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(body)

    async def _http_models(self, request: Request) -> Response:
        try:
            self.session_of(request.headers.get("authorization"))
        except GatewayError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        model = {"id": self.cfg.model_name, "object": "model", "created": 0, "owned_by": "asyncrl"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _http_reward(self, request: Request) -> Response:
        try:
            s = self.session_of(request.headers.get("authorization"))
            if s.id != request.path_params["sid"]:
                raise _unauthorized("this key belongs to another session", "invalid_api_key")
            s.reward = parse_reward(await self._body(request))
        except GatewayError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        return JSONResponse({"id": s.id, "reward": s.reward})

    # -- serving -----------------------------------------------------------------------------------
    async def start(self, host: str | None = None, port: int | None = None) -> int:
        """Serve on this event loop; returns the bound port."""
        import uvicorn

        host = host or self.cfg.host
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("gateway binds %s: the policy is reachable from other machines (gateway.host)", host)
        config = uvicorn.Config(
            self.app(),
            host=host,
            port=self.cfg.port if port is None else port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # a bind failure propagates
            await asyncio.sleep(0.01)
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            await self._task

    @property
    def base_url(self) -> str:
        host = self.cfg.host
        if ":" in host and not host.startswith("["):  # an IPv6 address: bracketed in a URL (RFC 3986)
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"


def _unauthorized(message: str, code: str) -> GatewayError:
    return GatewayError(401, message, code=code, type_="authentication_error")


def _key(content: str | None, calls: list[tuple[str, str]]) -> ReplyKey:
    return (content or "", tuple((n, _canon(a)) for n, a in calls))


def _canon(arguments: str) -> str:
    try:
        return json.dumps(jsontext.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def _reply_key(m: Message) -> ReplyKey | None:
    if m.role != "assistant":
        return None
    return _key(m.text(), [(tc.function.name, tc.function.arguments) for tc in m.tool_calls or []])
