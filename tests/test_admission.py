"""The admission ticket (:mod:`asyncrl.control.admission`) and the group runners (:mod:`asyncrl.rollout.runners`):
one ticket owns a group's budget and load from admission to delivery, whatever shape the group takes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.control import RunState
from asyncrl.control.admission import Admission, Ticket
from asyncrl.records import Group, Task, Trajectory, TreeStats, Turn
from asyncrl.rollout.runners import FlatRunner, TreeRunner

G, T = 4, 3  # group size, max turns


def sample(group: str, episode: str = "", turns: int = 1) -> Trajectory:
    parts = [Turn(role="env", token_ids=[1])]
    parts += [Turn(role="model", token_ids=[2], logprobs=[-0.1], version=0) for _ in range(turns)]
    return Trajectory(
        id=f"{group}-{episode}-{id(parts)}", task=TASK, turns=parts, group_id=group, episode_id=episode
    )


TASK = Task(id="t", task_type="unit")


@pytest.fixture
def admission(tmp_path: Path) -> Admission:
    state = RunState.open(load_config(None, [f"rollout.group_size={G}", f"env.max_turns={T}"]), tmp_path)
    return Admission(state, "rollout-0", G, T)


def inflight(a: Admission) -> int:
    return a.state.store.get(f"inflight:{a.worker}")


def test_a_ticket_holds_its_turns_until_the_episodes_end_and_delivers_its_samples(
    admission: Admission,
) -> None:
    ticket = admission.admit(0)
    assert ticket is not None and admission.load == G * T and inflight(admission) == G
    ticket.turn_done()
    ticket.turn_done()
    assert admission.load == G * T - 2
    ticket.episode_done(2)  # the episode took 2 of its 3 turns: the third leaves the load
    assert admission.load == G * T - 3
    # per-turn samples: 3 episodes gave 2 samples each, one episode gave nothing
    members = [sample("g", f"e{k}") for k in range(3) for _ in range(2)]
    ticket.deliver(Group.of(TASK, members, id="g"))
    assert admission.load == 0 and inflight(admission) == 0 and not ticket.open
    assert admission.state.store.get("released") == 1  # the empty episode's admission went back


def test_a_tree_that_grew_past_its_size_leaves_the_load_at_zero(admission: Admission) -> None:
    """Eight leaves on a ticket admitted for four episodes: every leaf returns its turns, and the ticket
    gives back what it never held (the worker's old arithmetic drove the load negative here)."""
    ticket = admission.admit(0)
    assert ticket is not None
    for _ in range(2 * G):
        ticket.turn_done()
        ticket.episode_done(1)
    ticket.deliver(Group.of(TASK, [sample("g", f"e{k}") for k in range(2 * G)], id="g"))
    assert admission.load == 0 and inflight(admission) == 0


def test_a_group_that_raises_returns_everything_its_ticket_holds(admission: Admission) -> None:
    ticket = admission.admit(0)
    assert ticket is not None
    with pytest.raises(RuntimeError), ticket:
        ticket.turn_done()
        raise RuntimeError("an episode failed")
    assert admission.load == 0 and inflight(admission) == 0 and admission.state.store.get("released") == G
    held_out = admission.admit(0)
    assert held_out is not None
    with held_out:
        held_out.release()  # a held-out probe: measured, never trained
    assert admission.load == 0 and inflight(admission) == 0 and admission.state.store.get("released") == 2 * G


def test_the_budget_refuses_a_ticket(admission: Admission) -> None:
    tickets = []
    while (t := admission.admit(0)) is not None:
        tickets.append(t)
    limit = admission.state.staleness.admission_limit(
        0, admission.state.effective_max_staleness(), worker_version=0
    )
    assert len(tickets) == limit // G and admission.load == len(tickets) * G * T


class ScriptedPlayer:
    """Episodes of one sample each (``samples`` per episode), their turns reported to the ticket."""

    def __init__(self, samples: int = 1) -> None:
        self.samples, self.prefixes = samples, []  # type: ignore[var-annotated]

    async def __call__(
        self, ticket: Ticket, task: Task, group_id: str, prefix: list[list[int]] | None = None
    ) -> list[Trajectory]:
        self.prefixes.append(prefix)
        ticket.turn_done()
        ticket.episode_done(1)
        episode = f"e{len(self.prefixes)}"
        return [sample(group_id, episode) for _ in range(self.samples)]


def test_a_flat_runner_returns_the_whole_group_and_settles_its_load(admission: Admission) -> None:
    ticket = admission.admit(0)
    assert ticket is not None
    group = asyncio.run(FlatRunner(ScriptedPlayer(samples=2)).run(ticket, TASK))
    assert len(group) == 2 * G and group.episodes == G and group.tree is None
    assert all(t.group_id == group.id for t in group.members)
    ticket.deliver(group)
    assert admission.load == 0 and inflight(admission) == 0


def test_a_tree_runner_grows_a_tree_and_runs_held_out_probes_flat(admission: Admission) -> None:
    cfg = load_config(None, [f"rollout.group_size={G}", "rollout.tree.enabled=true", "rollout.tree.roots=2"])
    player = ScriptedPlayer()
    ticket = admission.admit(0)
    assert ticket is not None
    group = asyncio.run(TreeRunner(cfg, player).run(ticket, TASK))
    assert (
        isinstance(group.tree, TreeStats) and group.tree.roots >= 2 and len(group) == G
    )  # no turn to branch at
    probe = admission.admit(0)
    assert probe is not None
    flat = asyncio.run(TreeRunner(cfg, player).run(probe, TASK, heldout=True))
    assert flat.tree is None and flat.heldout and len(flat) == G
