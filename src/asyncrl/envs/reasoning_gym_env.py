"""``reasoning_gym``: any reasoning-gym dataset (or several, weighted) as one answer environment.

A task is a RECIPE, never the generated entry: ``payload = {dataset, config, level, curriculum,
seed, index}``. The entry is regenerated from it wherever it is needed by the dataset object of
that process (one per dataset, config, difficulty and seed, :func:`dataset`), so nothing a JSON
round trip would change is shipped on the queue. Difficulty ``d`` is level ``d`` of every
attribute of the dataset's curriculum (capped at the attribute's last level); the held-out split
is a hash of dataset name and question; scoring is the dataset's own ``score_answer`` under the
hygiene rules of :mod:`asyncrl.envs.scoring`. Details: docs/environments.md#reasoning_gym.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from typing import TYPE_CHECKING, Any

import msgspec

from asyncrl.envs.answer_env import AnswerEnv
from asyncrl.envs.base import HashSplitTaskSource, task_id
from asyncrl.envs.scoring import refuse_lenient_scorer, safe_score
from asyncrl.envs.tasks import cached_source
from asyncrl.envs.toolenv import env_section
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig, ReasoningGymConfig

__all__ = ["ReasoningGymEnv", "ReasoningGymTasks", "dataset", "entry"]


def _rg() -> Any:
    try:
        import reasoning_gym  # noqa: F401
        from reasoning_gym import factory
    except ImportError:
        raise UserError(
            "env.kind 'reasoning_gym' needs reasoning-gym: pip install 'asyncrl[reasoning-gym]'"
        ) from None
    return factory


@functools.lru_cache(maxsize=256)
def dataset(name: str, user_json: str, level: int, curriculum: bool, seed: int) -> Any:
    """The process's one dataset object for (name, the user's config, level, seed); a
    :class:`UserError` for an unknown name or a config the dataset refuses."""
    factory = _rg()
    if name not in factory.DATASETS:
        raise UserError(
            f"env.reasoning_gym: no dataset {name!r}; known: {', '.join(sorted(factory.DATASETS))}"
        )
    user = json.loads(user_json)
    if "seed" in user:
        raise UserError(f"env.reasoning_gym: dataset {name!r}: set env.seed, not config.seed")
    config = {**(_curriculum_config(name, level) if curriculum else {}), **user, "seed": seed}
    try:
        return factory.create_dataset(name, **config)
    except (TypeError, ValueError, AssertionError) as exc:
        shown = {k: v for k, v in config.items() if k in user or k == "seed"}
        raise UserError(
            f"env.reasoning_gym: dataset {name!r} (difficulty {level}) refuses its config (yours: {shown}): {exc}"
        ) from None


def levels(name: str, curriculum: bool) -> int:
    """How many difficulties the dataset has: the most levels of any curriculum attribute (1 without one)."""
    factory = _rg()
    if not curriculum or name not in factory.CURRICULA:
        return 1
    return max((len(a.levels) for a in factory.CURRICULA[name]().attributes.values()), default=1)


def _curriculum_config(name: str, level: int) -> dict[str, Any]:
    """The config fields the curriculum sets at ``level`` (each attribute capped at its last level)."""
    from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

    factory = _rg()
    if name not in factory.CURRICULA:
        return {}
    curriculum = factory.CURRICULA[name]()
    for attr in curriculum.attributes.values():
        curriculum.set_attr_level(attr.name, min(level, len(attr.levels) - 1))
    made = curriculum.generate_configuration(
        context=DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
    )
    return {f.name: getattr(made, f.name) for f in dataclasses.fields(made) if f.name != "seed"}


def entry(task: Task) -> dict[str, Any]:
    """The generated entry of a task, regenerated from its recipe."""
    return _entry(*_recipe(task))


def _recipe(task: Task) -> tuple[str, str, int, bool, int, int]:
    p = task.payload
    user = json.dumps(p["config"], sort_keys=True)
    return str(p["dataset"]), user, int(p["level"]), bool(p["curriculum"]), int(p["seed"]), int(p["index"])


@functools.lru_cache(maxsize=4096)
def _entry(name: str, user_json: str, level: int, curriculum: bool, seed: int, index: int) -> dict[str, Any]:
    return dataset(name, user_json, level, curriculum, seed)[index]  # type: ignore[no-any-return]


def _gold(task: Task) -> str:
    """The reference answer of the task's entry."""
    return str(entry(task)["answer"])


