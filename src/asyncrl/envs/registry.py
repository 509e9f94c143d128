"""Building environments and task sources from config: one ``ADAPTERS`` row per built-in kind; plugins.

Conventions a plugin class (``env.path = "my_pkg.my_env:MyEnv"``) follows -- the built-ins
follow the very same ones:

* **Construction**: if the class has a classmethod ``from_config(cfg: EnvConfig)``, it is used;
  otherwise the class is called with ``**cfg.options``.
* **Task source**: a classmethod ``make_task_source(cfg: EnvConfig) -> TaskSource`` (anything
  with ``sample(rng, difficulty=None)``, ``heldout()``, ``task_types``, ``difficulties``;
  subclass :class:`~asyncrl.envs.base.HashSplitTaskSource` to get a disjoint held-out split for
  free).
* **Reference solver** (optional; used for warm starts and by ``check_environment``): static
  methods ``solve(task) -> list[str]`` and ``demonstrate(task, rng, corruption_rate) -> list[str]``.

Every user mistake in this chain is an :class:`EnvPluginError` whose message says what to fix;
no traceback is needed to understand it.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from asyncrl.envs.base import TaskSource
from asyncrl.envs.calculator import CalculatorEnv
from asyncrl.envs.class_env import ClassEnv
from asyncrl.envs.dataset_env import DatasetEnv
from asyncrl.envs.demos import TOOL_NOTE_TASKS, tool_note
from asyncrl.envs.gem_env import GemEnv
from asyncrl.envs.imports import EnvPluginError, import_object
from asyncrl.envs.kb_lookup import KBLookupEnv
from asyncrl.envs.mix import MixEnv, MixTaskSource, mix_members
from asyncrl.envs.openenv_env import OpenEnvEnv
from asyncrl.envs.python_env import PythonEnv
from asyncrl.envs.reasoning_gym_env import ReasoningGymEnv
from asyncrl.envs.strings import StringsEnv
from asyncrl.envs.verifiers_env import VerifiersEnv
from asyncrl.envs.wrappers import AnswerCostWrapper, FaultWrapper, GuardedEnv, LatencyWrapper
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig

__all__ = [
    "ADAPTERS",
    "Adapter",
    "EnvPluginError",
    "adapter",
    "check_heldout",
    "env_class",
    "env_where",
    "import_object",
    "load_plugin",
    "make_env",
    "make_task_source",
    "tool_notes",
]


@dataclass(frozen=True)
class Adapter:
    """What asyncrl asks of one environment kind: the one registration of a kind (``ADAPTERS``).

    A plugin class (``env.kind: plugin``) is read into the same record by :func:`plugin_adapter`."""

    env: type[Any]
    """The environment class: ``solve``/``demonstrate`` for warm starts and checks; its module is part of
    the warm start's code version."""
    config: str | None
    """The ``env.<config>`` section the kind is set up in (None: the top-level fields and ``env.options``)."""
    build: Callable[[EnvConfig], Any]
    """The environment of a config, unwrapped."""
    tasks: Callable[[EnvConfig], TaskSource]
    """The task source of a config."""
    grades_itself: bool = True
    """Its answer checks go through ``VERIFIER_CACHE`` (timed there); otherwise :func:`make_env` wraps it in
    :class:`AnswerCostWrapper`, which times the step that ends the episode."""


class _Registered(Protocol):
    @classmethod
    def from_config(cls, cfg: EnvConfig) -> Any: ...
    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> TaskSource: ...


def _builtin(cls: type[_Registered], config: str | None = None, *, grades_itself: bool = True) -> Adapter:
    return Adapter(cls, config, cls.from_config, cls.make_task_source, grades_itself)


ADAPTERS: dict[str, Adapter] = {
    "calculator": _builtin(CalculatorEnv),
    "kb_lookup": _builtin(KBLookupEnv),
    "python": _builtin(PythonEnv),
    "strings": _builtin(StringsEnv),
    "reasoning_gym": _builtin(ReasoningGymEnv, "reasoning_gym"),
    "dataset": _builtin(DatasetEnv, "dataset"),
    "class": _builtin(ClassEnv, "class_env", grades_itself=False),
    "gem": _builtin(GemEnv, "gem"),
    "openenv": _builtin(OpenEnvEnv, "openenv"),
    "verifiers": _builtin(VerifiersEnv, "verifiers"),
}
"""Every built-in ``env.kind`` but the intrinsic ``plugin``, ``agent`` and ``mix`` (see :func:`adapter`)."""


