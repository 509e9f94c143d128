"""Token-exactness as id comparisons: what a trained sample is checked against.

A sample is *token-exact* when its trained ids are what the engine was given and sampled, and the
prompt part is the chat template's own rendering — a comparison with a rendering made apart from
the one that built the sample, so that the check can come out wrong. Where no such rendering can
be made the result is ``None`` (unchecked), never 0. The checks themselves live with their paths:
``asyncrl.rollout.episode`` (bridged and per-turn samples) and ``asyncrl.gateway.sessions``
(merged gateway sessions); these are the comparisons they share.
"""

from __future__ import annotations


def count_differences(ids: list[int], reference: list[int]) -> int:
    """Positions where ``ids`` and the re-rendered ``reference`` disagree, plus missing positions.

    Compared over ``len(ids)``: the template's closing text after the last message (which was
    never sampled) is not counted.
    """
    n = len(ids)
    diff = sum(1 for a, b in zip(ids, reference[:n], strict=False) if a != b)
    return diff + max(0, n - len(reference))


def ids_diff(ids: list[int], reference: list[int]) -> int:
    """Positions where two id sequences disagree, plus the difference in length (0: equal)."""
    return sum(1 for a, b in zip(ids, reference, strict=False) if a != b) + abs(len(ids) - len(reference))


def engine_diff(trained: list[int], seen: list[tuple[int, list[int], list[int]]]) -> int:
    """Tokens where ``trained`` disagrees with what the engine saw.

    ``seen``: per model turn, ``(offset of the turn in trained, prompt ids the engine was given,
    ids it sampled)``. The prompt must be ``trained[:offset]`` and the sampled ids must follow it;
    0 means the trained ids are exactly the engine's prompts + its samples. A bookkeeping check
    for samples assembled from those very prompts, not an independent one.
    """
    diff = 0
    for offset, prompt, sampled in seen:
        diff += ids_diff(prompt, trained[:offset])
        diff += count_differences(sampled, trained[offset : offset + len(sampled)])
    return diff
