"""A rollout worker's admissions: one :class:`Ticket` per admitted group owns both what the group holds
of the staleness budget (rule 1, :meth:`RunState.admit`) and what it adds to the worker's in-flight load
(model turns its episodes may still take — what load balancing compares).

A ticket is admitted for :attr:`Ticket.size` episodes (``rollout.group_size``, or its bucket's size
under ``rollout.adaptive_group_size``) of ``max_turns`` turns each; the group runner plays that many. While the group runs its
episodes report each model turn (:meth:`Ticket.turn_done`) and their end (:meth:`Ticket.episode_done`:
the turns they did not take go back to the load). When the group is finished, :meth:`Ticket.deliver`
settles it — episodes that produced nothing go back to the budget (which counts episodes), the worker's
in-flight count follows the samples the group really holds (per-turn samples, per-call samples, a tree's
extra leaves) and they count as delivered, and whatever the ticket still holds of the load goes back — or :meth:`Ticket.release` returns everything (a held-out probe, an empty group). As
a context manager the ticket returns whatever it still holds when the group's code raises or is
cancelled, so a crash inside a group leaks neither budget nor load.
"""

from __future__ import annotations

from types import TracebackType

from asyncrl.control.run_state import RunState
from asyncrl.records import Group


class Admission:
    """A worker's side of rule 1 and its in-flight load, handed out as :class:`Ticket`\\ s."""

    def __init__(self, state: RunState, worker: str, group_size: int, max_turns: int) -> None:
        self.state, self.worker = state, worker
        self.group_size, self.max_turns = group_size, max_turns
        self.load = 0
        """Model turns the admitted groups' episodes may still take."""
        self.episodes = 0
        """Episodes of the open tickets (what ``rollout.concurrent_episodes`` bounds)."""

    def admit(self, worker_version: int, size: int | None = None) -> Ticket | None:
        """A ticket for one group of ``size`` episodes (default ``group_size``) if the staleness budget
        admits it (counted against the version the worker's engine holds), else ``None``."""
        size = self.group_size if size is None else size
        if not self.state.admit(self.worker, size, worker_version):
            return None
        return Ticket(self, size)


class Ticket:
    """One admitted group's claim on the budget and the load (module docstring)."""

    def __init__(self, admission: Admission, size: int) -> None:
        self.admission, self.size = admission, size
        """``size``: the episodes admitted, which the group runner plays."""
        self.reserved = size * admission.max_turns
        """Turns of the load this ticket still holds."""
        self.open = True
        admission.load += self.reserved
        admission.episodes += size

    def turn_done(self) -> None:
        """A model turn of one of the group's episodes is done."""
        self.admission.load -= 1
        self.reserved -= 1

    def episode_done(self, turns_taken: int) -> None:
        """An episode ended after ``turns_taken`` model turns: the rest of its turns leave the load."""
        rest = self.admission.max_turns - turns_taken
        self.admission.load -= rest
        self.reserved -= rest

    def _close(self) -> None:
        self.admission.load -= self.reserved  # a tree's extra leaves took more than admitted: back up
        self.admission.episodes -= self.size
        self.reserved, self.open = 0, False

    def deliver(self, group: Group) -> None:
        """``group`` is in the queue: its empty episodes go back to the budget, and its samples (more or
        fewer than the ``size`` episodes admitted) are delivered."""
        a = self.admission
        state, worker = a.state, a.worker
        empty = max(0, self.size - group.episodes)  # episodes that produced nothing: back to the budget
        state.release(worker, empty)
        state.delivered(worker, self.size - empty)  # the rest of what was admitted is in the queue
        self._close()

    def release(self) -> None:
        """The group never reaches the trainer (a held-out probe, nothing produced): its admissions go back."""
        self.admission.state.release(self.admission.worker, self.size)
        self._close()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.open:  # raised or cancelled before it was settled: return what it holds
            self.release()
