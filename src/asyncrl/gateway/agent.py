"""``env.kind: agent``: a user's agent program, run per episode against the worker's gateway.

The user writes ``async def run(task, client) -> float | None`` in their own module (``env.path =
"my_agents.calc:run"``); ``client`` is an ``openai.AsyncOpenAI`` bound to the episode's session
(its own key, the gateway's base URL). The return value is the episode's reward; ``None`` takes
the reward posted to ``/v1/sessions/{id}/reward`` (0.0 when none was). The program runs under the
guard's rules: past ``rollout.gateway.agent_timeout_s`` it is cancelled (outcome ``timeout``);
an exception or a non-finite reward ends the episode as ``env_error`` with reward 0 — neither
reaches the worker. A session finished as stale yields no samples (counted).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from asyncrl.errors import UserError
from asyncrl.gateway.server import Gateway
from asyncrl.gateway.sessions import build_trajectories
from asyncrl.records import SamplingParams, Task, Trajectory

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.policy.chat import Renderer

log = logging.getLogger("asyncrl.gateway")
AgentFn = Callable[[Task, Any], Awaitable[Any]]


class AgentLoadError(UserError, ValueError):
    """``env.path`` does not name an async agent function; the message says what to fix."""


def load_agent(path: str) -> AgentFn:
    """Import ``package.module:function`` (the current directory is searched too)."""
    if not isinstance(path, str) or path.count(":") != 1 or not all(p.strip() for p in path.split(":")):
        raise AgentLoadError(f"env.path {path!r} must look like 'package.module:function'")
    module_name, attr = (p.strip() for p in path.split(":"))
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentLoadError(f"cannot import agent module {module_name!r}: {exc}") from None
    fn = getattr(module, attr, None)
    if fn is None or not asyncio.iscoroutinefunction(fn):
        raise AgentLoadError(f"{path}: expected 'async def {attr}(task, client) -> reward | None'")
    return fn  # type: ignore[no-any-return]


class AgentRunner:
    """Runs agent episodes through one gateway (a rollout worker's, or an evaluation's)."""

    def __init__(self, cfg: RunConfig, gateway: Gateway, worker_id: str = "") -> None:
        assert cfg.env.path is not None
        self.cfg, self.gateway, self.worker_id = cfg, gateway, worker_id
        self.agent = load_agent(cfg.env.path)
        s = cfg.rollout.sampling
        self.sampling = SamplingParams(
            temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens
        )
        self.counts: dict[str, float] = {"episodes": 0, "stale_sessions": 0, "agent_errors": 0, "per_call": 0}
        self.http: Any = None
        """One connection pool for every episode's client: building an ``openai.AsyncOpenAI`` with
        its own pool costs ~60 ms of event-loop time (an SSL context), with a shared one ~0.1 ms."""

    @classmethod
    async def start(
        cls,
        cfg: RunConfig,
        batcher: TurnBatcher,
        renderer: Renderer,
        max_context: int,
        *,
        index: int = 0,
        worker_id: str = "",
        **staleness: Any,
    ) -> AgentRunner:
        s = cfg.rollout.sampling
        sp = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_new_tokens)
        gw = Gateway(cfg.rollout.gateway, batcher, renderer, max_context, sp, **staleness)
        port = cfg.rollout.gateway.port
        await gw.start(port=port + index if port else 0)
        return cls(cfg, gw, worker_id)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        await self.gateway.stop()

    async def episode(self, task: Task, group_id: str = "") -> list[Trajectory]:
        """Run the agent on ``task`` in a fresh session; its calls as trajectories (see sessions)."""
        gw = self.gateway
        gw.batcher.live_episodes += 1  # the batcher waits for live episodes to join a batch
        try:
            return await self._episode(task, group_id)
        finally:
            gw.batcher.live_episodes -= 1

    async def _episode(self, task: Task, group_id: str) -> list[Trajectory]:
        import openai

        gw = self.gateway
        session = gw.sessions.open(task, group_id)
        if self.http is None:
            self.http = openai.DefaultAsyncHttpxClient()
        client = openai.AsyncOpenAI(
            base_url=gw.base_url, api_key=session.key, max_retries=5, http_client=self.http
        )
        outcome, reward = "failure", 0.0
        try:
            result = await asyncio.wait_for(
                self.agent(task, client), self.cfg.rollout.gateway.agent_timeout_s
            )
            if result is None:
                result = session.reward if session.reward is not None else 0.0
            if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
                raise TypeError(f"the agent returned {result!r}, not a finite reward")
            reward = float(result)
            outcome = "success" if reward > 0 else "failure"
        except TimeoutError:
            outcome = "timeout"
        except Exception as exc:  # the agent program is user code: its failure ends only its episode
            if not session.stale:
                self.counts["agent_errors"] += 1
                log.warning("agent episode failed: %s: %s", type(exc).__name__, exc)
            outcome = "env_error"
        finally:
            gw.sessions.close(session)  # the client's pool is shared: nothing to close
        self.counts["episodes"] += 1
        if session.stale:
            self.counts["stale_sessions"] += 1
            return []
        trajs = build_trajectories(
            session, reward, outcome, worker_id=self.worker_id, sampling=self.sampling, renderer=gw.renderer
        )
        self.counts["per_call"] += len(trajs) if len(trajs) > 1 else 0
        return trajs


async def run_agent_episodes(
    cfg: RunConfig, batcher: TurnBatcher, renderer: Renderer, max_context: int, tasks: list[Task]
) -> list[Trajectory]:
    """One agent episode per task through a private gateway (held-out evaluation); every sample of
    each episode (one merged sample, or one per call)."""
    runner = await AgentRunner.start(cfg, batcher, renderer, max_context, worker_id="eval")
    gate = asyncio.Semaphore(cfg.rollout.concurrent_episodes)

    async def one(task: Task) -> list[Trajectory]:
        async with gate:
            return await runner.episode(task)

    try:
        return [t for ts in await asyncio.gather(*(one(t) for t in tasks)) for t in ts]
    finally:
        await runner.stop()
