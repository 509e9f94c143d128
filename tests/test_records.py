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
    Lifecycle,
    RecordDecodeError,
    RecordEncodeError,
    Task,
    ToolCall,
    Trajectory,
    Turn,
    decode_trajectory,
    encode,
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
