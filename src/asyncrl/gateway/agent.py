"""``env.kind: agent``: a user's agent program, run per episode against the worker's gateway.

The user writes ``async def run(task, client) -> float | None`` in their own module (``env.path =
"my_agents.calc:run"``); ``client`` is an ``openai.AsyncOpenAI`` bound to the episode's session. What
``run`` may return and what counts as a success (the ``success`` it returned, else the
``env.agent_tasks`` verifier on its last answer): docs/agents.md. Past
``rollout.gateway.agent_timeout_s`` the program is cancelled (outcome ``timeout``); an exception or a
non-finite reward ends the episode as ``env_error`` with reward 0 — neither reaches the worker.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from asyncrl.envs import call_env, close_env, make_raw_env
from asyncrl.errors import UserError
from asyncrl.gateway.server import Gateway
from asyncrl.gateway.sessions import Session, build_trajectories
from asyncrl.records import Outcome, SamplingParams, Task, Trajectory

if TYPE_CHECKING:
    from openai import DefaultAsyncHttpxClient

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
        self.counts: dict[str, float] = {"episodes": 0, "stale_sessions": 0, "agent_errors": 0, "per_call": 0}
        self.http: DefaultAsyncHttpxClient | None = None
        """One connection pool for every episode's client: building an ``openai.AsyncOpenAI`` with
        its own pool costs ~60 ms of event-loop time (an SSL context), with a shared one ~0.1 ms."""
        self.verifier = make_raw_env(cfg.env)
        """The ``env.agent_tasks`` environment: grades an agent's last answer (one at a time)."""
        self._grading = asyncio.Lock()

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
        await close_env(self.verifier)
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
            base_url=gw.base_url,
            api_key=session.key,
            max_retries=5,
            http_client=self.http,
            default_headers={"X-Asyncrl-Session": session.id},
        )
        outcome: Outcome = "failure"
        reward = 0.0
        try:
            result = await asyncio.wait_for(
                self.agent(task, client), self.cfg.rollout.gateway.agent_timeout_s
            )
            reward, success = _reward_and_success(result, session)
            if success is None:
                success = await self._verified(task, session)
            outcome = "success" if success else "failure"
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
            session, reward, outcome, worker_id=self.worker_id, sampling=gw.sampling, renderer=gw.renderer
        )
        self.counts["per_call"] += len(trajs) if len(trajs) > 1 else 0
        return trajs

    async def _verified(self, task: Task, session: Session) -> bool:
        """The task's verifier on the agent's last answer: the content of the reply to its last call,
        graded as an environment episode's final turn (a last reply that called a tool is no answer)."""
        last = session.last
        calls = [c for c in session.calls if not c.auxiliary]
        if last is None or not calls or last.record is not calls[-1] or len(last.replies) != 1:
            return False
        [(content, tool_calls)] = last.replies
        if tool_calls:
            return False
        async with self._grading:  # one environment instance grades one answer at a time
            await call_env(self.verifier.reset, task)
            result = await call_env(self.verifier.step, content)
        outcome = result.outcome or ("success" if result.reward > 0 else "failure")
        return bool(result.done) and outcome == "success"


def _reward_and_success(result: Any, session: Session) -> tuple[float, bool | None]:
    """What ``run`` returned as (reward, explicit success or None): a number, ``None`` (the posted
    reward, else 0), or ``{"reward": ..., "success": ...}`` (either key may be left out)."""
    success: Any = None
    if isinstance(result, Mapping):
        unknown = set(result) - {"reward", "success"}
        if unknown:
            raise TypeError(
                f"the agent returned keys {sorted(unknown)}; only 'reward' and 'success' are read"
            )
        success, result = result.get("success"), result.get("reward")
        if success is not None and not isinstance(success, bool):
            raise TypeError(f"the agent returned success={success!r}, not True or False")
    if result is None:
        result = session.reward if session.reward is not None else 0.0
    if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
        raise TypeError(f"the agent returned {result!r}, not a finite reward")
    return float(result), success
