"""The local launcher (``launcher.kind: local``): role processes on this machine (``multiprocessing``).
The contract: :mod:`asyncrl.launch.base`.

Each role runs in a session of its own (``setsid``): a terminal's Ctrl-C, a closed terminal's SIGHUP
and a signal to the launcher's process group (``timeout``, ``kill -- -PGID``) reach the orchestrator
alone, which stops the roles in order (:mod:`asyncrl.orchestrator.stopping`). A role never outlives
its orchestrator for long: it watches the orchestrator's heartbeat (``launcher.orphan_timeout_s``).

``launcher.start``: roles fork from one server process that imported their modules once (``forkserver``),
each with the launcher's environment of the moment it starts, or are spawned (a fresh interpreter each).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Literal

from asyncrl.launch.base import Launcher

_PRELOAD = ["asyncrl.trainer.process", "asyncrl.trainer.ranks", "asyncrl.rollout.worker"]
_PRELOAD += ["asyncrl.rollout.evaluator", "asyncrl.policy.model"]
# the transformers classes asyncrl.policy.model imports where it builds or loads a model
_PRELOAD += [f"transformers.models.{m}" for m in ("auto.modeling_auto", "auto.tokenization_auto")]
_PRELOAD += [f"transformers.models.{m}" for m in ("qwen2.modeling_qwen2", "llama.modeling_llama")]


def role_context(start: Literal["forkserver", "spawn"]) -> SpawnContext | ForkServerContext:
    """The multiprocessing context that starts role processes (``launcher.start``)."""
    if start == "spawn":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # read when the server starts (the first role of the process)
    return ctx


class LocalLauncher(Launcher):
    def __init__(self, start: Literal["forkserver", "spawn"]) -> None:
        self._ctx = role_context(start)
        self._procs: dict[str, BaseProcess] = {}

    def start(self, name: str, target: Callable[..., None], *args: object) -> None:
        # a forked role would inherit the server's environment of when it started: it gets ours
        env = dict(os.environ) if self._ctx.get_start_method() == "forkserver" else None
        proc = self._ctx.Process(target=_own_session, args=(target, env, *args), name=name, daemon=False)
        proc.start()
        self._procs[name] = proc

    def exitcode(self, name: str) -> int | None:
        proc = self._procs[name]
        return None if proc.is_alive() else proc.exitcode

    def pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        return proc.pid if proc is not None else None

    def stop(self, name: str, timeout: float) -> None:
        proc = self._procs.get(name)
        if proc is None:
            return
        proc.join(timeout)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    def names(self) -> list[str]:
        return list(self._procs)


def _own_session(target: Callable[..., None], env: dict[str, str] | None, *args: object) -> None:
    """A role process's entry: leave the launcher's session and process group, then run the role
    (``env``: the launcher's environment, for a role forked from the server)."""
    os.setsid()
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    target(*args)
