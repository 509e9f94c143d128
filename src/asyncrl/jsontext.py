"""JSON from untrusted text — a client's request body, a model's tool-call arguments — with nesting bounded.

``json.loads`` recurses once per ``[``/``{``: text nested a few thousand deep (a model can write that in
one reply) raises ``RecursionError`` from deep inside the interpreter, where a garbage collection can
fail in unrelated finalizers. :func:`loads` finds the depth first, without recursion, and refuses text
nested past :data:`MAX_DEPTH` as a ``json.JSONDecodeError``, which every caller already handles.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 128
"""The deepest nesting of arrays and objects accepted. A chat request nests a handful of levels, a
tool's JSON schema a few more."""

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_STRING_B = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS_B = bytes(b for b in range(256) if b not in b"[]{}")
_OPEN = frozenset((ord("["), ord("{"), "[", "{"))


def depth_exceeds(text: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether ``text``'s arrays and objects nest deeper than ``limit``: the brackets outside strings,
    each ``[``/``{`` one level down and each ``]``/``}`` one up (no recursion, linear time)."""
    brackets: Any
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return False
        brackets = _STRING_B.sub(b"", text).translate(None, _NOT_BRACKETS_B)
    else:
        if text.count("[") + text.count("{") <= limit:
            return False
        brackets = [c for c in _STRING.sub("", text) if c in "[]{}"]
    depth = 0
    for c in brackets:
        depth += 1 if c in _OPEN else -1
        if depth > limit:
            return True
        if depth <= 0:  # the first value closed: what follows it is no part of it
            return False
    return False


def loads(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``; ``json.JSONDecodeError`` for text nested past :data:`MAX_DEPTH`."""
    if depth_exceeds(text):
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", doc, 0)
    return json.loads(text, **kwargs)


_DECODER = json.JSONDecoder()


def raw_decode(text: str, start: int = 0) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode(text, start)`` with the nesting of the value at ``start`` bounded
    as :func:`loads` bounds it."""
    if depth_exceeds(text[start:]):
        raise json.JSONDecodeError(f"nested deeper than {MAX_DEPTH} levels", text, start)
    return _DECODER.raw_decode(text, start)
