"""``credit``: credit assignment and its value model (:mod:`asyncrl.credit`)."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Discriminator, Field, Tag

from asyncrl.config.base import Section, kind_of


class _ValueModelBase(Section):
    """The value model of the ``gae`` and ``value_delta`` credit strategies (trained online)."""

    kind: str = "head"
    """``head``: a small MLP on the policy backbone's final hidden states (features detached, so the
    policy's optimiser is unaffected); ``separate``: its own tiny transformer of the policy's family."""
    hidden_size: int = Field(64, ge=4, le=4096)
    """Width of the head's hidden layer, and of the separate model's residual stream."""
    lr: float = Field(1e-3, gt=0, le=1)
    """AdamW learning rate of the value model's own optimiser."""
    clip: float | None = Field(0.2, gt=0, le=10)
    """Clip range of the clipped value loss around the values before the update (null: plain MSE)."""
    epochs: int = Field(2, ge=1, le=100)
    """Value-model optimiser steps per training batch."""
    grad_clip: float = Field(1.0, gt=0, le=1e6)
    """Gradient-norm clip of the value model."""


class HeadValueModelConfig(_ValueModelBase):
    """A value head on the policy backbone."""

    kind: Literal["head"] = "head"


class SeparateValueModelConfig(_ValueModelBase):
    """A value model of its own."""

    kind: Literal["separate"] = "separate"
    num_layers: int = Field(1, ge=1, le=32)
    """Transformer blocks of the separate model."""


ValueModelConfig: TypeAlias = Annotated[
    Annotated[HeadValueModelConfig, Tag("head")] | Annotated[SeparateValueModelConfig, Tag("separate")],
    Discriminator(kind_of("head")),
]
"""``credit.value``: one model per ``kind``."""


class CreditConfig(Section):
    """Credit assignment: how a trajectory's reward becomes per-token advantages (docs/credit.md)."""

    strategy: Literal["outcome", "process", "gae", "value_delta", "turn_group", "tree"] = "outcome"
    """``outcome``: final reward with a group baseline on every model token; ``process``: plus
    per-turn rule rewards weighted by ``process_weight``; ``gae``: critic-based GAE (``gae_level``);
    ``value_delta``: segment credit V(after) − V(before) rescaled to sum to the outcome advantage;
    ``turn_group``: GiGPO-style step-relative advantages for turns that start from the same state;
    ``tree``: each segment gets the change in Monte-Carlo success probability it caused, measured over
    the group's tree of conversation states (branching groups: ``rollout.tree``)."""
    baseline: Literal["grpo", "dr_grpo", "rloo", "batch_mean"] = "grpo"
    """Outcome baseline within a group."""
    process_weight: float = Field(0.15, ge=0, le=10)
    """Weight α of process rewards relative to the outcome."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount over turns for reward-to-go of process rewards (and of GAE and step returns)."""
    gae_level: Literal["turn", "token"] = "turn"
    """``gae``: recursion over segments (one value per turn) or over model tokens."""
    gae_lambda: float = Field(0.95, ge=0, le=1)
    """λ of GAE."""
    value_delta_eps: float = Field(0.05, ge=0, le=1)
    """``value_delta`` guard: when the raw credits' sum |S| is below this (or below
    ``value_delta_min_ratio`` × Σ|d|, or has the wrong sign), the outcome is spread uniformly."""
    value_delta_min_ratio: float = Field(0.25, ge=0, le=1)
    """``value_delta`` guard for cancelling deltas; bounds every credit by |advantage| / ratio."""
    turn_group_weight: float = Field(1.0, ge=0, le=10)
    """``turn_group``: weight ω of the step-relative advantage added to the episode advantage."""
    sample_every: int = Field(10, ge=0, le=1_000_000)
    """Write a few trained trajectories with their segment credits to ``credit/samples-*.msgpack``
    every N trainer steps (and at the last step), for ``asyncrl credit show``; 0 disables."""
    sample_size: int = Field(4, ge=1, le=1000)
    """Trajectories per credit sample file."""
    value: ValueModelConfig = Field(default_factory=HeadValueModelConfig)
