"""The one typed wire record that every asyncrl process agrees on.

A :class:`Group` is what a rollout worker produces and the trainer consumes: the samples
(:class:`Trajectory`) played for one task, whole — the unit group-relative credit reasons about,
and the unit on the trajectory queue. Records are ``msgspec.Struct`` trees, encoded with MessagePack. Decoding is pure data
parsing and validation: it never executes code (no pickle anywhere), and any
malformed, truncated or wrong-version input raises :class:`RecordDecodeError`.

Token layout of one trajectory::

    prompt tokens | model turn 1 | observation 1 | model turn 2 | observation 2 | ...

``Turn.role`` is ``"env"`` for the prompt (the environment's first observation),
``"model"`` for sampled tokens and ``"tool"`` for observations caused by a model turn.
Only model tokens carry behaviour log-probs and a policy version, and only they have
``loss_mask == 1``.
"""

from __future__ import annotations

import hashlib
import uuid
from array import array
from collections.abc import Sequence
from typing import Any, Literal, get_args

import msgspec

SCHEMA_VERSION = 3
"""Bumped whenever a field changes meaning or type; decoders reject other versions."""

Role = Literal["model", "tool", "env"]
Outcome = Literal["success", "failure", "truncated", "timeout", "env_error", "early_stopped"]
OUTCOMES: tuple[str, ...] = get_args(Outcome)
FaultKind = Literal["exception", "timeout", "malformed", "bad_reward"]
"""What an environment did wrong, as the guard records it (:class:`Fault`)."""


class RecordDecodeError(ValueError):
    """Raised for bytes that are not a valid, current-version asyncrl record."""


class RecordEncodeError(ValueError):
    """Raised for a record holding a value MessagePack cannot carry (e.g. an int beyond 64 bits)."""


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """One problem instance handed to an environment."""

    id: str
    task_type: str
    difficulty: int = 0
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    """Environment-specific data (question, answer, knowledge base keys, ...)."""
    env: str = ""
    """The member environment of an ``env.kind: mix`` run the task belongs to (empty otherwise)."""


class ToolCall(msgspec.Struct, kw_only=True):
    """What a model turn asked a tool to do, and what came of it."""

    name: str
    arguments: str
    ok: bool
    result: str = ""
    error: str = ""
    latency_s: float = 0.0


class Fault(msgspec.Struct, kw_only=True):
    """An environment misbehaviour the guard absorbed (exception, hang, garbage)."""

    kind: FaultKind
    message: str
    attempts: int = 1


class Turn(msgspec.Struct, kw_only=True):
    """A contiguous span of tokens produced by one party."""

    role: Role
    token_ids: list[int]
    logprobs: list[float] | None = None
    """Behaviour log-prob of every sampled token (model turns only)."""
    version: int | None = None
    """Policy (weight) version that produced this turn (model turns only)."""
    process_reward: float = 0.0
    """Rule-based reward given by the environment for this turn."""
    tool_call: ToolCall | None = None
    fault: Fault | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    env_seconds: float = 0.0
    """Model turns: wall time of the environment step this turn caused (tool call, grading)."""
    shared: bool = False
    """A model turn replayed from the episode this one branched off (tree groups, ``rollout.tree``):
    context here — 0 in the loss mask, not counted as generated or for staleness — and trained
    in the trajectory that sampled it."""


class SamplingParams(msgspec.Struct, kw_only=True):
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64


class Lifecycle(msgspec.Struct, kw_only=True):
    """Wall-clock timestamps (``time.time()``) of a trajectory's stages; 0 = not reached."""

    created: float = 0.0
    rollout_start: float = 0.0
    rollout_end: float = 0.0
    enqueued: float = 0.0
    dequeued: float = 0.0
    trained: float = 0.0


