"""Core lending: a compute role that waits lends its cores to the roles that compute.

On a CPU machine every compute role (the trainer, each rollout worker, the evaluator) is pinned to
``launcher.torch_threads`` threads, so that the roles computing at the same time do not fight over
the cores. But an asynchronous run is rarely balanced: on the demo-real task the trainer is the
bottleneck and the rollout worker waits on the staleness budget about a fifth of the time; in
``sync`` mode the roles take turns. With ``launcher.lend_threads`` the cores of a waiting role go to
the roles still computing, and come back when it computes again.

The board
---------
The orchestrator owns a small shared signal, the **board** (``run_dir/cores/``): it creates it
with the **plan** (``plan.json``: how many cores the roles share, how long a role must have waited
before its cores are lent) when lending applies — ``launcher.kind: local``, a CPU model, one trainer
rank, more than one usable core — and not otherwise. On the board each compute role keeps one
16-byte slot (``NAME.slot``: computing or waiting, since when), written by that role only:

* *computing* — announced by the role's first forward pass after a wait (a hook on its decoder
  layers) and, for the evaluator, when an evaluation starts;
* *waiting* — announced where the role blocks: the trainer when no batch can be formed, a rollout
  worker when its batcher has no request left after a generation call, the evaluator after an
  evaluation.

The rule
--------
:func:`granted_threads`: the roles **holding** cores are those computing and those that have waited
for less than ``lend_after_ms`` (short gaps — between two model turns, between two training
steps — are not worth a switch, and would make two roles oversubscribe the cores back and forth).
A role that computes gets ``max(its own threads, cores // holders)``: alone, every core; with
another role computing, its pinned share. Each role applies the rule to itself (:class:`ThreadLender`)
in its compute thread, at most every ``launcher.lend_poll_ms`` (torch's thread count is per OS thread, and
``torch.set_num_threads`` costs well under a microsecond): at decode-step and decoder-layer
granularity, so a role that starts computing again has its cores back within about ``lend_poll_ms``.
The evaluator never borrows; niced (``telemetry.eval_idle: false``) it holds its core while it
evaluates, at ``SCHED_IDLE`` (the default) it does not join.

Each lender counts its **borrowed thread-seconds** (threads above its own, times the seconds it held
them: ``cores/borrowed_thread_seconds``); the run's summary adds them up as ``threads_lent_seconds``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.config import LocalLauncherConfig
from asyncrl.telemetry.reports import CoreFigures

if TYPE_CHECKING:
    import torch

    from asyncrl.config import RunConfig

log = logging.getLogger(__name__)
BOARD = "cores"
_SLOT = struct.Struct("<dd")  # computing (0 / 1), since (time.time())


@dataclass(frozen=True)
class Slot:
    """One role's entry on the board."""

    computing: bool
    since: float


@dataclass(frozen=True)
class Plan:
    """What the orchestrator decided for the run (``plan.json``)."""

    cores: int
    lend_after_s: float
    poll_s: float
    """``launcher.lend_poll_ms``: a decode step or a decoder layer's forward is shorter, so a
    returning role waits at most this long for its cores."""


