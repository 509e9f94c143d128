"""Multi-turn KV reuse in the built-in engine: the prefix cache changes the cost, never the samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from asyncrl.config import HFEngineConfig
from asyncrl.engine import HFEngine, Sample, make_engine, read_weights
from asyncrl.engine.prefix_cache import PrefixCache
from asyncrl.engine.prefix_tree import CACHED, plan_prefill
from asyncrl.records import SamplingParams
from test_engine import PEAKY, assert_at_noise_floor, hf_engine, logprob_error, random_prompts, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STOPS = [50, 60]


def multi_turn(
    engine: HFEngine, turns: int, sp: SamplingParams, seed: int = 0, join: int = 4
) -> tuple[list[list[int]], list[list[Sample]]]:
    """Episodes as the runner drives them: context = prompt + samples + observations; ``join`` new
    episodes enter at every turn after the first (a mixed batch: some rows cached, some not)."""
    g = torch.Generator().manual_seed(seed)
    contexts = random_prompts(10, 2, 30, seed=seed)
    per_turn: list[list[Sample]] = []
    prompts: list[list[int]] = []
    for turn in range(turns):
        if turn:
            contexts += random_prompts(join, 2, 30, seed=seed + 100 + turn)
        prompts = list(contexts)
        samples = engine.generate(prompts, sp)
        per_turn.append(samples)
        for i, s in enumerate(samples):
            observation = torch.randint(10, 100, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g)
            contexts[i] = prompts[i] + s.token_ids + observation.tolist()
    return prompts, per_turn


def assert_same(a: list[list[Sample]], b: list[list[Sample]], tol: float = 1e-5) -> None:
    for turn_a, turn_b in zip(a, b, strict=True):
        for x, y in zip(turn_a, turn_b, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) < tol


@pytest.mark.parametrize(
    ("family", "attn", "temperature", "compact"),
    [
        ("qwen2", "sdpa", 1.0, 0.25),
        ("qwen2", "eager", 0.7, 0.0),
        ("llama", "sdpa", 0.5, 1.0),
        ("llama", "eager", 1.0, 0.25),
    ],
)
def test_reuse_gives_the_samples_of_a_full_prefill(
    family: str, attn: str, temperature: float, compact: float
) -> None:
    policy = tiny(family, peaky=PEAKY, attn=attn)
    sp = SamplingParams(temperature=temperature, max_new_tokens=16)
    cached = hf_engine(
        policy, STOPS, seed=3, max_batch=8, compact_fraction=compact, prefix_cache=True, prefix_cache_mb=64
    )
    plain = hf_engine(policy, STOPS, seed=3, max_batch=8, compact_fraction=compact)
    prompts, with_reuse = multi_turn(cached, 3, sp)
    _, without = multi_turn(plain, 3, sp)
    assert_same(with_reuse, without)
    # reuse happened, and the last turn mixed cached rows with fresh ones of other lengths
    assert cached.prefill_tokens_reused > cached.prefill_tokens_computed
    assert cached.prefill_tokens_reused + cached.prefill_tokens_computed == plain.prefill_tokens_computed
    assert plain.prefill_tokens_reused == 0
    assert {s.finish_reason for s in with_reuse[-1]} == {"stop", "length"}
    # the behaviour log-probs are still the trainer's
    last = with_reuse[-1]
    assert_at_noise_floor(logprob_error(policy, prompts, last, [temperature] * len(last)), "reuse")


def test_stored_kv_equals_a_fresh_forward_pass() -> None:
    """Every entry (rows compacted away mid-decode and rows left at the end) holds its ids' own KV."""
    policy = tiny(peaky=2.0)
    engine = hf_engine(
        policy, STOPS, seed=1, max_batch=16, compact_fraction=0.0, prefix_cache=True, prefix_cache_mb=64
    )
    prompts = random_prompts(12, 3, 25, seed=5)
    samples = engine.generate(prompts, SamplingParams(max_new_tokens=12))
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == len(set(map(tuple, prompts)))
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    for p, s in zip(prompts, samples, strict=True):
        ids = p + s.token_ids[:-1]
        entry = engine.prefix_cache.entries[tuple(ids)]
        cache = DynamicCache(config=policy.model.config)
        with torch.no_grad():
            policy.model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        for layer, ref in enumerate(cache.layers):
            assert ref.keys is not None and ref.values is not None
            torch.testing.assert_close(entry.kv[layer, 0], ref.keys[0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(entry.kv[layer, 1], ref.values[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("share", [False, True])
def test_weight_load_drops_the_cache(tmp_path: Path, share: bool) -> None:
    greedy = SamplingParams(temperature=1e-4, max_new_tokens=10)
    engine = hf_engine(
        tiny(seed=0), STOPS, seed=0, prefix_cache=True, prefix_cache_mb=64, max_batch=64, prefix_sharing=share
    )
    prompts = random_prompts(6, 2, 12, seed=14)
    first = engine.generate(prompts, greedy)
    assert engine.prefix_cache is not None and len(engine.prefix_cache) > 0
    nxt = [p + s.token_ids + [11, 12] for p, s in zip(prompts, first, strict=True)]
    other = tiny(seed=1)
    other.save(tmp_path / "v3")
    engine.load_weights(3, read_weights(tmp_path / "v3"))
    assert len(engine.prefix_cache) == 0 and engine.prefix_cache.bytes == 0
    after = engine.generate(nxt, greedy)
    assert engine.prefill_tokens_reused == 0
    fresh = hf_engine(other, STOPS, seed=0, max_batch=64).generate(nxt, greedy)
    assert [s.token_ids for s in after] == [s.token_ids for s in fresh]
    # a version set by hand (not through a load) does not match the entries either
    engine.version = 4
    engine.generate([p + s.token_ids for p, s in zip(nxt, after, strict=True)], greedy)
    assert engine.prefill_tokens_reused == 0


@pytest.mark.parametrize("share", [False, True])
def test_eviction_keeps_the_memory_bound_and_the_samples(share: bool) -> None:
    policy = tiny()
    per_token = 2 * 2 * 2 * 8 * 4  # layers x (k, v) x kv_heads x head_dim x float32 bytes
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    small = hf_engine(
        policy,
        STOPS,
        seed=7,
        max_batch=8,
        prefix_cache=True,
        prefix_cache_mb=200 * per_token / 2**20,
        prefix_sharing=share,
    )
    plain = hf_engine(policy, STOPS, seed=7, max_batch=8)
    _, a = multi_turn(small, 3, sp, seed=2)
    _, b = multi_turn(plain, 3, sp, seed=2)
    assert_same(a, b)
    cache = small.prefix_cache
    assert cache is not None
    assert cache.evictions > 0 and 0 < cache.bytes <= cache.max_bytes
    assert cache.bytes == sum(e.nbytes for e in cache.entries.values())
    assert 0 < small.prefill_tokens_reused < plain.prefill_tokens_computed


def test_lookup_rules() -> None:
    kv = lambda n: torch.zeros(1, 2, 1, n, 4)  # noqa: E731 - [layers, 2, heads, n, dim], 16 bytes per token
    cache = PrefixCache(max_bytes=16 * 2 * 10)
    cache.store([1, 2, 3], kv(3), version=0)
    cache.store([1, 2, 4, 5], kv(4), version=0)
    hit = cache.lookup([1, 2, 4, 9, 9], version=0)
    assert hit is not None and hit.key == (1, 2, 4, 5) and hit.length == 3  # longest common prefix
    hit = cache.lookup([1, 2, 3], version=0)
    assert hit is not None and hit.length == 2  # one token is always left to run
    assert cache.lookup([1, 2, 3, 4], version=1) is None  # other weights
    assert cache.lookup([7, 2, 3, 4], version=0) is None
    assert cache.lookup([1], version=0) is None
    cache.store([8, 8, 8, 8], kv(4), version=0)  # 11 tokens > 10: the least recently used goes
    assert list(cache.entries) == [(1, 2, 3), (8, 8, 8, 8)] and cache.evictions == 1
    cache.store(list(range(11)), kv(11), version=0)  # larger than the bound: not kept
    assert len(cache) == 2 and cache.bytes == 16 * 2 * 7
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0


def test_config_switch() -> None:
    on = make_engine(HFEngineConfig(), tiny(), stop_token_ids=[2], seed=0)
    assert isinstance(on, HFEngine) and on.prefix_cache is not None and on.prefix_sharing
    assert on.prefix_cache.max_bytes == 1024 * 2**20
    off = make_engine(
        HFEngineConfig(prefix_cache=False, prefix_sharing=False), tiny(), stop_token_ids=[2], seed=0
    )
    assert isinstance(off, HFEngine) and off.prefix_cache is None and not off.prefix_sharing
    prompts = random_prompts(4, 2, 10, seed=3)
    out = off.generate(prompts, SamplingParams(max_new_tokens=4))
    off.generate(
        [p + s.token_ids for p, s in zip(prompts, out, strict=True)], SamplingParams(max_new_tokens=4)
    )
    assert (
        off.prefill_tokens_reused == 0 and off.prefill_tokens_shared == 0 and off.prefill_tokens_computed > 0
    )


# ---- shared-prefix prefill: each distinct prefix of a chunk computed once ------------------------------
def grpo_prompts(tasks: int, group: int, seed: int, system: int = 20) -> list[list[int]]:
    """A GRPO batch: ``tasks`` prompts (one system prompt, then the task) ``group`` times each, plus a
    prompt that is a strict prefix of the first task's and one that shares nothing."""
    sys_prompt = random_prompts(1, system, system, seed=seed)[0]
    task_prompts = [sys_prompt + t for t in random_prompts(tasks, 2, 9, seed=seed + 1)]
    prompts = [p for p in task_prompts for _ in range(group)]
    return [*prompts, task_prompts[0][:-1], [7] + random_prompts(1, 5, 5, seed=seed + 2)[0]]


def distinct_prefix_tokens(prompts: list[list[int]]) -> int:
    return len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})


@pytest.mark.parametrize(
    ("family", "attn", "temperature", "static"),
    [
        ("qwen2", "sdpa", 1.0, False),
        ("llama", "eager", 0.5, False),
        ("qwen2", "sdpa", 0.7, True),
        ("llama", "sdpa", 0.5, True),
    ],
)
def test_sharing_gives_the_samples_of_unshared_generation(
    family: str, attn: str, temperature: float, static: bool
) -> None:
    policy = tiny(family, peaky=PEAKY, attn=attn)
    prompts = grpo_prompts(tasks=3, group=4, seed=0)
    sp = SamplingParams(temperature=temperature, max_new_tokens=12)

    def engine(share: bool) -> HFEngine:
        return hf_engine(policy, STOPS, seed=5, max_batch=16, static_cache=static, prefix_sharing=share)

    shared, plain = engine(True), engine(False)
    a, b = shared.generate(prompts, sp), plain.generate(prompts, sp)
    assert_same([a], [b])
    assert shared.static_chunks == plain.static_chunks == int(static)
    # every distinct prefix token ran through the model once; the rest came from other rows
    total = sum(map(len, prompts))
    assert shared.prefill_tokens_computed == distinct_prefix_tokens(prompts) < total // 3
    assert shared.prefill_tokens_shared == total - shared.prefill_tokens_computed
    assert plain.prefill_tokens_computed == total and plain.prefill_tokens_shared == 0
    # the group members sampled different continuations from the shared KV
    assert len({tuple(s.token_ids) for s in a[:4]}) > 1
    assert_at_noise_floor(logprob_error(policy, prompts, a, [temperature] * len(a)), "sharing")


@pytest.mark.parametrize("static", [False, True])
def test_sharing_and_the_prefix_cache_across_turns(static: bool) -> None:
    """Turn 2 of GRPO episodes: the cache holds each member's turn 1, the chunk shares the rest."""
    policy = tiny(peaky=2.0)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10)

    def engine(cache: bool, share: bool) -> HFEngine:
        return hf_engine(
            policy, STOPS, seed=2, max_batch=32, static_cache=static, prefix_cache=cache, prefix_sharing=share
        )

    both, cache_only, plain = engine(True, True), engine(True, False), engine(False, False)
    outs = []
    for e in (both, cache_only, plain):
        prompts = grpo_prompts(tasks=2, group=3, seed=4)
        turns = [e.generate(prompts, sp)]
        nxt = [p + s.token_ids + [21, 22] for p, s in zip(prompts, turns[0], strict=True)]
        nxt += grpo_prompts(tasks=2, group=2, seed=9)  # new episodes join: fresh rows sharing a system prompt
        turns.append(e.generate(nxt, sp))
        outs.append(turns)
    assert_same(outs[0], outs[2])
    assert_same(outs[1], outs[2])
    assert both.prefill_tokens_reused == cache_only.prefill_tokens_reused > 0
    assert both.prefill_tokens_shared > 0 and cache_only.prefill_tokens_shared == 0
    assert both.prefill_tokens_computed < cache_only.prefill_tokens_computed < plain.prefill_tokens_computed
    for e in (both, cache_only):
        assert e.prefill_tokens_computed + e.prefill_tokens_reused + e.prefill_tokens_shared == (
            plain.prefill_tokens_computed
        )


def test_plan_computes_each_distinct_prefix_once() -> None:
    system = [5, 6, 7, 8]
    prompts = [[*system, 1, 2, 3], [*system, 1, 2, 3], [*system, 4], [*system, 1, 2], [9, 9]]
    plan = plan_prefill(prompts, [0] * 5, share=True)
    assert plan.computed_tokens == distinct_prefix_tokens(prompts) == 4 + 3 + 1 + 2
    # levels: the system prompt (and the unrelated prompt), then [1, 2] and [4], then [3] after the end at 2
    assert [[plan.spans[s].tokens for s in level] for level in plan.levels] == [
        [system, [9, 9]],
        [[1, 2], [4]],
        [[3]],
    ]
    assert plan.row_leaf[0] == plan.row_leaf[1]  # the group shares its last token and its logits
    for p, leaf in zip(prompts, plan.row_leaf, strict=True):
        pieces = plan.pieces(leaf)
        assert sum(x.length for x in pieces) == len(p) and pieces[0].column == 0
    assert plan_prefill(prompts, [0] * 5, share=False).computed_tokens == sum(map(len, prompts))
    # a cache hit of prompt 0 covers the whole system prompt and [1, 2] — but prompt 3 ends at 2, so
    # that node is computed (its logits are needed), and [3] after it waits for it
    hit = plan_prefill(prompts, [6, 0, 0, 0, 0], share=True)
    assert [plan_node == CACHED for plan_node in hit.node_span[:6]] == [True] * 5 + [False]
    assert hit.computed_tokens == 1 + 1 + 1 + 2 and hit.reused_tokens == 5 + 5 + 4 + 5
    assert [x.source for x in hit.pieces(hit.row_leaf[0])] == [("entry", 0), ("span", 0), ("span", 1)]


def test_static_path_fits_cached_rows_beside_fresh_ones() -> None:
    """A cached row beside a fresh one of the same length: the level is twice as wide as either
    prompt, but the static cache holds the rows' own layout (the longest prompt) and decodes them."""
    policy = tiny(max_context=64)
    greedy = SamplingParams(temperature=1e-4, max_new_tokens=5)
    engines = [
        hf_engine(policy, [], max_batch=8, static_cache=static, prefix_cache=True, prefix_cache_mb=8)
        for static in (True, False)
    ]
    outs = []
    for engine in engines:
        engine.cache_len = 60  # what max_context + slack would be for a smaller slack
        first = engine.generate([[11] * 30], greedy)[0]
        second = [[11] * 30 + first.token_ids + [12], [13] * 36]
        outs.append(engine.generate(second, SamplingParams(temperature=1e-4, max_new_tokens=20)))
    assert engines[0].static_chunks == 2 and engines[0].prefill_tokens_reused == 34
    assert_same([outs[0]], [outs[1]])
