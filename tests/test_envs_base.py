"""The shared action parser, process-reward rules and task-source split."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.envs import (
    AnswerAction,
    CalculatorTasks,
    EpisodeRewards,
    MalformedAction,
    ToolCallAction,
    parse_action,
)
from asyncrl.envs.base import mentions_number


def test_tool_call_args_are_between_first_paren_and_last_paren() -> None:
    a = parse_action("<tool>python(print(sum(i*i for i in range(1, 8))))</tool>")
    assert a == ToolCallAction("python", "print(sum(i*i for i in range(1, 8)))", a.text)


def test_answer_and_free_text_before_the_tag() -> None:
    assert parse_action("I think so. <answer> 19 </answer>") == AnswerAction(
        "19", "I think so. <answer> 19 </answer>"
    )
    a = parse_action("first multiply <tool>calc(3*4)</tool>\n")
    assert isinstance(a, ToolCallAction) and (a.name, a.args) == ("calc", "3*4")


@pytest.mark.parametrize(
    "text",
    [
        "19",  # no tag
        "<tool>calc(3*4)",  # truncated by the token limit
        "<tool>calc 3*4</tool>",  # no parentheses
        "<tool>calc(3*4</tool>",  # unbalanced
        "<tool>(3*4)</tool>",  # no name
        "<tool>9calc(1)</tool>",  # bad name
        "<tool>calc (1)</tool>",  # space before (
        "<tool>calc(1)x</tool>",  # junk after )
        "<answer></answer>",  # empty answer
        "calc(1)</tool>",  # closing tag only
        "<tool>calc(1)</tool> more text",  # text after the closing tag
        "<answer>1</answer><tool>calc(1)</tool>",  # two actions
    ],
)
def test_malformed_actions(text: str) -> None:
    assert isinstance(parse_action(text), MalformedAction)


@given(st.text(max_size=60))
def test_parser_never_raises(text: str) -> None:
    assert isinstance(parse_action(text), ToolCallAction | AnswerAction | MalformedAction)


@given(
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
    # any text the protocol can carry: no closing tag (it would end the turn) and no <tool>
    # (the LAST opening tag before the close starts the call; hypothesis found '<tool>' in args)
    st.text(max_size=40).filter(lambda s: not any(tag in s for tag in ("</tool>", "</answer>", "<tool>"))),
)
def test_round_trip_of_any_args(name: str, args: str) -> None:
    a = parse_action(f"<tool>{name}({args})</tool>")
    assert isinstance(a, ToolCallAction) and a.name == name and a.args == args


def test_process_rewards_are_not_farmable() -> None:
    r = EpisodeRewards()
    first, parts = r.tool_ok("calc", "3*4", "12", mentions_number)
    assert first == pytest.approx(0.1) and parts == {"well_formed": 0.1}
    again, _ = r.tool_ok("calc", "3*4", "12", mentions_number)  # same call again: no bonus
    assert again == 0.0
    uses, parts = r.tool_ok("calc", "12+12", "24", mentions_number)
    assert uses == pytest.approx(0.2) and parts["uses_result"] == pytest.approx(0.1)
    reuse, _ = r.tool_ok("calc", "12+1", "13", mentions_number)  # 12 already used once
    assert reuse == pytest.approx(0.1)
    assert r.malformed("bad").process_reward < 0 and r.tool_error()[0] < 0
    ans, _ = r.answer("24", mentions_number)
    assert ans == pytest.approx(0.1)


def test_mentions_number_is_whole_token() -> None:
    assert mentions_number("12+12", "12")
    assert not mentions_number("112+3", "12")


def test_unsupported_difficulty_is_a_clear_error() -> None:
    src = CalculatorTasks(seed=0, heldout_size=4)
    with pytest.raises(ValueError, match="supported"):
        src.sample(random.Random(0), 9)
    with pytest.raises(ValueError, match="contains none"):
        CalculatorTasks(seed=0, heldout_size=4, min_difficulty=7, max_difficulty=9)