def load_plugin(path: str) -> type[Any]:
    """Import ``package.module:ClassName`` (:func:`import_object`) and check it looks like an
    environment class; :class:`EnvPluginError` otherwise."""
    obj = import_object(path)
    if not inspect.isclass(obj):
        raise EnvPluginError(f"{path} is a {type(obj).__name__}, not an environment class")
    missing_methods = [m for m in ("reset", "step") if not callable(getattr(obj, m, None))]
    if missing_methods:
        raise EnvPluginError(
            f"{path} is not an environment: it has no {' or '.join(missing_methods)} method "
            "(needs reset(task) -> str, step(model_text) -> StepResult and a tools list)"
        )
    return obj


def plugin_adapter(path: str, where: str) -> Adapter:
    """The plugin class at ``path`` read as an :class:`Adapter` by the conventions of the module docstring
    (``where`` names it in messages); not ``grades_itself``: :class:`AnswerCostWrapper` times its final step
    unless it calls ``VERIFIER_CACHE`` itself."""
    cls = load_plugin(path)

    def build(cfg: EnvConfig) -> Any:
        from_config = getattr(cls, "from_config", None)
        env = from_config(cfg) if callable(from_config) else cls(**cfg.options)
        if not isinstance(getattr(env, "tools", None), (list, tuple)):
            raise EnvPluginError(f"{where}: the environment needs a 'tools' list attribute (it may be empty)")
        return env

    def tasks(cfg: EnvConfig) -> TaskSource:
        factory = getattr(cls, "make_task_source", None)
        if not callable(factory):
            raise EnvPluginError(
                f"{where} provides no task source: define a classmethod make_task_source(cls, cfg) -> TaskSource"
            )
        source = factory(cfg)
        missing = [m for m in ("sample", "heldout") if not callable(getattr(source, m, None))]
        if missing:
            raise EnvPluginError(
                f"{where}.make_task_source returned {type(source).__name__}, which has no {' or '.join(missing)} method"
            )
        return source  # type: ignore[no-any-return]

    return Adapter(cls, None, build, tasks, grades_itself=False)


def adapter(cfg: EnvConfig) -> Adapter:
    """The :class:`Adapter` of ``cfg``: a built-in by ``kind``, the plugin at ``path`` (``kind: plugin``), or
    for ``kind: agent`` the one named by ``agent_tasks`` (its tasks and demonstrations). Not for ``mix``."""
    if cfg.kind == "agent":
        tasks = cfg.agent_tasks
        return plugin_adapter(tasks, "agent") if ":" in tasks else ADAPTERS[tasks]
    if cfg.kind == "plugin":
        if not cfg.path:
            raise EnvPluginError("env.kind 'plugin' needs env.path, e.g. 'my_pkg.my_env:MyEnv'")
        return plugin_adapter(cfg.path, cfg.path)
    return ADAPTERS[cfg.kind]


def env_class(cfg: EnvConfig) -> type[Any]:
    """The environment class of ``cfg`` (:attr:`Adapter.env`; ``kind: mix``: :class:`MixEnv`)."""
    return MixEnv if cfg.kind == "mix" else adapter(cfg).env


def _where(cfg: EnvConfig) -> str:
    return cfg.path if cfg.kind == "plugin" and cfg.path else cfg.kind


def make_raw_env(cfg: EnvConfig) -> Any:
    """The environment without wrappers (for checks and tests); every user mistake an :class:`EnvPluginError`."""
    if cfg.kind == "mix":
        return MixEnv(cfg, lambda member, _seed: make_raw_env(member))
    build, where = adapter(cfg).build, _where(cfg)
    try:
        return build(cfg)
    except UserError as exc:  # EnvOptionsError, EnvPluginError, a scorer refused ...: already in words
        raise EnvPluginError(str(exc)) from None
    except TypeError as exc:
        raise EnvPluginError(f"could not construct {where} with env.options {cfg.options!r}: {exc}") from exc
    except Exception as exc:
        raise EnvPluginError(f"constructing {where} raised {type(exc).__name__}: {exc}") from exc


