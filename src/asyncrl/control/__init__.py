"""The run's shared control state: the staleness rules, the state store, and the typed interface
every role uses (:class:`RunState`).

Floors: this package sits on ``records`` and ``config`` (and the Redis helpers of ``credentials``
and ``transport``); the rollout workers, the trainer, the evaluator, the orchestrator and the
services above it use only :class:`RunState`, :class:`StalenessPolicy`, :class:`WorkerControl` and
the bucket helpers — never a state-store key.

* :class:`StalenessPolicy` — re-exported from :mod:`asyncrl.staleness` (floor 0, so the config can ask it
  too), the off-policy rules (admission, refresh, age, modes);
* :mod:`asyncrl.control.run_state` — :class:`RunState`, the typed shared state;
* :mod:`asyncrl.control.directives` — the orchestrator <-> worker channel;
* :mod:`asyncrl.control.worker` — :class:`WorkerControl`, a rollout worker's side of it;
* :mod:`asyncrl.control.buckets` — task buckets;
* :mod:`asyncrl.control.store` — the storage boundary (SQLite, Redis).
"""

from __future__ import annotations

from asyncrl.control.directives import Exploration
from asyncrl.control.run_state import Fate, RunState
from asyncrl.control.worker import WorkerControl
from asyncrl.staleness import StalenessPolicy

__all__ = [
    "Exploration",
    "Fate",
    "RunState",
    "StalenessPolicy",
    "WorkerControl",
]