class Trajectory(msgspec.Struct, kw_only=True):
    """One episode of an agent in an environment (or one sample of it): a member of a :class:`Group`."""

    id: str
    task: Task
    turns: list[Turn]
    final_reward: float = 0.0
    outcome: Outcome = "failure"
    reward_components: dict[str, float] = msgspec.field(default_factory=dict)
    lifecycle: Lifecycle = msgspec.field(default_factory=Lifecycle)
    worker_id: str = ""
    group_id: str = ""
    """The id of the :class:`Group` it was sampled in (every member of a group carries it)."""
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    render_diff: int | None = None
    """Token-exactness of this sample: tokens where the trained ids disagree with a rendering made
    apart from the one that built them — bridged episodes and merged gateway sessions: the
    template's rendering of the whole chat with the sampled ids spliced in; per-turn samples: the
    template's rendering of the history before the turn, against the prompt the engine was given.
    0: token-exact. ``None``: unchecked (no such rendering: a template that is not prefix-stable
    bridged, a chat it cannot render, a per-call gateway sample, nothing sampled) — never counted
    exact (``asyncrl.policy.exactness``)."""
    retokenization_diff: int | None = None
    """Tokens where rendering the finished chat as *text* and tokenising it anew would disagree
    with the sampled ids (a model may sample a non-canonical tokenisation, e.g. "\\n\\n" + "1"
    where the tokenizer makes "\\n" + "\\n1"). Training always uses the sampled ids; this
    measures the drift a re-tokenising framework would have trained on."""
    episode_id: str = ""
    """The episode this sample belongs to: an episode may be several samples (``model.multi_turn:
    per_turn``, a gateway session whose calls do not extend each other). Credit baselines count
    episodes, not samples; empty: the sample is its own episode."""
    schema_version: int = SCHEMA_VERSION

    # ---- derived views -------------------------------------------------------------
    @property
    def episode(self) -> str:
        """The episode's id (the sample's own id when it is a whole episode)."""
        return self.episode_id or self.id

    def token_ids(self) -> list[int]:
        """The flat token sequence: every turn's tokens in order."""
        return [t for turn in self.turns for t in turn.token_ids]

    def loss_mask(self) -> list[int]:
        """1 exactly on tokens sampled for this trajectory; 0 on prompt, observation and replayed tokens."""
        return [self._trained(turn) for turn in self.turns for _ in turn.token_ids]

    @staticmethod
    def _trained(turn: Turn) -> int:
        return 1 if turn.role == "model" and not turn.shared else 0

    def behaviour_logprobs(self) -> list[float]:
        """Per-token behaviour log-probs, 0.0 on non-model tokens."""
        out: list[float] = []
        for turn in self.turns:
            if turn.role == "model" and turn.logprobs is not None:
                out.extend(turn.logprobs)
            else:
                out.extend([0.0] * len(turn.token_ids))
        return out

    def token_versions(self) -> list[int]:
        """Per-token policy version, -1 on non-model tokens."""
        out: list[int] = []
        for turn in self.turns:
            v = turn.version if turn.role == "model" and turn.version is not None else -1
            out.extend([v] * len(turn.token_ids))
        return out

    def model_versions(self) -> list[int]:
        """Versions of the model turns sampled for this trajectory (replayed turns excluded)."""
        return [t.version for t in self.turns if self._trained(t) and t.version is not None]

    def oldest_version(self) -> int | None:
        """The oldest policy version that produced any token (what staleness is measured on)."""
        versions = self.model_versions()
        return min(versions) if versions else None

    def num_model_tokens(self) -> int:
        """Tokens sampled for this trajectory (replayed turns excluded)."""
        return sum(len(t.token_ids) for t in self.turns if self._trained(t))

    def segments(self) -> list[tuple[int, int]]:
        """Token spans ``[start, end)`` of each segment: one model turn plus the observation it caused."""
        spans: list[tuple[int, int]] = []
        pos = 0
        for turn in self.turns:
            n = len(turn.token_ids)
            if turn.role == "model":
                spans.append((pos, pos + n))
            elif spans and turn.role == "tool":
                spans[-1] = (spans[-1][0], pos + n)
            pos += n
        return spans

    def state_keys(self, cuts: Sequence[int]) -> list[str]:
        """A digest of the conversation state at each token position of ``cuts`` (ascending): the
        group id and the exact token prefix ``token_ids()[:cut]``. Episodes of one group that share
        a prefix share its key — the nodes of a tree group, the step groups of ``turn_group``."""
        h = hashlib.sha1((self.group_id or self.id).encode())
        flat, fed, out = self.token_ids(), 0, []
        for cut in cuts:
            h.update(array("q", flat[fed:cut]).tobytes())  # incremental: each token hashed once
            fed = max(fed, cut)
            out.append(h.hexdigest())
        return out

    def validate(self) -> None:
        """Check internal consistency; raises :class:`RecordDecodeError` on violation."""
        if self.schema_version != SCHEMA_VERSION:
            raise RecordDecodeError(
                f"trajectory {self.id!r} has schema_version {self.schema_version}, "
                f"this asyncrl reads version {SCHEMA_VERSION}"
            )
        for i, turn in enumerate(self.turns):
            if turn.role == "model":
                if turn.logprobs is None or len(turn.logprobs) != len(turn.token_ids):
                    raise RecordDecodeError(
                        f"trajectory {self.id!r} turn {i}: a model turn needs one behaviour log-prob per "
                        f"token ({len(turn.token_ids)} tokens, "
                        f"{0 if turn.logprobs is None else len(turn.logprobs)} log-probs)"
                    )
                if turn.version is None or turn.version < 0:
                    raise RecordDecodeError(
                        f"trajectory {self.id!r} turn {i}: a model turn needs a version >= 0"
                    )
            elif turn.logprobs is not None:
                raise RecordDecodeError(f"trajectory {self.id!r} turn {i}: only model turns carry log-probs")


class TreeStats(msgspec.Struct, kw_only=True):
    """How a tree group (``rollout.tree``) grew: its roots, branch points, replayed and diverged turns."""

    roots: int = 0
    branch_points: int = 0
    replayed_turns: int = 0
    replay_diverged: int = 0
    rounds: int = 0