def make_env(cfg: EnvConfig, rng_seed: int) -> GuardedEnv | MixEnv:
    """Build the environment for ``cfg`` wrapped as Guard(Fault(Latency(env))).

    ``rng_seed`` seeds the latency and fault draws (give each worker/episode slot its own);
    the task content itself is seeded by ``cfg.seed`` through the task source. Latency and
    fault wrappers are only added when configured. ``kind: mix``: a :class:`MixEnv`, whose members
    are each built here with their own config.
    """
    if cfg.kind == "mix":
        return MixEnv(cfg, make_env, rng_seed)
    env = make_raw_env(cfg)
    if not adapter(cfg).grades_itself:
        env = AnswerCostWrapper(env)
    rng = random.Random(rng_seed)
    if cfg.latency.kind != "none":
        env = LatencyWrapper(env, cfg.latency, random.Random(rng.getrandbits(64)))
    f = cfg.faults
    if f.exception_rate or f.hang_rate or f.malformed_rate:
        env = FaultWrapper(env, f, random.Random(rng.getrandbits(64)))
    return GuardedEnv(env, cfg.guard)


def make_task_source(cfg: EnvConfig) -> TaskSource:
    """The task source for ``cfg``, by its :attr:`Adapter.tasks` (``kind: mix``: every member's, as one)."""
    if cfg.kind == "mix":
        return MixTaskSource.of(cfg, make_task_source)
    tasks, where = adapter(cfg).tasks, _where(cfg)
    try:
        return tasks(cfg)
    except UserError as exc:  # EnvOptionsError, EnvPluginError, a scorer refused ...: already in words
        raise EnvPluginError(str(exc)) from None
    except ValueError as exc:
        raise EnvPluginError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise EnvPluginError(f"{where}.make_task_source raised {type(exc).__name__}: {exc}") from exc


def check_heldout(source: TaskSource, cfg: EnvConfig) -> list[Task]:
    """The held-out split, or an :class:`EnvPluginError` (one line, exit 2) when the task source cannot
    give ``env.heldout_size`` distinct tasks — said before any work, not after the warm start."""
    if isinstance(source, MixTaskSource):  # every member's own split, at its own size
        for name, _, member in mix_members(cfg):
            try:
                check_heldout(source.members[name], member)
            except EnvPluginError as exc:
                raise EnvPluginError(f"env.mix member {name!r}: {exc}") from None
        return source.heldout()
    where = cfg.agent_tasks if cfg.kind == "agent" else _where(cfg)
    try:
        tasks = source.heldout()
    except ValueError as exc:
        raise EnvPluginError(f"env.heldout_size: {exc}") from None
    if len(tasks) < cfg.heldout_size:
        raise EnvPluginError(
            f"env.heldout_size is {cfg.heldout_size} but the held-out split of {where} has {len(tasks)} tasks: "
            "lower env.heldout_size or widen the task source"
        )
    return tasks


def env_where(cfg: EnvConfig) -> str:
    """How a message names the environment of ``cfg``: its section (``env.dataset``), or its plugin path."""
    if cfg.kind == "plugin":
        return f"env.path {cfg.path!r}"
    if cfg.kind == "agent":
        return f"env.agent_tasks {cfg.agent_tasks!r}"
    section = ADAPTERS[cfg.kind].config if cfg.kind in ADAPTERS else None
    return f"env.{section or cfg.kind}"


def tool_notes(cfg: EnvConfig, source: Any, env: Any) -> list[str]:
    """:func:`tool_note` on training tasks of ``source`` played by the raw ``env`` of ``cfg`` (a mix:
    every member with a share of the warm start, by name); none for an agent, whose tools are its own."""
    rng = random.Random(cfg.seed)
    if cfg.kind == "agent":
        return []
    if cfg.kind != "mix":
        note = tool_note(env, [source.sample(rng) for _ in range(TOOL_NOTE_TASKS)], env_where(cfg))
        return [note] if note else []
    notes = []
    for m in cfg.mix or []:
        if m.sft_share != 0:
            tasks = [source.members[m.name].sample(rng) for _ in range(TOOL_NOTE_TASKS)]
            where = f"env.mix member {m.name!r} ({env_where(m.env)})"
            notes += [note] if (note := tool_note(env.member(m.name), tasks, where)) else []
    return notes
