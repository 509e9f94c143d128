"""``env.gem``, ``env.openenv``, ``env.verifiers``: environments of other ecosystems, run in process.

Each package installs without its dependencies (their pins conflict with asyncrl's):
docs/environments.md#gem, #openenv, #verifiers.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from asyncrl.config.base import Section


class GemConfig(Section):
    """``env.kind: gem``: a GEM game or a TextArena single-player game (docs/environments.md#gem)."""

    game: str = Field(min_length=3)
    """GEM id (``game:GuessTheNumber-v0-easy``, ``rg:basic_arithmetic``, ...) or a TextArena id with
    the ``textarena:`` prefix (``textarena:GuessTheNumber-v0``). ``code:*`` ids (model code run
    without isolation) are refused."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gem.make`` / ``textarena.make``."""
    seeds: int = Field(100_000, ge=10, le=2**31 - 1)
    """Episodes are ``reset(seed=s)`` for ``s`` in ``0 .. seeds-1``; the held-out seeds are a hash
    split of that range (``env.seed`` salts it), never drawn for training."""
    tools: list[str] = Field(default_factory=list)
    """``[python]``: the model may run code as ``<tool>python(CODE)</tool>`` in asyncrl's sandbox
    (``env.sandbox``); the game only sees the other turns."""
    success_reward: float = Field(1.0, ge=-1e6, le=1e6)
    """A final game reward at least this is a success."""


class OpenEnvConfig(Section):
    """``env.kind: openenv``: an OpenEnv ``Environment`` class in process (docs/environments.md#openenv)."""

    path: str = Field(min_length=3)
    """``package.module:ClassName`` of the ``Environment`` (an ``MCPEnvironment``, or one that
    answers ``ListToolsAction``/``CallToolAction`` itself). No Docker, no server."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the class."""
    answer_tool: str | None = None
    """A tool that ``<answer>X</answer>`` calls with X (unset: an answer ends the episode, a failure)."""
    seeds: int = Field(100_000, ge=10, le=2**31 - 1)
    """Episodes are ``reset(seed=s)`` for ``s`` in ``0 .. seeds-1`` (hash split, as ``env.gem``)."""
    success_reward: float = Field(1.0, ge=-1e6, le=1e6)
    """A final reward at least this is a success."""


class VerifiersConfig(Section):
    """``env.kind: verifiers``: a verifiers v0 ``SingleTurnEnv`` in process (docs/environments.md#verifiers)."""

    path: str = Field(min_length=3)
    """``package.module:function`` returning the environment (a ``load_environment``), or the
    name of an installed verifiers environment module (its ``load_environment`` is called)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``load_environment``."""
    success_reward: float = Field(1.0, ge=-1e6, le=1e6)
    """A rubric score at least this is a success."""


ECOSYSTEM_KINDS = ("gem", "openenv", "verifiers")
"""``env.kind``s configured in the section of the same name."""
