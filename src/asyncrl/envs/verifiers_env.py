"""``verifiers``: a verifiers v0 ``SingleTurnEnv`` (verifiers==0.3.1's ``verifiers.legacy``) in process.

``env.verifiers.path`` names ``package.module:load_environment`` (or a module with a
``load_environment``), called once per process with ``kwargs``. A task is a row of its dataset
(``payload = {split, row}``), regenerated from the environment in the worker. The prompt is the row's
chat prompt (system message, then the user's); the model's one turn is the completion, scored by the
environment's own rubric (``rubric.score_rollout``), no model client involved. Held-out: the
environment's ``eval_dataset`` when it has one (training rows with the same prompt dropped), else a
hash split of the prompts.

verifiers v1 environments run their own harness (installed with ``uv`` per episode) and need
``openai<3``: they run through the gateway instead (``env.kind: agent``, docs/environments.md#verifiers).
"""

from __future__ import annotations

import functools
import json
import random
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import StepResult, in_heldout_bucket, task_id
from asyncrl.envs.imports import import_object
from asyncrl.envs.toolenv import env_section
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig
    from asyncrl.config.ecosystem import VerifiersConfig

__all__ = ["VerifiersEnv", "VerifiersTasks", "load_vf_env"]

INSTALL = "pip install --no-deps 'verifiers==0.3.1' (docs/environments.md#verifiers)"
V1_HINT = (
    "run verifiers v1 environments as an agent through the gateway: env.kind: agent "
    "(docs/environments.md#verifiers)"
)


@functools.lru_cache(maxsize=8)
def load_vf_env(path: str, kwargs_json: str) -> Any:
    """The process's one environment for (path, kwargs): a v0 ``SingleTurnEnv``, else a :class:`UserError`."""
    try:
        from verifiers.legacy.envs.singleturn_env import SingleTurnEnv
    except ImportError as exc:
        raise UserError(f"env.kind 'verifiers' needs {exc.name or 'verifiers'}: {INSTALL}") from None
    loader = import_object(path if ":" in path else f"{path}:load_environment", what="load_environment")
    try:
        env = loader(**json.loads(kwargs_json))
    except Exception as exc:
        raise UserError(
            f"env.verifiers.path {path}: load_environment raised {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(env, SingleTurnEnv):
        raise UserError(
            f"env.verifiers.path {path}: returned a {type(env).__name__}; in process asyncrl runs verifiers v0 "
            f"SingleTurnEnv environments only; {V1_HINT}"
        )
    return env


def _prompt(row: dict[str, Any]) -> str:
    messages = row.get("prompt") or [{"role": "user", "content": str(row.get("question", ""))}]
    return "\n\n".join(str(m.get("content", "")) for m in messages if m.get("role") in ("system", "user"))


class VerifiersTasks:
    """Rows of the environment's datasets; the held-out split is disjoint from training by prompt."""

    difficulties = (0,)

    def __init__(self, vc: VerifiersConfig, heldout_size: int) -> None:
        env = load_vf_env(vc.path, json.dumps(vc.kwargs, sort_keys=True))
        self.task_types = (vc.path,)
        train = [("train", i, _prompt(r)) for i, r in enumerate(env.get_dataset())]
        if env.eval_dataset is not None:
            held = [("eval", i, _prompt(r)) for i, r in enumerate(env.get_eval_dataset())]
        else:
            held = [t for t in train if in_heldout_bucket("verifiers", t[2], 100)]
        keys = {t[2] for t in held}
        self.train = [t for t in train if t[2] not in keys]
        self._held = [self._task(vc.path, t) for t in held[:heldout_size]]
        if not self.train:
            raise UserError(f"env.verifiers.path {vc.path}: no training rows outside the held-out split")

    @staticmethod
    def _task(path: str, row: tuple[str, int, str]) -> Task:
        return Task(
            id=task_id("vf", f"{path}|{row[2]}"),
            task_type=path,
            difficulty=0,
            payload={"split": row[0], "row": row[1]},
        )

    def sample(self, rng: random.Random, difficulty: int | None = None) -> Task:
        return self._task(self.task_types[0], rng.choice(self.train))

    def heldout(self) -> list[Task]:
        return list(self._held)


class VerifiersEnv:
    """One model turn per episode, scored by the verifiers environment's rubric."""

    kind = "verifiers"

    def __init__(self, vc: VerifiersConfig) -> None:
        self.vc = vc
        self.env = load_vf_env(vc.path, json.dumps(vc.kwargs, sort_keys=True))
        self.tools: list[Any] = []
        self.row: dict[str, Any] = {}

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> VerifiersEnv:
        return cls(env_section(cfg, cfg.verifiers))

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> VerifiersTasks:
        return VerifiersTasks(env_section(cfg, cfg.verifiers), cfg.heldout_size)

    async def reset(self, task: Task) -> str:
        data = self.env.get_eval_dataset() if task.payload["split"] == "eval" else self.env.get_dataset()
        self.row = dict(data[int(task.payload["row"])])
        return _prompt(self.row)

    async def step(self, model_text: str) -> StepResult:
        from verifiers.legacy.types import State

        state = State.for_task(self.row)
        state["completion"] = [{"role": "assistant", "content": model_text}]
        await self.env.rubric.score_rollout(state)
        score = float(state["reward"] or 0.0)
        success = score >= self.vc.success_reward
        return StepResult(
            observation="correct" if success else "incorrect",
            done=True,
            reward=score,
            outcome="success" if success else "failure",
            info={"action": "answer", "metrics": dict(state.get("metrics") or {})},
        )