def granted_threads(me: str, board: dict[str, Slot], now: float, plan: Plan, own: int) -> int:
    """Threads ``me`` may use now that it computes (module docstring, *The rule*): ``own`` (its
    pinned count) or, if fewer roles hold cores, its even share of ``plan.cores``."""
    holders = {r for r, s in board.items() if s.computing or now - s.since < plan.lend_after_s}
    holders.add(me)
    return max(own, plan.cores // len(holders))


def lending_plan(cfg: RunConfig) -> Plan | None:
    """The plan the orchestrator publishes, or None where lending does not apply (module docstring)."""
    from asyncrl.bootstrap import usable_cores
    from asyncrl.policy import resolve_device

    lc = cfg.launcher
    if not isinstance(lc, LocalLauncherConfig) or not lc.lend_threads or cfg.trainer.world_size > 1:
        return None
    if resolve_device(cfg.model.device).type != "cpu":  # GPU roles: docs/orchestrator.md#core-lending
        return None
    cores = usable_cores()
    if cores <= 1:
        log.warning(
            "launcher.lend_threads: one usable core (OMP_NUM_THREADS or the affinity mask): no lending"
        )
        return None
    return Plan(cores, lc.lend_after_ms / 1000, lc.lend_poll_ms / 1000)


def open_board(run_dir: Path, plan: Plan | None) -> None:
    """The orchestrator's side: a fresh board with ``plan``, or none (lending off)."""
    board = run_dir / BOARD
    for old in board.glob("*.slot"):  # a resumed run's roles announce themselves again
        old.unlink()
    if plan is None:
        (board / "plan.json").unlink(missing_ok=True)
        return
    board.mkdir(exist_ok=True)
    (board / "plan.json").write_text(json.dumps(dataclasses.asdict(plan)))


def read_board(run_dir: Path) -> dict[str, Slot]:
    """Every role's slot (a slot being rewritten is read as computing: never lend by mistake)."""
    out = {}
    for path in (run_dir / BOARD).glob("*.slot"):
        raw = path.read_bytes()
        computing, since = _SLOT.unpack(raw) if len(raw) == _SLOT.size else (1.0, 0.0)
        out[path.stem] = Slot(computing > 0, since)
    return out


class ThreadLender:
    """One role's side of the board (module docstring): announces computing / waiting, and in its
    compute thread keeps torch's thread count at :func:`granted_threads`."""

    def __init__(self, run_dir: Path, name: str, plan: Plan, own: int, borrow: bool = True) -> None:
        self.run_dir, self.name, self.plan, self.own, self.borrow = run_dir, name, plan, own, borrow
        self.path = run_dir / BOARD / f"{name}.slot"
        self.threads = own
        self.borrowed_seconds = 0.0
        self._computing: bool | None = None
        self._polled = self._mark = 0.0
        self._lock = threading.Lock()  # the worker announces from its event loop, polls from a thread

    @classmethod
    def join(
        cls,
        run_dir: Path,
        name: str,
        own: int,
        borrow: bool = True,
        models: Sequence[torch.nn.Module] = (),
    ) -> ThreadLender | None:
        """This role's lender, or None where the orchestrator published no plan (lending off),
        :meth:`attach`-ed to each of ``models`` (polled before each of their decoder layers: the
        trainer's policy; what a worker's engine runs, its merged copy and fused decode step included,
        :meth:`~asyncrl.engine.base.GenerationEngine.compute_modules`)."""
        path = run_dir / BOARD / "plan.json"
        if not path.is_file():
            return None
        lender = cls(run_dir, name, Plan(**json.loads(path.read_text())), own, borrow)
        for model in models:
            lender.attach(model)
        return lender

    def _announce(self, computing: bool) -> None:
        if self._computing == computing:
            return
        self._computing = computing
        tmp = self.path.with_suffix(f".{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(_SLOT.pack(float(computing), time.time()))
        tmp.replace(self.path)  # readers see the old slot or the new one, never half of one

    def computing(self) -> None:
        with self._lock:
            self._announce(True)

    def waiting(self) -> None:
        """The role blocks: announce it, and count the borrowed threads held until now."""
        with self._lock:
            self._account(self.own)
            self._announce(False)

    def _account(self, threads: int) -> None:
        now = time.monotonic()
        if self.threads > self.own:
            self.borrowed_seconds += (self.threads - self.own) * (now - self._mark)
        self.threads, self._mark = threads, now

    def poll(self) -> None:
        """In the compute thread: announce computing; at most every ``plan.poll_s``, set this thread's torch
        threads to the role's grant."""
        import torch

        now = time.monotonic()
        if self._computing and now - self._polled < self.plan.poll_s:
            return
        with self._lock:
            self._announce(True)
            self._polled = now
            grant = self.own
            if self.borrow:
                grant = granted_threads(self.name, read_board(self.run_dir), time.time(), self.plan, self.own)
            if grant != self.threads:
                self._account(grant)
        if torch.get_num_threads() != grant:  # per OS thread: the worker generates in a pool thread
            torch.set_num_threads(grant)

    def attach(self, model: torch.nn.Module) -> None:
        """Poll before every decoder layer's forward (recomputed layers in a checkpointed backward
        included), or before the model's where it has no ``layers`` list."""
        import torch

        layers = next(
            (
                m
                for n, m in model.named_modules()
                if n.endswith("layers") and isinstance(m, torch.nn.ModuleList)
            ),
            None,
        )
        for module in list(layers) if layers is not None else [model]:
            module.register_forward_pre_hook(lambda _module, _args: self.poll())

    def figures(self) -> CoreFigures:
        """The role report's ``cores`` section (borrowed thread-seconds so far, threads now)."""
        with self._lock:
            self._account(self.threads)
        return CoreFigures(borrowed_thread_seconds=self.borrowed_seconds, threads=float(self.threads))
