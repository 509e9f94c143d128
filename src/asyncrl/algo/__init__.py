"""Pure RL algorithm core of asyncrl: tensors and plain config in, tensors and metrics out.

This package imports only ``torch``, ``pydantic`` and the standard library (``typing``, ``math``,
``importlib``) — never another ``asyncrl`` module — and performs no I/O. Formulas, conventions and
references for every function are in ``docs/algorithms.md``.

The package re-exports the ``__all__`` of each module: the names of ``config`` (pydantic) at once,
those of :data:`MODULES` (computed with torch) on first use (PEP 562 ``__getattr__``). ``asyncrl.config``
reads only ``algo.config``, so the commands that compute nothing (``asyncrl --help``, ``config``,
``status``, ``stop``, ``cost``) start without importing torch (~1.5 s of CPU). Each name is listed once,
in the ``__all__`` of the module that defines it; mypy reads the same lists through the star imports
under ``TYPE_CHECKING`` (``tests/test_algo.py`` checks that they name :data:`MODULES`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from . import config
from .config import *  # noqa: F403

MODULES = ("advantages", "gap", "kl", "losses", "returns", "segments", "tree")
"""The modules whose ``__all__`` the package exports lazily (each imports torch)."""

if TYPE_CHECKING:  # mypy reads the modules' ``__all__`` here; it does not see ``__getattr__`` below
    from .advantages import *  # noqa: F403
    from .gap import *  # noqa: F403
    from .kl import *  # noqa: F403
    from .losses import *  # noqa: F403
    from .returns import *  # noqa: F403
    from .segments import *  # noqa: F403
    from .tree import *  # noqa: F403
else:  # so that it flags a name no module exports, where a ``__getattr__`` would make it ``object``

    def __getattr__(name: str) -> object:
        """A name of a :data:`MODULES` module's ``__all__`` (or the package's ``__all__``), loaded with
        every such module — and torch — on first use and kept. A submodule's own name, and a dunder
        the import system probes, is refused at once (the import system then loads the submodule)."""
        if name in MODULES or (name.startswith("__") and name != "__all__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        exports = {"__all__": list(config.__all__)}
        for mod in (importlib.import_module(f".{m}", __name__) for m in MODULES):
            exports["__all__"] += mod.__all__
            exports.update((n, vars(mod)[n]) for n in mod.__all__)
        if name not in exports:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        globals().update(exports)
        return exports[name]
