"""The held-out evaluation's constant-reply figure (``top_reply_share``) and the run summary's note: a
policy that gives one answer to every task scores that answer's base rate (issue #57: letter_counting
"learned" 21.9 -> 37.5 % by answering 1 to every held-out task)."""

from __future__ import annotations

from asyncrl.records import Task, Trajectory, Turn
from asyncrl.rollout.heldout import summarise, top_reply_share
from asyncrl.telemetry.report_metrics import CONSTANT_REPLY_SHARE, constant_reply_note


def _episode(i: int, *replies: list[int], outcome: str = "failure", episode: str = "") -> Trajectory:
    turns = [Turn(role="user", token_ids=[9, i])]
    for r in replies:
        turns += [Turn(role="model", token_ids=r), Turn(role="user", token_ids=[8])]
    return Trajectory(
        id=f"t{i}-{len(replies)}",
        task=Task(id=f"task{i}", task_type="x"),
        turns=turns,
        outcome=outcome,  # type: ignore[arg-type]
        episode_id=episode,
    )


def test_the_share_counts_final_replies_only() -> None:
    same = [_episode(i, [i, i], [5, 6]) for i in range(3)]  # different first replies, one final reply
    other = _episode(3, [5, 7])
    assert top_reply_share([*same, other]) == 0.75
    assert top_reply_share([_episode(i, [i]) for i in range(4)]) == 0.25
    assert top_reply_share([Trajectory(id="z", task=Task(id="t", task_type="x"), turns=[])]) is None


def test_one_changed_token_in_the_common_reply_moves_the_share() -> None:
    eps = [_episode(i, [5, 6]) for i in range(5)]
    assert top_reply_share(eps) == 1.0
    eps[0] = _episode(0, [5, 6, 0])
    assert top_reply_share(eps) == 0.8


def test_summarise_counts_an_episode_once_across_its_samples() -> None:
    """Per-turn samples of one episode (``episode_id``) are one held-out episode: its last sample's reply."""
    a1, a2 = _episode(0, [1], episode="e0"), _episode(0, [1], [7, 7], episode="e0")
    b, c = _episode(1, [7, 7], episode="e1"), _episode(2, [3], episode="e2")
    report = summarise([a1, a2, b, c])
    assert report["episodes"] == 3 and abs(report["top_reply_share"] - 2 / 3) < 1e-12
    assert report["per_task_type"]["x"]["top_reply_share"] == report["top_reply_share"]


def test_the_note_fires_at_the_threshold_and_names_the_share_before() -> None:
    at = {"success_rate": 0.375, "top_reply_share": CONSTANT_REPLY_SHARE}
    note = constant_reply_note({"top_reply_share": 0.3}, at)
    assert note is not None and note.startswith("80% of held-out episodes") and "(before RL: 30%)" in note
    assert "37.5%" in note
    assert constant_reply_note({}, {**at, "top_reply_share": CONSTANT_REPLY_SHARE - 0.01}) is None
    assert constant_reply_note({}, {"success_rate": 0.5, "top_reply_share": None}) is None
    assert "before RL" not in (constant_reply_note({}, at) or "before RL")
