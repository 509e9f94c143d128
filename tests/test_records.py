"""The trajectory wire record: round trips, derived views, and strict decoding."""

from __future__ import annotations

import pickle

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.records import (
    OUTCOMES,
    SCHEMA_VERSION,
    Fault,
    Group,
    Lifecycle,
    RecordDecodeError,
    RecordEncodeError,
    Task,
    ToolCall,
    Trajectory,
    Turn,
    decode_group,
    decode_trajectory,
    encode,
    groups_of,
    members,
)

token_lists = st.lists(st.integers(0, 50_000), min_size=1, max_size=20)
finite = st.floats(-1e6, 1e6, allow_nan=False)


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    role = draw(st.sampled_from(["model", "tool", "env"]))
    ids = draw(token_lists)
    if role == "model":
        return Turn(
            role="model",
            token_ids=ids,
            logprobs=[draw(st.floats(-50, 0)) for _ in ids],
            version=draw(st.integers(0, 10_000)),
            process_reward=draw(finite),
        )
    call = draw(
        st.none()
        | st.builds(
            ToolCall,
            name=st.text(max_size=8),
            arguments=st.text(max_size=20),
            ok=st.booleans(),
            result=st.text(max_size=20),
        )
    )
    fault = draw(
        st.none()
        | st.builds(Fault, kind=st.sampled_from(["exception", "timeout"]), message=st.text(max_size=20))
    )
    return Turn(role=role, token_ids=ids, tool_call=call, fault=fault)


@st.composite
def trajectories(draw: st.DrawFn) -> Trajectory:
    task = Task(
        id=draw(st.text(min_size=1, max_size=10)),
        task_type=draw(st.sampled_from(["calculator", "kb_lookup"])),
        difficulty=draw(st.integers(0, 9)),
        payload=draw(
            st.dictionaries(
                st.text(max_size=5), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10), max_size=3
            )
        ),
    )
    return Trajectory(
        id=draw(st.text(min_size=1, max_size=12)),
        task=task,
        turns=draw(st.lists(turns(), min_size=1, max_size=8)),
        final_reward=draw(finite),
        outcome=draw(st.sampled_from(OUTCOMES)),
        reward_components=draw(st.dictionaries(st.text(max_size=5), finite, max_size=3)),
        lifecycle=Lifecycle(created=draw(st.floats(0, 2e9))),
        worker_id=draw(st.text(max_size=5)),
    )


@settings(max_examples=100, deadline=None)
@given(trajectories())
def test_round_trip(traj: Trajectory) -> None:
    data = encode(traj)
    back = decode_trajectory(data)
    assert back == traj
    assert encode(back) == data


@settings(max_examples=50, deadline=None)
@given(trajectories())
def test_flat_views_are_consistent(traj: Trajectory) -> None:
    ids, mask, lps, vers = (
        traj.token_ids(),
        traj.loss_mask(),
        traj.behaviour_logprobs(),
        traj.token_versions(),
    )
    assert len(ids) == len(mask) == len(lps) == len(vers)
    assert sum(mask) == traj.num_model_tokens()
    pos = 0
    for turn in traj.turns:
        for k in range(len(turn.token_ids)):
            assert mask[pos + k] == (1 if turn.role == "model" else 0)
            assert vers[pos + k] == (turn.version if turn.role == "model" else -1)
        pos += len(turn.token_ids)


@settings(max_examples=50, deadline=None)
@given(trajectories(), st.data())
def test_truncated_bytes_raise_the_specific_error(traj: Trajectory, data: st.DataObject) -> None:
    raw = encode(traj)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(RecordDecodeError):
        decode_trajectory(raw[:cut])


def _example() -> Trajectory:
    return Trajectory(
        id="t1",
        task=Task(id="q1", task_type="calculator", difficulty=2),
        turns=[
            Turn(role="env", token_ids=[1, 2, 3]),
            Turn(role="model", token_ids=[4, 5], logprobs=[-0.1, -0.2], version=3),
            Turn(role="tool", token_ids=[6, 7, 8]),
            Turn(role="model", token_ids=[9], logprobs=[-0.3], version=4),
        ],
        final_reward=1.0,
        outcome="success",
    )


def test_hand_checked_views() -> None:
    t = _example()
    assert t.token_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask() == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert t.behaviour_logprobs() == [0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3]
    assert t.token_versions() == [-1, -1, -1, 3, 3, -1, -1, -1, 4]
    assert t.oldest_version() == 3
    assert t.segments() == [(3, 8), (8, 9)]


def test_wrong_version_is_named() -> None:
    t = _example()
    t.schema_version = SCHEMA_VERSION + 1
    with pytest.raises(RecordDecodeError, match=f"schema_version {SCHEMA_VERSION + 1}"):
        decode_trajectory(encode(t))


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode({"id": 3}), msgspec.msgpack.encode([1, 2])],
)
def test_malformed_bytes(payload: bytes) -> None:
    with pytest.raises(RecordDecodeError, match="not a valid trajectory"):
        decode_trajectory(payload)


