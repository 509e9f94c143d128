"""The Ray launcher (``launcher.kind: ray``): each role process is a Ray actor.

Same contract (:class:`~asyncrl.launch.base.Launcher`) as :class:`~asyncrl.launch.local.LocalLauncher`
— ``start / exitcode / pid / stop / names`` — so the orchestrator's supervise loop is unchanged: a
role whose actor died (killed, node lost, out of memory) or whose main returned reports an exit
code, and the orchestrator restarts it by calling :meth:`RayLauncher.start` again, which replaces
the dead actor with a new one (Ray's own ``max_restarts`` stays 0: one supervisor, not two).

Placement
    Every actor runs the role's ordinary entry point (``trainer_main`` / ``worker_main``) with
    the same JSON config and run directory as a local process, in one long call to
    :meth:`_RoleActor.run`. Each asks Ray for ``launcher.trainer_cpus`` / ``trainer_gpus`` or
    ``launcher.rollout_cpus`` / ``rollout_gpus``; an actor that cannot be placed within
    ``launcher.place_timeout_s`` is a :class:`~asyncrl.errors.UserError` naming those fields. The
    orchestrator stays in the driver process (it is the Ray driver: it runs the warm start,
    evaluations and the summary around the actors).

Cluster
    ``launcher.address``: ``auto`` joins the cluster that ``ray start`` runs on this machine,
    ``ray://host:10001`` joins a remote one through Ray Client, unset starts a local cluster for
    this run and shuts it down at the end. A local cluster's GCS takes a free port (never Redis's
    6379) and advertises at least ``_LOCAL_MIN_CPUS`` logical CPUs so every role fits; Ray's CPU
    counts only steer placement, the roles pin their torch threads themselves. Its workers run at
    the launcher's priority (``RAY_worker_niceness=0`` unless set: Ray's default is nice 15); a
    cluster started with ``ray start`` keeps its own setting.

Token authentication
    Ray 2.60 turns token auth on by default for a local ``ray.init()`` and would write a token
    to ``~/.ray/auth_token``. For a local cluster this launcher keeps auth on but, unless
    ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_MODE`` are already set, generates a fresh random token held
    only in this process's environment (inherited by the cluster it starts): nothing is written
    to the home directory and no two runs share a token. To join an existing cluster, give the
    cluster's token in ``RAY_AUTH_TOKEN`` (or ``~/.ray/auth_token``) as Ray documents.

Roles must find the run directory at the same path on every node (shared filesystem) and have
asyncrl installed. Only a JSON string and plain values cross into an actor; Ray itself moves
them with its own serialisation, so the Ray cluster must be trusted (hence token auth).
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.config import RayLauncherConfig
from asyncrl.errors import UserError
from asyncrl.launch.base import Launcher, free_port

log = logging.getLogger(__name__)

_LOCAL_MIN_CPUS = 64
_KILLED = -9
"""Exit code reported for an actor that died (killed, crashed, node lost): like SIGKILL locally."""
_FAILED = 1
"""Exit code reported when the role's main raised."""


class _RoleActor:
    """Hosts one role process; ``run`` is the role's whole life (wrapped by ``ray.remote`` lazily)."""

    def __init__(self, cwd: str) -> None:
        if os.path.isdir(cwd):  # relative run directories resolve as in the driver
            os.chdir(cwd)

    def pid(self) -> int:
        return os.getpid()

    def rendezvous(self, port: int) -> tuple[str, int]:
        """This node's address and a port on it for a trainer group's rank 0 (``port`` 0: a free one)."""
        import ray

        host = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        return host, port or free_port(host)

    def run(self, target: str, args: tuple[object, ...]) -> int:
        module, _, name = target.partition(":")
        fn = getattr(importlib.import_module(module), name)
        fn(*args)
        return 0


@dataclass
class _Role:
    actor: Any
    ref: Any
    pid: int | None
    code: int | None = None


