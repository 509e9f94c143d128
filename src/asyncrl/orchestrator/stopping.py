"""Stopping a run on purpose: SIGINT (Ctrl-C), SIGTERM (``kill``, ``timeout``, Slurm, Kubernetes),
SIGHUP (a closed terminal) and ``asyncrl stop RUN`` all end a run the same way.

The rule, in the order things happen:

1. The orchestrator's process catches the signal (:class:`StopSignals`; the role processes run in
   sessions of their own, so a terminal's Ctrl-C or a process-group signal reaches only it).
2. While it supervises, it sets the run's ``stop`` flag: every role stops at its next safe point —
   the trainer after its current step, writing a checkpoint of what it trained; a rollout worker
   after delivering or giving back what it admitted; the evaluator between evaluations. Unacked
   queue entries stay in the queue (they are redelivered on resume). It waits up to
   ``launcher.stop_grace_s`` for them, then kills what is left; a second signal kills at once.
   While it works in its own process (warm start, initial or final evaluation) the signal
   interrupts that work directly.
3. ``run.json`` says ``"status": "stopped"`` with the signal, the phase, the trainer step and
   version; one line on stderr says how to resume; the command exits with ``128 + signal``
   (1 for a run that failed, 0 for a finished one).

``asyncrl train --resume RUN`` continues a stopped run from its newest checkpoint (a run stopped
while it was being prepared is prepared again), and refuses to touch a finished one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """The run was stopped on purpose (a signal or ``asyncrl stop``); a BaseException like
    KeyboardInterrupt, so that no ``except Exception`` in the work it interrupts swallows it."""

    def __init__(self, signum: int, phase: str = "", run_dir: str = "") -> None:
        super().__init__(signum, phase, run_dir)
        self.signum, self.phase, self.run_dir = signum, phase, run_dir

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def message(self) -> str:
        name = signal.Signals(self.signum).name
        where = f" during {self.phase}" if self.phase else ""
        if not self.run_dir:
            return f"asyncrl: stopped by {name}{where}; nothing was written"
        return f"asyncrl: stopped by {name}{where}; resume with: asyncrl train --resume {self.run_dir}"


class StopSignals:
    """The orchestrator's stop signals, counted. In *flag* mode (supervising) a signal is only
    recorded and the loop polls :attr:`signum`; in *raise* mode (work in this process) it raises
    :class:`Stopped`. A second signal always raises: whatever is waiting is cut short.

    Handlers are installed only in the main thread (a run driven from another thread, as in
    tests, is stopped through the control state instead) and restored on exit."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.raising = True
        self.on_signal: Callable[[], None] | None = None
        """Called at each signal in flag mode (a role service: ``RunState.stop_here``)."""
        self._saved: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        self.signum = self.signum or signum
        if self.on_signal is not None and not self.raising:
            self.on_signal()
        if self.raising or self.count > 1:
            raise Stopped(self.signum)

    def arm(self) -> None:
        """Install (again: a library such as Ray may have replaced the SIGTERM handler meanwhile)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in STOP_SIGNALS:
            old = signal.signal(s, self._handle)
            if old is not self._handle and s not in self._saved:
                self._saved[s] = old
            # a shell that starts a job in the background without job control sets SIGINT to ignored;
            # the handler above takes it back: Ctrl-C and `kill -INT` stop the run wherever it started

    def disarm(self) -> None:
        for s, old in self._saved.items():
            signal.signal(s, old)  # type: ignore[arg-type]
        self._saved.clear()

    def request(self, signum: int, *, force: bool = False) -> None:
        """A stop asked for without a signal (``asyncrl stop``; ``force``: no grace period)."""
        self.signum = self.signum or signum
        self.count = max(self.count, 2 if force else 1)

    @property
    def forced(self) -> bool:
        return self.count > 1

    @contextmanager
    def mode(self, raising: bool) -> Iterator[None]:
        """Run the block in raise (True) or flag (False) mode; a signal recorded before entering raise
        mode raises at once."""
        before, self.raising = self.raising, raising
        try:
            if raising and self.signum is not None:
                raise Stopped(self.signum)
            yield
        finally:
            self.raising = before


@contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """:class:`StopSignals` armed for the block (raise mode), disarmed after."""
    signals = StopSignals()
    signals.arm()
    try:
        yield signals
    finally:
        signals.disarm()