def test_inconsistent_model_turn_rejected() -> None:
    t = _example()
    t.turns[1].logprobs = [-0.1]  # one log-prob for two tokens
    with pytest.raises(RecordDecodeError, match="one behaviour log-prob per token"):
        decode_trajectory(encode(t))
    t = _example()
    t.turns[0].logprobs = [0.0, 0.0, 0.0]
    with pytest.raises(RecordDecodeError, match="only model turns"):
        decode_trajectory(encode(t))


class _Boom:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_pickle_payload_is_never_executed(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    evil = pickle.dumps(_Boom())
    with pytest.raises(RecordDecodeError):
        decode_trajectory(evil)
    assert not (tmp_path / "PWNED").exists()


def test_non_bytes_input() -> None:
    with pytest.raises(RecordDecodeError, match="expected bytes"):
        decode_trajectory("text")  # type: ignore[arg-type]


def test_unencodable_value_gets_clear_error() -> None:
    t = _example()
    t.task = Task(id="q", task_type="calculator", payload={"big": 2**70})
    with pytest.raises(RecordEncodeError, match="cannot encode Trajectory"):
        encode(t)


def test_state_keys_name_a_token_prefix_within_a_group() -> None:
    def traj(group: str, ids: list[int]) -> Trajectory:
        return Trajectory(
            id=group + str(ids),
            task=Task(id="x", task_type="t"),
            turns=[Turn(role="env", token_ids=ids)],
            group_id=group,
        )

    a, b = traj("g", [1, 2, 3, 4]), traj("g", [1, 2, 5, 6])
    assert a.state_keys([2, 4]) == [a.state_keys([2])[0], a.state_keys([4])[0]]  # incremental = one shot
    assert a.state_keys([2])[0] == b.state_keys([2])[0] and a.state_keys([3]) != b.state_keys([3])
    assert traj("h", [1, 2, 3, 4]).state_keys([2]) != a.state_keys([2])  # another group, another tree


# ---- the group: the unit on the queue ----------------------------------------------------------------
def _members(n: int, episode: str = "") -> list[Trajectory]:
    return [
        Trajectory(
            id=f"m{k}",
            task=Task(id="t", task_type="calc"),
            turns=[
                Turn(role="env", token_ids=[1]),
                Turn(role="model", token_ids=[2], logprobs=[-0.1], version=0),
            ],
            episode_id=episode,
        )
        for k in range(n)
    ]


@settings(max_examples=50, deadline=None)
@given(st.lists(trajectories(), min_size=1, max_size=4))
def test_a_group_round_trips_whole(members: list[Trajectory]) -> None:
    group = Group.of(members[0].task, members, id="g")
    back = decode_group(encode(group))
    assert back == group and [t.id for t in back.members] == [t.id for t in members]
    assert all(t.group_id == "g" for t in back.members)


def test_a_group_counts_its_episodes_and_names_one_sample_of_each() -> None:
    per_turn, whole = _members(3, episode="e"), _members(2)  # one episode of three samples; two of one
    for k, t in enumerate(whole):
        t.id = f"w{k}"
    group = Group.of(per_turn[0].task, [*per_turn, *whole], id="g")
    assert len(group) == 5 and group.episodes == 3
    assert [t.id for t in group.episode_heads()] == ["m0", "w0", "w1"]


def test_a_malformed_group_is_refused_with_its_reason() -> None:
    group = Group.of(Task(id="t", task_type="calc"), _members(2), id="g")
    stranger = msgspec.structs.replace(group, members=[*group.members, *_members(1)])
    stranger.members[-1].group_id = "other"
    with pytest.raises(RecordDecodeError, match="carries group id 'other'"):
        decode_group(encode(stranger))
    with pytest.raises(RecordDecodeError, match="has no members"):
        decode_group(encode(msgspec.structs.replace(group, members=[])))
    old = msgspec.structs.replace(group, schema_version=SCHEMA_VERSION - 1)
    with pytest.raises(RecordDecodeError, match=f"group .g. has schema_version {SCHEMA_VERSION - 1}"):
        decode_group(encode(old))
    broken = Group.of(Task(id="t", task_type="calc"), _members(1), id="g")
    broken.members[0].turns[1].logprobs = None  # a member that could never be trained
    with pytest.raises(RecordDecodeError, match="log-prob"):
        decode_group(encode(broken))


def test_groups_of_regroups_samples_read_back_from_files_in_order() -> None:
    a, b = _members(2), _members(1)
    for t in a:
        t.group_id = "a"
    b[0].id, b[0].group_id = "solo", ""
    groups = groups_of([a[0], b[0], a[1]])
    assert [g.id for g in groups] == ["a", "solo"] and [len(g) for g in groups] == [2, 1]
    assert groups[1].members == [b[0]] and members(groups) == [a[0], a[1], b[0]]
