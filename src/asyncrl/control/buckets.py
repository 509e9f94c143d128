"""Task buckets: what the curriculum, the breakers, the workers and the replay buffer all index by.

A **bucket** is a (task type, difficulty) pair, written ``"type:difficulty"`` (e.g.
``"arithmetic:3"``); the buckets of a run are the task source's ``task_types`` x its active
difficulties. The orchestrator weights buckets (:mod:`asyncrl.orchestrator.curriculum`); a worker
samples a bucket by weight and then a task of that bucket (:func:`sample_in_bucket`). A task of an
``env.kind: mix`` run carries its environment's name: ``"name/type:difficulty"`` (``"arith/arithmetic:3"``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from asyncrl.envs.base import HashSplitTaskSource
from asyncrl.envs.mix import MixTaskSource
from asyncrl.records import Task

if TYPE_CHECKING:
    from asyncrl.envs.base import TaskSource


def bucket_of(task: Task) -> str:
    if task.env:
        return f"{task.env}/{task.task_type}:{task.difficulty}"
    return f"{task.task_type}:{task.difficulty}"


def split_bucket(bucket: str) -> tuple[str, int]:
    task_type, _, difficulty = bucket.rpartition(":")
    return task_type, int(difficulty)


def active_difficulties(source: TaskSource) -> tuple[int, ...]:
    """The difficulties ``source`` draws from: those ``env.min_difficulty``/``max_difficulty`` left."""
    return (
        source.active_difficulties if isinstance(source, HashSplitTaskSource) else tuple(source.difficulties)
    )


def buckets_of_source(source: TaskSource, probes: int = 64) -> list[str]:
    """The buckets a task source produces: its task types x its active difficulties.

    With several task types not every pair need exist (a template may have one difficulty), so
    the source is probed: ``probes`` draws per difficulty, with a fixed seed. A mix: every member's
    buckets, prefixed with its name."""
    if isinstance(source, MixTaskSource):
        return [f"{n}/{b}" for n, s in source.members.items() for b in buckets_of_source(s, probes)]
    types = tuple(source.task_types)
    diffs = active_difficulties(source)
    if len(types) <= 1:
        return [f"{t}:{d}" for t in types for d in diffs]
    rng = random.Random(0)
    found = {bucket_of(source.sample(rng, difficulty=d)) for d in diffs for _ in range(probes)}
    return sorted(found)


def sample_in_bucket(source: TaskSource, rng: random.Random, bucket: str, attempts: int = 200) -> Task:
    """A training task of ``bucket``: draws at the bucket's difficulty until the type matches.

    Sources draw a task type at random, so this is rejection sampling over types; after
    ``attempts`` misses it returns the last draw (of the right difficulty, another type). A mix draws
    from the bucket's own environment."""
    if isinstance(source, MixTaskSource):
        name, _, rest = bucket.partition("/")
        if name not in source.members:
            return source.sample(rng)
        return source.tag(name, sample_in_bucket(source.members[name], rng, rest, attempts))
    task_type, difficulty = split_bucket(bucket)
    task = source.sample(rng, difficulty=difficulty)
    for _ in range(attempts - 1):
        if task.task_type == task_type:
            break
        task = source.sample(rng, difficulty=difficulty)
    return task


def weighted_choice(weights: dict[str, float], rng: random.Random) -> str | None:
    total = sum(w for w in weights.values() if w > 0)
    if total <= 0:
        return None
    x = rng.random() * total
    for bucket, w in sorted(weights.items()):
        if w <= 0:
            continue
        x -= w
        if x <= 0:
            return bucket
    return max(weights, key=lambda b: weights[b])


def bucket_prior(source: TaskSource) -> dict[str, float]:
    """``env.kind: mix``: each bucket's share of the draws when every curriculum weight is equal — its
    environment's weight (normalised) spread evenly over the environment's buckets; ``{}`` otherwise."""
    if not isinstance(source, MixTaskSource):
        return {}
    total = sum(source.weights.values())
    out: dict[str, float] = {}
    for name, member in source.members.items():
        bs = buckets_of_source(member)
        out |= {f"{name}/{b}": source.weights[name] / total / len(bs) for b in bs}
    return out
