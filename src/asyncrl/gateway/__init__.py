"""OpenAI-compatible gateway: train an existing OpenAI-API agent program (docs/agents.md)."""

from asyncrl.gateway.server import Gateway
from asyncrl.gateway.sessions import build_trajectories

__all__ = ["Gateway", "build_trajectories"]
