"""An OpenEnv ``MCPEnvironment`` written as OpenEnv's docs write one; asyncrl trains it unchanged.

    env:
      kind: openenv
      openenv: {path: examples.openenv_guess:GuessNumberEnv}

Guess a number in 1..N: the tool ``guess(number)`` says ``higher``/``lower``/``correct``; the episode
ends at the right guess (reward 1) or after ``max_guesses`` (reward 0). asyncrl lists the MCP tools
in process (``ListToolsAction``) and calls them (``CallToolAction``) from ``<tool>guess(7)</tool>``:
no Docker, no server. Needs ``openenv-core==0.3.0`` (docs/environments.md#openenv).
"""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State


class GuessObservation(Observation):
    """The prompt of an episode (or the answer to a non-MCP action)."""

    prompt: str = ""


class GuessNumberEnv(MCPEnvironment):
    """Guess a hidden number with the ``guess`` tool."""

    def __init__(self, top: int = 16, max_guesses: int = 5) -> None:
        self.top, self.max_guesses = top, max_guesses
        self.target, self.guesses, self.won = 1, 0, False
        mcp = FastMCP("guess-number")

        @mcp.tool
        def guess(number: int) -> str:
            """Guess the hidden number; answers higher, lower or correct."""
            self.guesses += 1
            if number == self.target:
                self.won = True
                return "correct"
            return "higher" if number < self.target else "lower"

        super().__init__(mcp)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self.target = random.Random(seed).randint(1, self.top)
        self.guesses, self.won = 0, False
        return GuessObservation(
            prompt=f"Find the hidden number in 1..{self.top} in at most {self.max_guesses} guesses "
            "with the guess tool."
        )

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        obs = super().step(action, timeout_s=timeout_s, **kwargs)
        if self.won or self.guesses >= self.max_guesses:
            obs.done, obs.reward = True, 1.0 if self.won else 0.0
        return obs

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return GuessObservation(prompt="use the guess tool")

    @property
    def state(self) -> State:
        return State(step_count=self.guesses)


__all__ = ["Environment", "GuessNumberEnv"]
