"""Gateway sessions: one per agent episode, every call recorded, calls turned into training samples.

A session has a random API key and, drawn apart, a random id (safe to log and to put in a URL); each
call made with it is a :class:`CallRecord` (prompt ids, sampled completion ids, behaviour log-probs,
weight version). When the agent finishes, :func:`build_trajectories` makes the calls ONE multi-turn
trajectory when every call's prompt starts with the previous call's prompt + completion, token for
token, else one trajectory per call; text is never re-tokenised to force a merge. The trajectories,
their exactness (``render_diff``), auxiliary calls and stale sessions: docs/agents.md ("From calls to
training samples", "Back-pressure and the staleness bound").
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field

from asyncrl.gateway.protocol import Message as RequestMessage
from asyncrl.gateway.protocol import ToolDef
from asyncrl.gateway.render import MessageRenderer
from asyncrl.policy.chat import Message, Renderer
from asyncrl.policy.exactness import count_differences
from asyncrl.records import Lifecycle, Outcome, SamplingParams, Task, Trajectory, Turn, new_id


@dataclass
class CallRecord:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str
    auxiliary: bool = False
    started_at: float = 0.0
    ended_at: float = 0.0


ReplyKey = tuple[str, tuple[tuple[str, str], ...]]
"""An assistant message as compared for continuation: (content, ((tool name, canonical arguments), ...))."""


@dataclass
class LastCall:
    """What the next request must repeat to be continued append-only (see the gateway's ``_prompt``)."""

    messages: list[RequestMessage]
    tools: list[ToolDef]
    replies: set[ReplyKey]
    record: CallRecord


@dataclass
class Session:
    key: str
    task: Task
    group_id: str = ""
    calls: list[CallRecord] = field(default_factory=list)
    finished: bool = False
    stale: bool = False
    reward: float | None = None
    """Set by ``POST /v1/sessions/{id}/reward`` (used when the agent returns ``None``)."""
    last: LastCall | None = None
    """The last (non-auxiliary, n = 1) call: what a continuation must repeat."""
    created: float = field(default_factory=time.time)
    in_flight: int = 0
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    """Names the session in URLs (``/v1/sessions/{id}/reward``) and logs: drawn on its own, so it tells
    nothing of the key (the key alone authenticates)."""

    def first_version(self) -> int | None:
        return min((c.version for c in self.calls), default=None)


class SessionTable:
    """Live sessions by key; a finished session's key stops working at once."""

    def __init__(self) -> None:
        self._live: dict[str, Session] = {}
        self.stale = 0

    def open(self, task: Task, group_id: str = "") -> Session:
        s = Session(key="sk-asyncrl-" + secrets.token_hex(24), task=task, group_id=group_id)
        self._live[s.key] = s
        return s

    def get(self, key: str) -> Session | None:
        return self._live.get(key)

    def close(self, session: Session, stale: bool = False) -> None:
        if self._live.pop(session.key, None) is not None:
            self.stale += stale
        session.finished = True
        session.stale = session.stale or stale

    def __len__(self) -> int:
        return len(self._live)


def extends(prev: CallRecord, nxt: CallRecord) -> bool:
    """Whether ``nxt``'s prompt begins with ``prev``'s prompt + completion, token for token."""
    head = prev.prompt_ids + prev.completion_ids
    return len(nxt.prompt_ids) >= len(head) and nxt.prompt_ids[: len(head)] == head


def build_trajectories(
    session: Session,
    reward: float,
    outcome: Outcome,
    *,
    worker_id: str = "",
    sampling: SamplingParams | None = None,
    renderer: Renderer | None = None,
) -> list[Trajectory]:
    """The session's (non-auxiliary) calls as trajectories; see docs/agents.md for their
    exactness (``render_diff``); ``retokenization_diff`` counts where decoding the trained ids to
    text and tokenising it anew would differ (with a renderer)."""
    calls = [c for c in session.calls if not c.auxiliary]
    sp = sampling or SamplingParams()
    episode = new_id()

    def traj(turns: list[Turn], per_call: bool, render_diff: int | None) -> Trajectory:
        life = Lifecycle(created=session.created, rollout_start=session.created, rollout_end=time.time())
        t = Trajectory(
            id=new_id(),
            task=session.task,
            turns=turns,
            final_reward=reward,
            outcome=outcome,
            lifecycle=life,
            worker_id=worker_id,
            group_id=session.group_id,
            sampling=sp,
            episode_id=episode,
            render_diff=render_diff,
        )
        t.retokenization_diff = _retokenized(renderer, t.token_ids())
        t.reward_components["outcome"] = reward
        t.reward_components["gateway/per_call"] = float(per_call)
        t.validate()
        return t

    def model(c: CallRecord) -> Turn:
        return Turn(
            role="model",
            token_ids=list(c.completion_ids),
            logprobs=list(c.logprobs),
            version=c.version,
            started_at=c.started_at,
            ended_at=c.ended_at,
        )

    if not calls:
        return [traj([], False, None)]
    if all(extends(a, b) for a, b in itertools.pairwise(calls)):
        turns = [Turn(role="env", token_ids=list(calls[0].prompt_ids)), model(calls[0])]
        for a, b in itertools.pairwise(calls):
            obs = b.prompt_ids[len(a.prompt_ids) + len(a.completion_ids) :]
            turns += [
                Turn(role="tool", token_ids=obs, started_at=a.ended_at, ended_at=b.started_at),
                model(b),
            ]
        return [traj(turns, False, _merged_diff(session, calls, renderer))]
    return [traj([Turn(role="env", token_ids=list(c.prompt_ids)), model(c)], True, None) for c in calls]


def _merged_diff(session: Session, calls: list[CallRecord], renderer: Renderer | None) -> int | None:
    """Tokens where a merged sample (the last call's prompt + completion) differs from the template's
    rendering of the last request's chat with every call's completion spliced in; ``None``: unchecked."""
    last = session.last
    if renderer is None or last is None or last.record is not calls[-1]:
        return None
    ids = [*calls[-1].prompt_ids, *calls[-1].completion_ids]
    conv = MessageRenderer(renderer)
    chat = [*conv.messages(last.messages), Message(role="assistant", content="")]  # the last completion
    return renderer.spliced_diff(ids, chat, [c.completion_ids for c in calls], conv.schemas(last.tools))


def _retokenized(renderer: Renderer | None, ids: list[int]) -> int:
    """Tokens where the trained ids' text, tokenised anew, differs (0 without a renderer to ask)."""
    if renderer is None or not ids:
        return 0
    tok = renderer.tokenizer
    return count_differences(
        ids, list(tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False))
    )
