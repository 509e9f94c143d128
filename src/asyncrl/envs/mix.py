"""``env.kind: mix``: several environments in one run (docs/environments.md#mix).

Each member of ``env.mix`` is a full environment config with a name and a weight. The
:class:`MixTaskSource` draws a member by weight (from the caller's ``rng``: deterministic from the
seed), then a task from that member's own task source, and tags it with the member's name
(``Task.env``; the id gets the name as a prefix, so ids stay unique across members). Its held-out
split is every member's own held-out split, interleaved member by member (so a limit on the number
of evaluation tasks still covers every member). Curriculum buckets carry the member's name
(``name/type:difficulty``, :mod:`asyncrl.control.buckets`), so the curriculum, the breakers
and the reports see each environment apart; ``bucket_prior`` there spreads a member's weight over its
buckets, so the curriculum's weights scale the members' shares instead of replacing them. The warm
start draws its demonstrations by the members' ``sft_share`` instead (:meth:`MixTaskSource.for_warm_start`).

:class:`MixEnv` routes an episode to its member by ``task.env``: the member environment is built by
:func:`asyncrl.envs.make_env` with the member's own config (its latency, faults and guard), so a
broken member's faults are its own. A member's ``system_prompt`` leads the prompt of its episodes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from asyncrl.envs.base import StepResult, Tool, call_env, close_env
from asyncrl.envs.imports import EnvPluginError
from asyncrl.errors import UserError

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig
    from asyncrl.envs.base import AnyEnvironment, TaskSource
    from asyncrl.records import Task

__all__ = ["MixEnv", "MixTaskSource", "mix_members"]


def mix_members(cfg: EnvConfig) -> list[tuple[str, float, EnvConfig]]:
    """(name, weight, env config) of every member of a ``kind: mix`` config."""
    return [(m.name, m.weight, m.env) for m in cfg.mix or []]


class MixTaskSource:
    """The members' task sources as one (module docstring)."""

    def __init__(
        self, members: list[tuple[str, float, TaskSource]], sft_shares: dict[str, float] | None = None
    ) -> None:
        """``sft_shares``: each member's share of the warm start's demonstrations (default: its weight)."""
        if not members:
            raise ValueError("env.mix has no members")
        self.members = {name: src for name, _, src in members}
        self.weights = {name: float(w) for name, w, _ in members}
        self.sft_shares = {name: (sft_shares or {}).get(name, w) for name, w in self.weights.items()}
        self.task_types = tuple(f"{name}/{t}" for name, _, src in members for t in src.task_types)
        self.difficulties = tuple(sorted({d for _, _, src in members for d in src.difficulties}))

    @classmethod
    def of(cls, cfg: EnvConfig, make_source: Callable[[EnvConfig], TaskSource]) -> MixTaskSource:
        """Every member's task source, built by ``make_source`` from its own config (errors name the member)."""
        members = []
        for name, weight, member in mix_members(cfg):
            try:
                members.append((name, weight, make_source(member)))
            except EnvPluginError as exc:
                raise EnvPluginError(f"env.mix member {name!r}: {exc}") from None
        return cls(members, {m.name: m.sft_share for m in cfg.mix or [] if m.sft_share is not None})

    def for_warm_start(self) -> MixTaskSource:
        """The members drawn by their ``sft_share`` (those of share 0 left out): the warm start's
        demonstrations; a :class:`UserError` when every share is 0."""
        members = [(n, w, self.members[n]) for n, w in self.sft_shares.items() if w > 0]
        if not members:
            raise UserError(
                "every env.mix member has sft_share 0: the warm start has no demonstrations to draw; "
                "give one a share or set trainer.sft.steps: 0"
            )
        return MixTaskSource(members)

    @staticmethod
    def tag(name: str, task: Task) -> Task:
        return msgspec.structs.replace(task, env=name, id=f"{name}/{task.id}")

    def pick(self, rng: random.Random, names: list[str] | None = None) -> str:
        """A member by weight (among ``names``, default all)."""
        names = names or list(self.members)
        return rng.choices(names, weights=[self.weights[n] for n in names])[0]

    def sample(self, rng: random.Random, difficulty: int | None = None) -> Task:
        """A training task of a member drawn by weight (among those with ``difficulty``, if any has it)."""
        having = [n for n, s in self.members.items() if difficulty in s.difficulties]
        name = self.pick(rng, having)
        difficulty = difficulty if having else None
        return self.tag(name, self.members[name].sample(rng, difficulty=difficulty))

    def heldout(self) -> list[Task]:
        """Every member's held-out split, tagged and interleaved member by member."""
        splits = [[self.tag(n, t) for t in s.heldout()] for n, s in self.members.items()]
        out: list[Task] = []
        for i in range(max(len(s) for s in splits)):
            out += [s[i] for s in splits if i < len(s)]
        return out


