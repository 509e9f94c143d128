"""Building environments and task sources from config; loading plugin environments.

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
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import TaskSource
from asyncrl.envs.calculator import CalculatorEnv
from asyncrl.envs.class_env import ClassEnv
from asyncrl.envs.dataset_env import DatasetEnv
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
    "BUILTIN_ENVS",
    "EnvPluginError",
    "check_heldout",
    "env_class",
    "import_object",
    "load_plugin",
    "make_env",
    "make_task_source",
]

BUILTIN_ENVS: dict[str, type[Any]] = {
    "calculator": CalculatorEnv,
    "kb_lookup": KBLookupEnv,
    "python": PythonEnv,
    "strings": StringsEnv,
    "reasoning_gym": ReasoningGymEnv,
    "dataset": DatasetEnv,
    "class": ClassEnv,
    "gem": GemEnv,
    "openenv": OpenEnvEnv,
    "verifiers": VerifiersEnv,
}


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


def env_class(cfg: EnvConfig) -> type[Any]:
    """The environment class for ``cfg``: a built-in by ``kind`` or the plugin at ``path``.

    ``kind: agent``: the class named by ``agent_tasks`` (its tasks and demonstrations)."""
    if cfg.kind == "agent":
        tasks = cfg.agent_tasks
        return load_plugin(tasks) if ":" in tasks else BUILTIN_ENVS[tasks]
    if cfg.kind == "plugin":
        if not cfg.path:
            raise EnvPluginError("env.kind 'plugin' needs env.path, e.g. 'my_pkg.my_env:MyEnv'")
        return load_plugin(cfg.path)
    if cfg.kind == "mix":
        return MixEnv
    return BUILTIN_ENVS[cfg.kind]


def _construct(cls: type[Any], cfg: EnvConfig) -> Any:
    where = cfg.path if cfg.kind == "plugin" else cfg.kind
    try:
        from_config = getattr(cls, "from_config", None)
        env = from_config(cfg) if callable(from_config) else cls(**cfg.options)
    except UserError as exc:  # EnvOptionsError, EnvPluginError, a scorer refused ...: already in words
        raise EnvPluginError(str(exc)) from None
    except TypeError as exc:
        raise EnvPluginError(f"could not construct {where} with env.options {cfg.options!r}: {exc}") from exc
    except Exception as exc:
        raise EnvPluginError(f"constructing {where} raised {type(exc).__name__}: {exc}") from exc
    tools = getattr(env, "tools", None)
    if not isinstance(tools, (list, tuple)):
        raise EnvPluginError(f"{where}: the environment needs a 'tools' list attribute (it may be empty)")
    return env


def make_raw_env(cfg: EnvConfig) -> Any:
    """The environment without wrappers (for checks and tests)."""
    if cfg.kind == "mix":
        return MixEnv(cfg, lambda member, _seed: make_raw_env(member))
    return _construct(env_class(cfg), cfg)


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
    if cfg.kind in ("plugin", "class"):  # the built-ins grade through the verifier cache themselves
        env = AnswerCostWrapper(env)
    rng = random.Random(rng_seed)
    if cfg.latency.kind != "none":
        env = LatencyWrapper(env, cfg.latency, random.Random(rng.getrandbits(64)))
    f = cfg.faults
    if f.exception_rate or f.hang_rate or f.malformed_rate:
        env = FaultWrapper(env, f, random.Random(rng.getrandbits(64)))
    return GuardedEnv(env, cfg.guard)


def make_task_source(cfg: EnvConfig) -> TaskSource:
    """The task source for ``cfg``, via the class's ``make_task_source(cfg)`` classmethod (``kind: mix``:
    every member's, as one)."""
    if cfg.kind == "mix":
        return MixTaskSource.of(cfg, make_task_source)  # type: ignore[return-value]
    cls = env_class(cfg)
    where = cfg.path if cfg.kind == "plugin" else cfg.kind
    factory = getattr(cls, "make_task_source", None)
    if not callable(factory):
        raise EnvPluginError(
            f"{where} provides no task source: define a classmethod make_task_source(cls, cfg) -> TaskSource"
        )
    try:
        source = factory(cfg)
    except UserError as exc:  # EnvOptionsError, EnvPluginError, a scorer refused ...: already in words
        raise EnvPluginError(str(exc)) from None
    except ValueError as exc:
        raise EnvPluginError(f"{where}: {exc}") from exc
    except Exception as exc:
        raise EnvPluginError(f"{where}.make_task_source raised {type(exc).__name__}: {exc}") from exc
    missing = [m for m in ("sample", "heldout") if not callable(getattr(source, m, None))]
    if missing:
        raise EnvPluginError(
            f"{where}.make_task_source returned {type(source).__name__}, which has no {' or '.join(missing)} method"
        )
    return source  # type: ignore[no-any-return]


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
    where = cfg.agent_tasks if cfg.kind == "agent" else cfg.path if cfg.kind == "plugin" else cfg.kind
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