class Group(msgspec.Struct, kw_only=True):
    """The samples played for one task in one group: the unit on the queue, in the buffer and in credit.

    A group travels whole from the worker that played it to the learner: one queue entry, acknowledged
    once every member's fate is durable (fates stay per member, keyed by trajectory id). Members are
    samples; an episode may be several (``Trajectory.episode``). ``episodes`` is how many episodes the
    group played (a group baseline counts episodes, not samples).
    """

    id: str
    task: Task
    members: list[Trajectory]
    episodes: int
    heldout: bool = False
    """A held-out probe: measured, never trained (never put on the queue)."""
    worker_id: str = ""
    tree: TreeStats | None = None
    """A tree group's growth (``None``: a flat group)."""
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def of(
        cls,
        task: Task,
        members: list[Trajectory],
        *,
        id: str = "",
        heldout: bool = False,
        tree: TreeStats | None = None,
    ) -> Group:
        """A group of ``members`` (every one stamped with the group's id: ``id``, else the first
        member's ``group_id``, else a new one)."""
        gid = id or (members[0].group_id if members else "") or new_id()
        for t in members:
            t.group_id = gid
        worker = members[0].worker_id if members else ""
        episodes = len({t.episode for t in members})
        return cls(
            id=gid,
            task=task,
            members=members,
            episodes=episodes,
            heldout=heldout,
            worker_id=worker,
            tree=tree,
        )

    def __len__(self) -> int:
        return len(self.members)

    def episode_heads(self) -> list[Trajectory]:
        """One sample per episode (its first), in order: what outcome statistics count."""
        heads: dict[str, Trajectory] = {}
        for t in self.members:
            heads.setdefault(t.episode, t)
        return list(heads.values())

    def validate(self) -> None:
        """Check the group and every member; raises :class:`RecordDecodeError` on violation."""
        if self.schema_version != SCHEMA_VERSION:
            raise RecordDecodeError(
                f"group {self.id!r} has schema_version {self.schema_version}, "
                f"this asyncrl reads version {SCHEMA_VERSION}"
            )
        if not self.members:
            raise RecordDecodeError(f"group {self.id!r} has no members")
        for t in self.members:
            if t.group_id != self.id:
                raise RecordDecodeError(f"group {self.id!r}: member {t.id!r} carries group id {t.group_id!r}")
            t.validate()


def members(groups: Sequence[Group]) -> list[Trajectory]:
    """The samples of ``groups``, group by group (the rows of a training batch)."""
    return [t for g in groups for t in g.members]


def groups_of(trajs: Sequence[Trajectory]) -> list[Group]:
    """Trajectories regrouped by ``group_id`` (a trajectory without one is a group of its own), in
    order of first appearance — for tests that build samples by hand: the running system and every
    file it writes keep :class:`Group` records whole, and nothing outside this module regroups
    (``tests/test_architecture.py``)."""
    by_id: dict[str, list[Trajectory]] = {}
    for t in trajs:
        by_id.setdefault(t.group_id or t.id, []).append(t)
    return [Group.of(ms[0].task, ms, id=gid) for gid, ms in by_id.items()]


def new_id() -> str:
    return uuid.uuid4().hex


_encoder = msgspec.msgpack.Encoder()
_traj_decoder = msgspec.msgpack.Decoder(Trajectory)
_group_decoder = msgspec.msgpack.Decoder(Group)
_version_probe = msgspec.msgpack.Decoder(dict[str, Any])


def encode(record: msgspec.Struct) -> bytes:
    """Encode any record struct to MessagePack bytes."""
    try:
        return _encoder.encode(record)
    except (OverflowError, TypeError) as exc:
        raise RecordEncodeError(f"cannot encode {type(record).__name__}: {exc}") from None


def decode_trajectory(data: bytes) -> Trajectory:
    """Decode and validate a trajectory; never executes code.

    Raises :class:`RecordDecodeError` for bytes that are truncated, malformed, of the
    wrong type or of another schema version.
    """
    traj: Trajectory = _decode_checked(data, _traj_decoder, "trajectory")
    traj.validate()
    return traj


def decode_group(data: bytes) -> Group:
    """Decode and validate a group and its members (what the queue carries); never executes code.
    Raises :class:`RecordDecodeError` as :func:`decode_trajectory` does."""
    group: Group = _decode_checked(data, _group_decoder, "group")
    group.validate()
    return group


def _decode_checked(data: bytes, decoder: msgspec.msgpack.Decoder[Any], what: str) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RecordDecodeError(f"expected bytes, got {type(data).__name__}")
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        # Say "wrong version" rather than a field error when the version field disagrees.
        try:
            version = _version_probe.decode(data).get("schema_version")
        except (msgspec.DecodeError, msgspec.ValidationError):
            version = None
        if version is not None and version != SCHEMA_VERSION:
            raise RecordDecodeError(
                f"{what} has schema_version {version!r}, this asyncrl reads version {SCHEMA_VERSION}"
            ) from None
        raise RecordDecodeError(f"not a valid {what} record: {exc}") from None


def decode(data: bytes, type_: type[msgspec.Struct]) -> Any:
    """Decode bytes into an arbitrary record struct type; errors become :class:`RecordDecodeError`."""
    try:
        return msgspec.msgpack.decode(data, type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RecordDecodeError(f"not a valid {type_.__name__} record: {exc}") from None
