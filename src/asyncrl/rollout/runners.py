"""Group runners: one protocol, ``run(ticket, task) -> Group``, for every shape a group takes
(:class:`FlatRunner`, :class:`TreeRunner`), its episodes played by a :class:`Player`
(:class:`EpisodePlayer`: environment episodes; :class:`AgentPlayer`: the user's program).

A runner reports each model turn and each episode's end to the group's
:class:`~asyncrl.control.admission.Ticket` (the worker's in-flight load) and returns the whole group;
the worker settles the ticket and delivers the group (:mod:`asyncrl.rollout.worker`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from asyncrl.config import RolloutSettings, RunConfig
from asyncrl.control.admission import Ticket
from asyncrl.envs import make_env
from asyncrl.records import Group, SamplingParams, Task, Trajectory, Turn, new_id
from asyncrl.rollout.tree import grow_tree

if TYPE_CHECKING:
    from asyncrl.engine.batcher import TurnBatcher
    from asyncrl.gateway.agent import AgentRunner
    from asyncrl.policy.renderer import Renderer


class Player(Protocol):
    """Plays one episode of ``task`` in group ``group_id``; returns its samples (none: it produced nothing)."""

    async def __call__(
        self, ticket: Ticket, task: Task, group_id: str, prefix: list[list[int]] | None = None
    ) -> list[Trajectory]: ...


class GroupRunner(Protocol):
    async def run(self, ticket: Ticket, task: Task, heldout: bool = False) -> Group: ...


@dataclass
class EpisodePlayer:
    """Environment episodes (:func:`asyncrl.rollout.episode.run_episode`), replaying ``prefix``'s model
    turns first (tree branches): the one episode player of the worker and of held-out evaluation
    (:func:`asyncrl.rollout.heldout.run_episodes`, which calls :meth:`episode`)."""

    settings: RolloutSettings
    batcher: TurnBatcher
    renderer: Renderer
    max_context: int
    worker: str
    rng: random.Random
    jitter: Callable[[], float]
    factor: Callable[[Task], float]
    """The task's factor on ``rollout.sampling.temperature`` (the orchestrator's entropy-collapse counter)."""

    async def episode(
        self,
        task: Task,
        env_seed: int,
        group_id: str = "",
        prefix: list[list[int]] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> list[Trajectory]:
        """One episode of ``task`` in a fresh environment seeded ``env_seed``; its samples."""
        from asyncrl.rollout.episode import EpisodeSettings, jittered, run_episode

        s = self.settings
        base = SamplingParams(
            **s.sampling.model_dump(exclude={"temperature"}),
            temperature=s.sampling.temperature * self.factor(task),
        )
        env = make_env(s.env, env_seed)
        settings = EpisodeSettings(
            s.env.max_turns,
            self.max_context,
            jittered(base, self.jitter(), self.rng),
            self.worker,
            early_stop_invalid=s.early_stop_invalid,
            on_turn=on_turn,
        )
        try:
            return await run_episode(task, env, self.batcher, self.renderer, settings, group_id, prefix)
        finally:
            await env.close()

    async def __call__(
        self, ticket: Ticket, task: Task, group_id: str, prefix: list[list[int]] | None = None
    ) -> list[Trajectory]:
        samples: list[Trajectory] = []
        try:
            samples = await self.episode(task, self.rng.randrange(2**31), group_id, prefix, ticket.turn_done)
            return samples
        finally:
            ticket.episode_done(sum(1 for tr in samples for t in tr.turns if t.role == "model"))


@dataclass
class AgentPlayer:
    """The user's program through the gateway (``env.kind: agent``, :class:`~asyncrl.gateway.agent.AgentRunner`)."""

    agent: AgentRunner

    async def __call__(
        self, ticket: Ticket, task: Task, group_id: str, prefix: list[list[int]] | None = None
    ) -> list[Trajectory]:
        try:
            out: list[Trajectory] = await self.agent.episode(task, group_id)
            return out
        finally:
            ticket.episode_done(0)  # the gateway does not report turns: the episode's turns leave at its end


@dataclass
class FlatRunner:
    """The ticket's :attr:`~asyncrl.control.admission.Ticket.size` independent episodes (``group_size``, or
    the bucket's adaptive size), played concurrently."""

    play: Player

    async def run(self, ticket: Ticket, task: Task, heldout: bool = False) -> Group:
        gid = new_id()
        episodes = await asyncio.gather(*(self.play(ticket, task, gid) for _ in range(ticket.size)))
        return Group.of(task, [t for ts in episodes for t in ts], id=gid, heldout=heldout)


class TreeRunner:
    """A tree group (``rollout.tree``): its leaves, grown by branching finished episodes; flat for
    held-out probes."""

    def __init__(self, cfg: RunConfig, play: Player) -> None:
        self.cfg, self.play = cfg, play
        self.flat = FlatRunner(play)

    async def run(self, ticket: Ticket, task: Task, heldout: bool = False) -> Group:
        if heldout:
            return await self.flat.run(ticket, task, heldout)
        rc, gid = self.cfg.rollout, new_id()

        async def leaf(prefix: list[Turn]) -> Trajectory:
            # one sample per episode: the preflight refuses rollout.tree with multi_turn per_turn
            (traj,) = await self.play(ticket, task, gid, [t.token_ids for t in prefix])
            return traj

        trajs, stats = await grow_tree(leaf, rc.tree, rc.group_size, rc.tree_max_leaves)
        return Group.of(task, trajs, id=gid, tree=stats)


def make_runner(cfg: RunConfig, play: Player) -> GroupRunner:
    """The runner of ``cfg``'s groups, playing episodes with ``play``."""
    if cfg.rollout.tree.enabled:
        return TreeRunner(cfg, play)
    return FlatRunner(play)
