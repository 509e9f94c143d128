"""OpenAI-compatible gateway: train an existing OpenAI-API agent program (docs/agents.md)."""

from asyncrl.gateway.protocol import GatewayError
from asyncrl.gateway.server import Gateway
from asyncrl.gateway.sessions import CallRecord, Session, SessionTable, build_trajectories

__all__ = ["CallRecord", "Gateway", "GatewayError", "Session", "SessionTable", "build_trajectories"]