class MixEnv:
    """Routes each episode to its member environment by ``task.env`` (module docstring).

    ``build(member_cfg, seed)`` makes a member environment (:func:`~asyncrl.envs.make_env`: its own
    wrappers; :func:`~asyncrl.envs.registry.make_raw_env` for checks); ``rng_seed`` seeds the members'
    seeds."""

    def __init__(
        self, cfg: EnvConfig, build: Callable[[EnvConfig, int], AnyEnvironment], rng_seed: int = 0
    ) -> None:
        self.cfg, self.build = cfg, build
        self.configs = {name: member for name, _, member in mix_members(cfg)}
        self.system_prompts = {m.name: m.system_prompt for m in cfg.mix or [] if m.system_prompt}
        self.rng = random.Random(rng_seed)
        self._envs: dict[str, AnyEnvironment] = {}
        self._current: AnyEnvironment | None = None

    def member(self, name: str) -> AnyEnvironment:
        """The member environment ``name`` (built once per :class:`MixEnv`)."""
        if name not in self.configs:
            known = ", ".join(self.configs)
            raise UserError(f"task of environment {name!r}, which is not a member of env.mix ({known})")
        if name not in self._envs:
            try:
                self._envs[name] = self.build(self.configs[name], self.rng.randrange(2**31))
            except EnvPluginError as exc:
                raise EnvPluginError(f"env.mix member {name!r}: {exc}") from None
        return self._envs[name]

    @property
    def tools(self) -> list[Tool]:
        """The tools of the member running the current episode (none before ``reset``)."""
        return list(self._current.tools) if self._current is not None else []

    async def reset(self, task: Task) -> str:
        self._current = self.member(task.env)
        prompt: str = await call_env(self._current.reset, task)
        system = self.system_prompts.get(task.env)
        return f"{system}\n\n{prompt}" if system and isinstance(prompt, str) else prompt

    async def step(self, model_text: str) -> StepResult:
        if self._current is None:
            raise RuntimeError("MixEnv.step before reset")
        result: StepResult = await call_env(self._current.step, model_text)
        return result

    async def close(self) -> None:
        envs, self._envs, self._current = list(self._envs.values()), {}, None
        for env in envs:
            await close_env(env)

    def _helper(self, task: Task, what: str) -> Callable[..., list[str]]:
        fn: Callable[..., list[str]] | None = getattr(self.member(task.env), what, None)
        if fn is None:
            kind = self.configs[task.env].kind
            raise UserError(
                f"env.mix member {task.env!r} ({kind}) has no reference solver ({what}); "
                "cannot warm-start: set trainer.sft.steps: 0 or give it one"
            )
        return fn

    def solve(self, task: Task) -> list[str]:
        """The member's reference solution of ``task``."""
        return self._helper(task, "solve")(task)

    def demonstrate(self, task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        """The member's demonstration of ``task``."""
        return self._helper(task, "demonstrate")(task, rng, corruption_rate)
