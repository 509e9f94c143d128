"""The orchestrator <-> rollout-worker channel: directives one way, group reports the other.

Directives
----------
The orchestrator publishes one typed document, :class:`Directives` (through
:meth:`asyncrl.control.RunState.publish_directives`): ``weights`` per bucket, the ``open`` and
``half_open`` breakers, the ``exploration`` settings, the ``heldout_rate``, the live ``workers`` and
those told to ``retire``. ``weights`` are the curriculum weights times the drift down-weights, 0 for
open breakers and the curriculum floor for half-open ones (:func:`compose`). Each worker reads it
(at most every ``control.refresh_s``) through :class:`~asyncrl.control.worker.WorkerControl`, which also

* picks the next task: with probability ``heldout_rate`` a held-out probe (run, reported, never
  trained); else with probability ``exploration_rate`` an exploration task (hardest difficulty
  among the sampled buckets); else a bucket by weight and a task of that bucket;
* applies **load balancing**: a worker's load is its in-flight episode steps (for each running
  episode, the model turns it may still take: ``max_turns - turns taken``), published with a
  heartbeat (:meth:`~asyncrl.control.RunState.publish_load`). A worker may start a group only if its
  load is less than one group's worth (``group_size x max_turns``) above the smallest load among the
  live workers named in ``workers`` (heartbeat within ``control.heartbeat_s``), so new groups go to
  the least-loaded worker by steps, not by episode count;
* tells a worker named in ``retire`` to stop starting groups (elastic scale-down);
* sizes a training group by its bucket's entry in ``group_sizes`` (``rollout.adaptive_group_size``:
  larger groups for buckets of rare success), ``rollout.group_size`` elsewhere;
* samples a bucket's episodes at its ``temperature_factors`` entry × ``rollout.sampling.temperature``
  (``orchestrator.signal.raise_temperature``: a hotter bucket where the policy became deterministic).

Group reports
-------------
A worker reports each finished group as one ``rollout/group`` metric event, a
:class:`~asyncrl.telemetry.reports.GroupReport` (:func:`group_report`): the rules (curriculum,
breakers, drift, exploration, reward hacking) consume exactly its fields.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from asyncrl.control.buckets import bucket_of
from asyncrl.records import Group, Trajectory
from asyncrl.telemetry.reports import GroupReport


@dataclass(frozen=True)
class Exploration:
    """The exploration settings in force (the orchestrator may raise them above the config's)."""

    temperature_jitter: float
    exploration_rate: float


@dataclass(frozen=True)
class Directives:
    """What the orchestrator tells every rollout worker (module docstring). ``exploration`` None: the
    config's own settings (no orchestrator has spoken yet)."""

    weights: dict[str, float] = field(default_factory=dict)
    open: list[str] = field(default_factory=list)
    half_open: list[str] = field(default_factory=list)
    exploration: Exploration | None = None
    heldout_rate: float = 0.0
    workers: list[str] = field(default_factory=list)
    retire: list[str] = field(default_factory=list)
    group_sizes: dict[str, int] = field(default_factory=dict)
    """Bucket -> the size of its training groups where it is not ``rollout.group_size``
    (``rollout.adaptive_group_size``)."""
    temperature_factors: dict[str, float] = field(default_factory=dict)
    """Bucket -> the factor on ``rollout.sampling.temperature`` its episodes are sampled at, where it is
    not 1 (``orchestrator.signal.raise_temperature``: :mod:`asyncrl.orchestrator.temperature`)."""
    at: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> Directives:
        """The directives of a stored :meth:`to_doc` (none stored: the defaults)."""
        return msgspec.convert(doc, cls) if doc else cls()


def compose(
    weights: dict[str, float],
    drift_factors: dict[str, float],
    open_buckets: list[str],
    half_open: list[str],
    floor: float,
    exploration: Exploration | None,
    heldout_rate: float,
    workers: list[str],
    retire: list[str],
    group_sizes: dict[str, int] | None = None,
    temperature_factors: dict[str, float] | None = None,
) -> Directives:
    w = {b: x * drift_factors.get(b, 1.0) for b, x in weights.items()}
    for b in half_open:
        w[b] = floor
    for b in open_buckets:
        w[b] = 0.0
    return Directives(
        weights=w,
        open=sorted(open_buckets),
        half_open=sorted(half_open),
        exploration=exploration,
        heldout_rate=heldout_rate,
        workers=sorted(workers),
        retire=sorted(retire),
        group_sizes=dict(group_sizes or {}),
        temperature_factors=dict(temperature_factors or {}),
        at=time.time(),
    )


def anomaly_of(traj: Trajectory, reward_min: float, reward_max: float) -> str | None:
    """The anomaly kind of a finished trajectory (first guard fault, env_error, reward range) or None:
    what the circuit breakers count."""
    for turn in traj.turns:
        if turn.fault is not None:
            return str(turn.fault.kind)
    if traj.outcome == "env_error":
        return "exception"
    if not reward_min <= traj.final_reward <= reward_max:
        return "reward_range"
    return None


def group_report(group: Group, reward_min: float, reward_max: float) -> GroupReport:
    """The ``rollout/group`` event of a finished group: everything the orchestrator's rules consume.
    Outcomes and rewards are per episode (per-turn samples share their episode's); tokens and faults
    are counted over every sample."""
    heads = group.episode_heads()
    return GroupReport(
        bucket=bucket_of(group.task),
        started=min(t.lifecycle.rollout_start for t in group.members),
        heldout=group.heldout,
        outcomes=[t.outcome for t in heads],
        rewards=[t.final_reward for t in heads],
        anomalies=[anomaly_of(t, reward_min, reward_max) for t in heads],
        env=group.task.env,
        tokens=sum(t.num_model_tokens() for t in group.members),
        faults=sum(1 for t in group.members for turn in t.turns if turn.fault is not None),
    )
