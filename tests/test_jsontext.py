"""Bounded JSON from untrusted text: the depth is found without recursion, and a model's or a client's
text nested past the bound is a parse error where ``json.loads`` would raise ``RecursionError``."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from asyncrl import jsontext
from asyncrl.policy.toolcalls import FORMATS, call_arguments, make_format


def _depth(value: Any) -> int:
    """The reference: nesting depth by recursion over the parsed value."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _random_value(rng: random.Random, depth: int) -> Any:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice([1, "a]b", 'q"[{', "\\", None, "}}}", 2.5])
    if rng.random() < 0.5:
        return [_random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}[": _random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}


@pytest.mark.parametrize("as_bytes", [False, True])
def test_depth_matches_the_recursive_reference_with_brackets_inside_strings(as_bytes: bool) -> None:
    rng = random.Random(0)
    for _ in range(300):
        value = _random_value(rng, rng.randint(0, 8))
        text: str | bytes = json.dumps(value)
        text = text.encode() if as_bytes else text
        d = _depth(value)
        for limit in range(0, 10):
            assert jsontext.depth_exceeds(text, limit) == (d > limit), (text, limit)


def test_text_nested_past_the_bound_is_a_decode_error_not_a_recursion_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        json.loads(deep)  # what the bound is there for
    for text in (deep, deep.encode(), '{"a": ' + deep + "}"):
        with pytest.raises(json.JSONDecodeError, match="nested deeper than 128"):
            jsontext.loads(text)
    ok = "[" * 128 + "]" * 128
    assert _depth(jsontext.loads(ok)) == 128
    with pytest.raises(json.JSONDecodeError):
        jsontext.loads("[" + ok + "]")


def test_raw_decode_bounds_only_the_value_at_start() -> None:
    text = 'say <tool_call>{"name": "f", "arguments": {"x": [1]}}</tool_call> ' + "[" * 500
    start = text.index("{")
    obj, end = jsontext.raw_decode(text, start)
    assert obj["arguments"] == {"x": [1]} and text[end:].startswith("</tool_call>")
    with pytest.raises(json.JSONDecodeError):
        jsontext.raw_decode("x" + "[" * 5000 + "]" * 5000, 1)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_model_reply_nested_thousands_deep_is_an_unreadable_call_in_every_format(name: str) -> None:
    """Before the bound, hermes, qwen25, llama3_json and mistral raised ``RecursionError`` out of the
    episode on such a reply; the text format hands the arguments on as text."""
    fmt = make_format(name)
    deep = "[" * 5000 + "]" * 5000
    found = fmt.find_call(fmt.write_call("f", {"x": 1}).replace("1", deep, 1))
    if name == "text":
        assert found == ("f", deep, None)
        assert call_arguments(None, deep) == {"input": deep}
    else:
        assert isinstance(found, str) and "does not parse" in found
