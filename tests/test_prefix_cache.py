"""Multi-turn KV reuse in the built-in engine: the prefix cache changes the cost, never the samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from asyncrl.config import HFEngineConfig, ModelConfig
from asyncrl.engine import HFEngine, Sample, make_engine, read_weights
from asyncrl.engine.prefix_cache import PrefixCache
from asyncrl.policy import Policy
from asyncrl.records import SamplingParams
from test_engine import TINY, random_prompts, recomputed, tiny

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
        ("llama", "sdpa", 1e-4, 1.0),
        ("llama", "eager", 1.0, 0.25),
    ],
)
def test_reuse_gives_the_samples_of_a_full_prefill(
    family: str, attn: str, temperature: float, compact: float
) -> None:
    policy = Policy.build(ModelConfig(family=family, **TINY), attn_implementation=attn)  # type: ignore[arg-type,unused-ignore]
    sp = SamplingParams(temperature=temperature, max_new_tokens=16)
    cached = HFEngine(
        policy, STOPS, seed=3, max_batch=8, compact_fraction=compact, prefix_cache_mb=64, cuda_graphs=False
    )
    plain = HFEngine(policy, STOPS, seed=3, max_batch=8, compact_fraction=compact, cuda_graphs=False)
    prompts, with_reuse = multi_turn(cached, 3, sp)
    _, without = multi_turn(plain, 3, sp)
    assert_same(with_reuse, without)
    # reuse happened, and the last turn mixed cached rows with fresh ones of other lengths
    assert cached.prefill_tokens_reused > cached.prefill_tokens_computed
    assert cached.prefill_tokens_reused + cached.prefill_tokens_computed == plain.prefill_tokens_computed
    assert plain.prefill_tokens_reused == 0
    if temperature > 0.01:
        assert {s.finish_reason for s in with_reuse[-1]} == {"stop", "length"}
    # the behaviour log-probs are still the trainer's
    last = with_reuse[-1]
    ref = recomputed(policy, prompts, last, [temperature] * len(last))
    delta = torch.cat([(r - torch.tensor(s.logprobs)).abs() for r, s in zip(ref, last, strict=True)])
    assert delta.mean() < 1e-4 and delta.max() < 1e-3


def test_stored_kv_equals_a_fresh_forward_pass() -> None:
    """Every entry (rows compacted away mid-decode and rows left at the end) holds its ids' own KV."""
    policy = tiny(peaky=2.0)
    engine = HFEngine(
        policy, STOPS, seed=1, max_batch=16, compact_fraction=0.0, prefix_cache_mb=64, cuda_graphs=False
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


def test_weight_load_drops_the_cache(tmp_path: Path) -> None:
    greedy = SamplingParams(temperature=1e-4, max_new_tokens=10)
    engine = HFEngine(tiny(seed=0), STOPS, seed=0, prefix_cache_mb=64, max_batch=64, cuda_graphs=False)
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
    fresh = HFEngine(other, STOPS, seed=0, max_batch=64, cuda_graphs=False).generate(nxt, greedy)
    assert [s.token_ids for s in after] == [s.token_ids for s in fresh]
    # a version set by hand (not through a load) does not match the entries either
    engine.version = 4
    engine.generate([p + s.token_ids for p, s in zip(nxt, after, strict=True)], greedy)
    assert engine.prefill_tokens_reused == 0


def test_eviction_keeps_the_memory_bound_and_the_samples() -> None:
    policy = tiny()
    per_token = 2 * 2 * 2 * 8 * 4  # layers x (k, v) x kv_heads x head_dim x float32 bytes
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    small = HFEngine(
        policy, STOPS, seed=7, max_batch=8, prefix_cache_mb=200 * per_token / 2**20, cuda_graphs=False
    )
    plain = HFEngine(policy, STOPS, seed=7, max_batch=8, cuda_graphs=False)
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


def test_config_switch_and_static_path() -> None:
    on = make_engine(HFEngineConfig(), tiny(), stop_token_ids=[2], seed=0)
    assert isinstance(on, HFEngine) and on.prefix_cache is not None
    assert on.prefix_cache.max_bytes == 1024 * 2**20
    off = make_engine(HFEngineConfig(prefix_cache=False), tiny(), stop_token_ids=[2], seed=0)
    assert isinstance(off, HFEngine) and off.prefix_cache is None
    static = make_engine(HFEngineConfig(static_cache="on"), tiny(), stop_token_ids=[2], seed=0)
    assert isinstance(static, HFEngine) and static.prefix_cache is None  # the static path refills per chunk
    prompts = random_prompts(4, 2, 10, seed=3)
    for engine in (off, static):
        out = engine.generate(prompts, SamplingParams(max_new_tokens=4))
        engine.generate(
            [p + s.token_ids for p, s in zip(prompts, out, strict=True)], SamplingParams(max_new_tokens=4)
        )
        assert engine.prefill_tokens_reused == 0 and engine.prefill_tokens_computed > 0
