"""The control-plane state boundary (backends and the factory: :mod:`asyncrl.control.store`).

A store holds only small rows: named integer ``counters``, boolean ``flags``, the ``ledger`` (one fate
per trajectory id: the primary key makes "trained twice" impossible to record silently, a second
insert is counted in ``duplicates``) and named JSON ``docs``. Which names exist and what they mean is
:mod:`asyncrl.control.run_state`'s business: roles never use the store directly, they go through
:class:`asyncrl.control.RunState`. The staleness *rules* live in :mod:`asyncrl.staleness`; the store
only stores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any


class StateStore(ABC):
    """The orchestrator-state boundary: every method is atomic and safe across processes.

    Counters are integers (missing = ``default``); flags are booleans (missing = False); the
    ledger records each consumed trajectory once; documents are JSON objects replaced whole.
    """

    @abstractmethod
    def get(self, name: str, default: int = 0) -> int: ...

    @abstractmethod
    def set_value(self, name: str, value: int) -> None: ...

    @abstractmethod
    def add(self, name: str, delta: int) -> int:
        """Atomically add ``delta`` to counter ``name``; returns the new value."""

    @abstractmethod
    def try_add_within(self, name: str, delta: int, limit_fn: Callable[[dict[str, int]], int]) -> bool:
        """Atomically add ``delta`` to ``name`` if the result is at most ``limit_fn(all counters)``."""

    @abstractmethod
    def counters(self) -> dict[str, int]: ...

    @abstractmethod
    def flag(self, name: str) -> bool: ...

    @abstractmethod
    def set_flag(self, name: str, value: bool) -> None: ...

    @abstractmethod
    def record(self, rows: Iterable[tuple[str, str, int, int]]) -> int:
        """Record ``(traj_id, fate, step, age)`` rows; returns how many ids were already recorded."""

    @abstractmethod
    def ledger_ids(self) -> set[str]: ...

    @abstractmethod
    def ledger_counts(self) -> dict[str, int]: ...

    @abstractmethod
    def ages(self) -> list[int]:
        """Age (in versions) of every trained sample (for the staleness histogram)."""

    @abstractmethod
    def put_doc(self, name: str, doc: dict[str, Any]) -> None:
        """Replace the JSON document ``name`` (atomically)."""

    @abstractmethod
    def get_doc(self, name: str) -> dict[str, Any] | None:
        """The JSON document ``name``, or None if it was never written."""

    @abstractmethod
    def close(self) -> None: ...