def _target_path(fn: Callable[..., None]) -> str:
    """``module:function`` of a module-level role entry point (imported by name inside the actor)."""
    if "<" in fn.__qualname__ or "." in fn.__qualname__:
        raise ValueError(f"role targets must be module-level functions, got {fn.__qualname__}")
    return f"{fn.__module__}:{fn.__qualname__}"


def _prepare_local_auth() -> None:
    """Token auth on, with a fresh in-memory token, for a local cluster (see module docstring)."""
    if "RAY_AUTH_MODE" in os.environ or "RAY_AUTH_TOKEN" in os.environ:
        return  # the operator decided
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def _refresh_ray_auth() -> None:
    """Make an already imported Ray re-read the auth settings (private API; harmless if it moved)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - a Ray without these hooks
        pass


class RayLauncher(Launcher):
    def __init__(self, cfg: RayLauncherConfig) -> None:
        self.cfg = cfg
        self._roles: dict[str, _Role] = {}
        self._group: Any = None  # the trainer group's placement group
        self._owns_cluster = False
        if cfg.address is None:
            _prepare_local_auth()  # before ray is imported: its token loader reads the environment once
        try:
            import ray
        except ImportError:
            raise UserError(
                "launcher.kind 'ray' needs Ray: pip install 'asyncrl[ray]' (ray==2.60.0), "
                "or use launcher.kind=local"
            ) from None
        self._ray = ray
        if ray.is_initialized():  # e.g. a test or notebook that started Ray itself
            self._actor_cls: Any = ray.remote(_RoleActor)
            return
        address = cfg.address
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, configure_logging=False)
        if address is None:
            _refresh_ray_auth()
            # Ray starts its worker processes at nice 15 (`worker_niceness`): beside any other work
            # on the machine the roles would get only the leftovers (measured: ~100 s a SmolLM2 step
            # against ~35 s locally). A cluster this run owns runs them at the launcher's priority.
            os.environ.setdefault("RAY_worker_niceness", "0")
            kwargs["num_cpus"] = max(os.cpu_count() or 1, _LOCAL_MIN_CPUS)
            self._owns_cluster = True
        else:
            kwargs["address"] = address
        try:
            ray.init(**kwargs)
        except Exception as exc:  # ConnectionError, auth errors, bad address: all user-facing
            where = (
                "a local Ray cluster"
                if address is None
                else f"the Ray cluster at launcher.address={address!r}"
            )
            raise UserError(
                f"cannot start or join {where}: {type(exc).__name__}: {exc}. For an existing cluster, "
                "check the address and that RAY_AUTH_TOKEN (or ~/.ray/auth_token) holds its token."
            ) from None
        self._actor_cls = ray.remote(_RoleActor)

    # ---- the Launcher interface -----------------------------------------------------------------
    def start(self, name: str, target: Callable[..., None], *args: object) -> None:
        actor, pid = self._place(name, {})
        self._roles[name] = _Role(
            actor=actor, ref=actor.run.remote(_target_path(target), tuple(args)), pid=pid
        )

    def _place(self, name: str, options: dict[str, object]) -> tuple[Any, int]:
        """A new actor for role ``name`` (replacing a previous one), placed, with its pid."""
        ray = self._ray
        old = self._roles.pop(name, None)
        if old is not None:
            ray.kill(old.actor, no_restart=True)
        trainer = name.partition(".")[0] == "trainer"  # the trainer, or one of its ranks
        cfg = self.cfg
        cpus, gpus = (cfg.trainer_cpus, cfg.trainer_gpus) if trainer else (cfg.rollout_cpus, cfg.rollout_gpus)
        resources = cfg.trainer_resources if trainer else cfg.rollout_resources
        actor: Any = self._actor_cls.options(
            num_cpus=cpus, num_gpus=gpus, resources=resources, max_restarts=0, max_concurrency=2, **options
        ).remote(os.getcwd())
        try:
            return actor, int(ray.get(actor.pid.remote(), timeout=cfg.place_timeout_s))
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor, no_restart=True)
            field = "trainer" if trainer else "rollout"
            raise UserError(
                f"Ray could not place and start role {name!r} within {cfg.place_timeout_s:.0f}s: no node offers "
                f"{cpus} CPUs, {gpus} GPUs and {resources or 'no custom resources'}, or its process did not "
                f"start in time; lower launcher.{field}_cpus / launcher.{field}_gpus / "
                f"launcher.{field}_resources, add nodes, or raise launcher.place_timeout_s on a loaded machine"
            ) from None

    def start_group(
        self, names: list[str], target: Callable[..., None], args: tuple[object, ...], port: int
    ) -> None:
        """The trainer ranks as actors in one placement group (one bundle per rank, strategy
        ``launcher.trainer_placement``); rank 0's node address and port are asked of rank 0's actor."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, cfg = self._ray, self.cfg
        for name in names:  # a group is replaced whole
            old = self._roles.pop(name, None)
            if old is not None:
                ray.kill(old.actor, no_restart=True)
        if self._group is not None:
            remove_placement_group(self._group)
        bundle = {"CPU": cfg.trainer_cpus, "GPU": cfg.trainer_gpus, **cfg.trainer_resources}
        self._group = placement_group(
            [{k: v for k, v in bundle.items() if v} for _ in names], strategy=cfg.trainer_placement
        )
        if not self._group.wait(cfg.place_timeout_s):
            raise UserError(
                f"Ray could not place {len(names)} trainer ranks ({bundle} each, strategy "
                f"{cfg.trainer_placement}) within {cfg.place_timeout_s:.0f}s; lower trainer.world_size or "
                "launcher.trainer_cpus / trainer_gpus / trainer_resources, or add nodes"
            )
        placed = []
        for rank, name in enumerate(names):
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=rank)
            placed.append(self._place(name, {"scheduling_strategy": strategy}))
        host, port = ray.get(placed[0][0].rendezvous.remote(port), timeout=cfg.place_timeout_s)
        for rank, (name, (actor, pid)) in enumerate(zip(names, placed, strict=True)):
            ref = actor.run.remote(_target_path(target), (*args, rank, host, port))
            self._roles[name] = _Role(actor=actor, ref=ref, pid=pid)

    def exitcode(self, name: str) -> int | None:
        role = self._roles[name]
        if role.code is not None:
            return role.code
        ready, _ = self._ray.wait([role.ref], timeout=0)
        if not ready:
            return None
        role.code = self._result(role)
        return role.code

    def _result(self, role: _Role) -> int:
        exc_types = self._ray.exceptions
        try:
            return int(self._ray.get(role.ref))
        except exc_types.RayActorError:  # the actor process died: killed, crashed, node lost
            return _KILLED
        except exc_types.RayTaskError as exc:  # the role's main raised
            log.warning("role actor failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
            return _FAILED

    def pid(self, name: str) -> int | None:
        role = self._roles.get(name)
        return role.pid if role is not None else None

    def stop(self, name: str, timeout: float) -> None:
        role = self._roles.get(name)
        if role is None:
            return
        ready, _ = self._ray.wait([role.ref], timeout=timeout)
        if not ready:
            self._ray.kill(role.actor, no_restart=True)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not self._ray.wait([role.ref], timeout=0.5)[0]:
                pass
        if role.code is None:
            ready, _ = self._ray.wait([role.ref], timeout=0)
            role.code = self._result(role) if ready else _KILLED

    def names(self) -> list[str]:
        return list(self._roles)

    def close(self) -> None:
        """Kill every actor still alive; shut the local cluster down if this launcher started it."""
        for role in self._roles.values():
            if role.code is None:
                self._ray.kill(role.actor, no_restart=True)
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None
        if self._owns_cluster and self._ray.is_initialized():
            self._ray.shutdown()
            self._owns_cluster = False