class ReasoningGymTasks(HashSplitTaskSource):
    """Tasks of the configured datasets; ``task_type`` is the dataset name, the split is by content."""

    salt = "reasoning_gym"
    widen_hint = (
        "raise the datasets' size (config: {size: N}; reasoning-gym's default is 500 entries, of which "
        "~10 % are held out) or widen the difficulty range"
    )

    def __init__(self, rc: ReasoningGymConfig, *, seed: int, heldout_size: int, lo: int, hi: int) -> None:
        self.specs = list(rc.datasets)
        self.curriculum = rc.curriculum
        self.users = [json.dumps(s.config, sort_keys=True) for s in self.specs]
        self.levels = [levels(s.name, rc.curriculum) for s in self.specs]
        self.task_types = tuple(dict.fromkeys(s.name for s in self.specs))
        self.difficulties = tuple(range(max(self.levels)))
        super().__init__(seed=seed, heldout_size=heldout_size, min_difficulty=lo, max_difficulty=hi)
        for i, n in enumerate(self.levels):
            for d in range(n):
                if d in self.active_difficulties:
                    self._vet(i, d, rc.hygiene_tasks)

    def _data(self, i: int, level: int) -> Any:
        return dataset(self.specs[i].name, self.users[i], level, self.curriculum, self.seed)

    def _vet(self, i: int, level: int, n: int) -> None:
        """The hygiene check of :mod:`asyncrl.envs.scoring` on ``n`` entries of one dataset level."""
        name, data = self.specs[i].name, self._data(i, level)
        tasks = [self._task(i, level, k) for k in range(n)]
        if any(entry(t)["answer"] is None for t in tasks):
            raise UserError(
                f"env.reasoning_gym: dataset {name!r} has no reference answer for its entries: asyncrl "
                "cannot warm-start on it or check its scorer; pick another dataset"
            )
        refuse_lenient_scorer(
            f"env.reasoning_gym: dataset {name!r} (difficulty {level})",
            lambda answer, k: data.score_answer(answer, entry(tasks[k])),
            [_gold(t) for t in tasks],
        )

    def _task(self, i: int, level: int, index: int) -> Task:
        spec = self.specs[i]
        payload = {
            "dataset": spec.name,
            "config": dict(spec.config),
            "level": level,
            "curriculum": self.curriculum,
            "seed": self.seed,
            "index": index,
        }
        task = Task(id="", task_type=spec.name, difficulty=level, payload=payload)
        return msgspec.structs.replace(task, id=task_id("rg", self.content_key(task)))

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        able = [i for i, n in enumerate(self.levels) if n > difficulty]
        i = rng.choices(able, weights=[self.specs[k].weight for k in able])[0]
        return self._task(i, difficulty, rng.randrange(len(self._data(i, difficulty))))

    def content_key(self, task: Task) -> str:
        return f"{task.payload['dataset']}|{entry(task)['question']}"


class ReasoningGymEnv(AnswerEnv):
    """Answer reasoning-gym questions; the score is the dataset's own ``score_answer``."""

    kind = "reasoning_gym"

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> ReasoningGymTasks:
        return cached_source(ReasoningGymTasks, env_section(cfg, cfg.reasoning_gym), cfg)

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> ReasoningGymEnv:
        rc = env_section(cfg, cfg.reasoning_gym)
        return cls(rc.tools, rc.reward, cfg.sandbox, rc.demonstrator)

    gold = staticmethod(_gold)

    def example(self, task: Task) -> dict[str, Any]:
        return dict(entry(task))

    def prompt(self, task: Task) -> str:
        return str(entry(task)["question"])

    def score(self, answer: str) -> float:
        assert self.task is not None
        e = entry(self.task)
        data = dataset(*_recipe(self.task)[:5])
        return safe_score(lambda: data.score_answer(answer, e))
