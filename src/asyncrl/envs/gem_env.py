"""``gem``: a GEM game or a TextArena single-player game through its gym interface, in process.

A task is a seed: ``payload = {game, seed}``; the episode is ``reset(seed=seed)`` of the game, and
every model turn is handed to the game's ``step`` unchanged (the game parses its own action format,
``\\boxed{N}`` for GEM, ``[N]`` for TextArena, as its prompt says). The held-out split is a hash
split of the seeds (:class:`~asyncrl.envs.tasks.SeedTasks`): a held-out seed is never drawn for training.

TextArena observations accumulate the whole game history; the model gets only what is new since
its last turn (from the game's first ``[GAME]`` line, so the echo of its own move is dropped). GEM
games already return the latest feedback only.

Model code runs only in asyncrl's sandbox: ``tools: [python]`` gives ``<tool>python(CODE)</tool>``
through :func:`asyncrl.envs.sandbox.run_python`; GEM's ``code:*`` environments, which run model
code in a plain subprocess, are refused when the environment is built.

Installed without dependencies (GEM pins ``msgspec==0.19.0``; asyncrl pins 0.22.0): see
docs/environments.md#gem.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from asyncrl.envs.base import (
    EpisodeRewards,
    StepResult,
    ToolCallAction,
    parse_action,
    repeat_final,
)
from asyncrl.envs.tasks import SeedTasks
from asyncrl.envs.toolenv import PYTHON_TOOL, EnvOptionsError, env_section, run_sandboxed
from asyncrl.errors import UserError
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.config import EnvConfig, SandboxConfig
    from asyncrl.config.ecosystem import GemConfig
    from asyncrl.envs.base import Tool

__all__ = ["GemEnv", "latest_feedback"]

TEXTARENA = "textarena:"
UNSANDBOXED = ("code:",)
"""GEM id prefixes whose environments run model code without isolation."""
INSTALL = "pip install --no-deps 'gem-llm==0.1.0' 'textarena==0.7.4' (docs/environments.md#gem)"


def latest_feedback(before: str, now: str) -> str:
    """What ``now`` (an accumulated TextArena observation) adds to ``before``, from its first
    ``[GAME]`` line (the echo of the player's own move dropped); all of ``now`` when it does not
    extend ``before``."""
    if not now.startswith(before):
        return now.strip()
    new = now[len(before) :]
    at = new.find("[GAME]")
    return (new[at:] if at >= 0 else new).strip()


def _make_game(game: str, kwargs: dict[str, Any]) -> Any:
    """The game object, or a :class:`UserError` in words (missing package, unknown id, refused id)."""
    if game.startswith(UNSANDBOXED):
        raise UserError(
            f"env.gem.game {game!r}: GEM's code environments run model code in a plain subprocess "
            "without isolation; asyncrl refuses them. Use env.kind: python, or env.gem.tools: [python] "
            "(asyncrl's sandbox)"
        )
    try:
        if game.startswith(TEXTARENA):
            import textarena

            return textarena.make(game.removeprefix(TEXTARENA), **kwargs)
        import gem

        return gem.make(game, **kwargs)
    except ImportError as exc:
        raise UserError(f"env.kind 'gem' ({game}) needs {exc.name or 'its package'}: {INSTALL}") from None
    except (KeyError, ValueError, TypeError) as exc:
        raise UserError(f"env.gem.game {game!r} could not be made: {type(exc).__name__}: {exc}") from None


class GemEnv:
    """One GEM or TextArena game per instance, one episode at a time."""

    kind = "gem"

    def __init__(self, gc: GemConfig, sandbox: SandboxConfig) -> None:
        unknown = sorted(set(gc.tools) - {"python"})
        if unknown:
            raise EnvOptionsError(f"env.gem.tools: unknown {unknown}; allowed: ['python']")
        self.gc, self.sandbox = gc, sandbox
        self.textarena = gc.game.startswith(TEXTARENA)
        self.game = _make_game(gc.game, gc.kwargs)
        self.tools: list[Tool] = [PYTHON_TOOL] if gc.tools else []
        self.rewards = EpisodeRewards()
        self._seen = ""
        self._final: StepResult | None = None

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> GemEnv:
        return cls(env_section(cfg, cfg.gem), cfg.sandbox)

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> SeedTasks:
        gc = env_section(cfg, cfg.gem)
        return SeedTasks(gc.game, gc.seeds, seed=cfg.seed, heldout_size=cfg.heldout_size, prefix="gem")

    async def reset(self, task: Task) -> str:
        self.rewards = EpisodeRewards()
        self._final = None
        seed = int(task.payload["seed"])
        if self.textarena:
            self.game.reset(num_players=1, seed=seed)
            _, obs = self.game.get_observation()
            self._seen = str(obs)
            return self._seen.strip()
        obs, _info = self.game.reset(seed=seed)
        return str(obs)

    async def step(self, model_text: str) -> StepResult:
        if self._final is not None:
            return repeat_final(self._final)
        if self.tools:
            action = parse_action(model_text)
            if isinstance(action, ToolCallAction) and action.name == "python":
                return await self._python(action.args)
        observation, reward, done = (
            self._textarena_step(model_text) if self.textarena else self._gem_step(model_text)
        )
        if not done:
            return StepResult(observation=observation, process_reward=max(-1.0, min(1.0, reward)))
        success = reward >= self.gc.success_reward
        self._final = StepResult(
            observation=observation,
            done=True,
            reward=reward,
            outcome="success" if success else "failure",
            info={"action": "game", "game_reward": reward},
        )
        return self._final

    def _gem_step(self, text: str) -> tuple[str, float, bool]:
        obs, reward, terminated, truncated, _info = self.game.step(text)
        return str(obs), float(reward), bool(terminated or truncated)

    def _textarena_step(self, text: str) -> tuple[str, float, bool]:
        done, _info = self.game.step(text)
        _, obs = self.game.get_observation()
        feedback = latest_feedback(self._seen, str(obs))
        self._seen = str(obs)
        if not done:
            return feedback, 0.0, False
        rewards, game_info = self.game.close()
        reward = float((rewards or {}).get(0, 0.0))
        reason = str(((game_info or {}).get(0) or {}).get("reason", "")) or feedback or "game over"
        return reason, reward, True

    async def _python(self, code: str) -> StepResult:
        started = time.monotonic()
        ok, text = await run_sandboxed(code, self.sandbox)
        return self.rewards.tool_step("python", code, ok, text, started, lambda a, b: False)

    async def close(self) -> None:
        """Nothing held between episodes."""
