"""The HF generation engine: behaviour log-probs agree with the trainer's, sampling is correct."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import HFEngineConfig, ModelConfig
from asyncrl.engine import GenerationEngine, HFEngine, Sample, make_engine, read_weights
from asyncrl.policy import Policy, token_logprobs
from asyncrl.records import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64}


def tiny(family: str = "qwen2", seed: int = 0, peaky: float = 0.0, attn: str = "sdpa", **kw: int) -> Policy:
    """A tiny policy; ``peaky`` scales the (tied) embeddings so next-token distributions are far from uniform."""
    cfg = ModelConfig(family=family, seed=seed, **{**TINY, **kw})  # type: ignore[arg-type,unused-ignore]
    policy = Policy.build(cfg, attn_implementation=attn)
    if peaky:
        with torch.no_grad():
            weight = policy.model.get_input_embeddings().weight
            assert isinstance(weight, torch.Tensor)
            weight.mul_(peaky)
    return policy


PEAKY = 4.0
"""Embedding scale of the log-prob agreement tests' models: next-token distributions far from uniform
(mean sampled log-prob about -3.9 against -4.6 unscaled), so that a position or cache bug moves them
(a decode-position shift by one: max |Δ| about 1e-3, mean 6e-5, 100x the tolerance below)."""
LOGPROB_FLOOR_MAX = 1.2e-6
"""The float32 noise floor of engine vs trainer log-probs on the CPU: the largest ``|Δ|`` per sampled
token, 4.8e-7 to 1.19e-6 (mean ``|Δ|`` 1.3e-7 to 1.8e-7) over qwen2 / llama, growing / static cache,
prefix sharing on / off, temperature 0.7 / 1.0, 24 prompts x 24 tokens, prefix cache off, one thread.
Measured with ``pytest tests/test_engine.py -k agree_with_trainer -s`` (it prints each case)."""
LOGPROB_FLOOR_MEAN = 1.8e-7
"""The float32 noise floor of the mean ``|Δ|`` (same measurement as :data:`LOGPROB_FLOOR_MAX`)."""
LOGPROB_TOL_MAX = 1e-5
"""Tolerance on the largest ``|Δ|``: about 8x :data:`LOGPROB_FLOOR_MAX`."""
LOGPROB_TOL_MEAN = 1e-6
"""Tolerance on the mean ``|Δ|``: about 5x :data:`LOGPROB_FLOOR_MEAN`."""


def random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(10, 100, (length,), generator=g).tolist() for length in lengths]


def right_padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def recomputed(
    policy: Policy, prompts: list[list[int]], samples: list[Sample], temps: list[float]
) -> list[torch.Tensor]:
    """The trainer's view: token_logprobs on right-padded prompt+sample, sliced to the sample."""
    ids, mask = right_padded([p + s.token_ids for p, s in zip(prompts, samples, strict=True)])
    with torch.no_grad():
        lp = token_logprobs(policy.model, ids, mask, torch.tensor(temps))
    return [
        lp[i, len(p) : len(p) + len(s.token_ids)]
        for i, (p, s) in enumerate(zip(prompts, samples, strict=True))
    ]


def logprob_error(
    policy: Policy, prompts: list[list[int]], samples: list[Sample], temps: list[float]
) -> torch.Tensor:
    """``|engine − trainer|`` of every sampled token's behaviour log-prob (top_p = 1)."""
    ref = recomputed(policy, prompts, samples, temps)
    return torch.cat([(r - torch.tensor(s.logprobs)).abs() for r, s in zip(ref, samples, strict=True)])


def assert_at_noise_floor(delta: torch.Tensor, what: str = "") -> None:
    """Engine and trainer agree to float32 rounding (:data:`LOGPROB_TOL_MAX`, :data:`LOGPROB_TOL_MEAN`)."""
    print(f"{what}: {delta.numel()} tokens, mean |dlogp| {delta.mean():.2e}, max {delta.max():.2e}")
    assert delta.numel() > 0
    assert float(delta.max()) < LOGPROB_TOL_MAX, (what, float(delta.max()))
    assert float(delta.mean()) < LOGPROB_TOL_MEAN, (what, float(delta.mean()))


def hf_engine(policy: Policy, stops: list[int], *, seed: int = 0, **kw: Any) -> HFEngine:
    """The built-in engine as these tests build it: seed 0, no CUDA graphs, the prefix cache and prefix
    sharing off, each overridable (``kw``: :class:`HFEngineConfig` fields)."""
    off = {"cuda_graphs": False, "prefix_cache": False, "prefix_sharing": False}
    return HFEngine(policy, HFEngineConfig(**(off | kw)), stops, seed=seed)


def uncached_engine(policy: Policy, **kw: Any) -> HFEngine:
    """:func:`hf_engine` (the prefix cache OFF) with stop tokens 2, 50, 60, so that every prefill and decode
    step is computed in this call: a position or cache bug cannot hide behind a cache hit."""
    return hf_engine(policy, kw.pop("stops", [2, 50, 60]), **kw)


def greedy_reference(policy: Policy, prompt: list[int], n: int) -> list[int]:
    """Unbatched, uncached argmax decoding."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(policy.model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


# ---- the key property ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "temperature", "compact", "attn", "static", "share"),
    [
        ("qwen2", 1.0, 0.25, "sdpa", False, False),
        ("qwen2", 0.7, 0.0, "sdpa", False, True),
        ("llama", 1.0, 1.0, "sdpa", False, True),
        ("llama", 0.7, 0.25, "sdpa", False, False),
        ("qwen2", 0.7, 0.25, "eager", False, False),
        ("qwen2", 0.7, 0.25, "sdpa", True, False),
        ("llama", 1.0, 0.25, "sdpa", True, True),
        ("qwen2", 1.0, 0.25, "eager", True, False),
    ],
)
def test_logprobs_agree_with_trainer(
    family: str, temperature: float, compact: float, attn: str, static: bool, share: bool
) -> None:
    """Behaviour log-probs equal the trainer's to the float32 noise floor, prefix cache off: a decode or
    prefill position shifted by one, a KV entry in the wrong slot, a temperature not applied or a
    prompt token lost each moves them 100x past the tolerance."""
    policy = tiny(family, peaky=PEAKY, attn=attn)
    prompts = random_prompts(24 if not static else 21, 2, 40, seed=1)  # static: 21 rows in a 32-row bucket
    assert len({len(p) for p in prompts}) > 10
    engine = uncached_engine(
        policy,
        seed=0,
        max_batch=16 if not static else 32,
        compact_fraction=compact,
        static_cache=static,
        prefix_sharing=share,
    )
    samples = engine.generate(prompts, SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=24))
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    assert engine.static_chunks == int(static) and engine.prefill_tokens_reused == 0
    delta = logprob_error(policy, prompts, samples, [temperature] * len(prompts))
    assert_at_noise_floor(delta, f"{family}/{attn} T={temperature} static={static} share={share}")


def test_default_engine_config_logprobs_agree_with_trainer() -> None:
    """The engine as ``make_engine`` builds it by default (prefix cache and sharing on)."""
    policy = tiny("llama", peaky=PEAKY)
    engine = make_engine(HFEngineConfig(max_batch=16), policy, stop_token_ids=[2, 50, 60], seed=0)
    assert isinstance(engine, HFEngine) and engine.prefix_cache is not None
    prompts = random_prompts(24, 2, 40, seed=1)
    samples = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=24))
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [0.7] * len(prompts)), "default config")


def test_static_cache_greedy_equals_growing_cache_and_reuses_buffers() -> None:
    policy = tiny(peaky=4.0)
    prompts = random_prompts(13, 1, 30, seed=6)
    greedy = SamplingParams(temperature=1e-4, max_new_tokens=12)
    params = [SamplingParams(temperature=1e-4, max_new_tokens=n) for n in range(1, 14)]
    growing = hf_engine(policy, [40, 41], max_batch=16, static_cache=False)
    static = hf_engine(policy, [40, 41], max_batch=16, static_cache=True)

    def same(a: list[Sample], b: list[Sample]) -> bool:
        return all(
            x.token_ids == y.token_ids
            and x.finish_reason == y.finish_reason
            and max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) < 1e-5
            for x, y in zip(a, b, strict=True)
        )

    for _ in range(2):  # the second call reuses the bucket's cache and buffers: nothing stale may leak
        assert same(static.generate(prompts, greedy), growing.generate(prompts, greedy))
        assert same(static.generate(prompts, params), growing.generate(prompts, params))
    assert sorted(static._decoders) == [16] and static.static_chunks == 4
    for p, s in zip(prompts, static.generate(prompts, greedy), strict=True):
        ref = greedy_reference(policy, p, 12)
        assert s.token_ids == ref[: len(s.token_ids)]
    assert static.decode_steps > 0 and static.decode_seconds > 0


def test_static_cache_falls_back_when_a_chunk_would_overflow_it() -> None:
    """A long prompt batched with short ones that may sample far: the growing cache takes the chunk."""
    policy = tiny(max_context=64)
    engine = hf_engine(policy, [], max_batch=8, static_cache=True)
    engine.cache_len = 70  # what max_context + slack would be for a smaller slack
    out = engine.generate([[11] * 60, [12] * 4], SamplingParams(max_new_tokens=40))
    assert [len(s.token_ids) for s in out] == [4, 40]
    assert engine.static_chunks == 0
    engine.generate([[11] * 30, [12] * 28], SamplingParams(max_new_tokens=20))
    assert engine.static_chunks == 1


def test_engine_device_settings() -> None:
    """static_cache auto is off on the CPU; CUDA graphs are never attempted without CUDA."""
    engine = make_engine(HFEngineConfig(), tiny(), stop_token_ids=[2], seed=0)
    assert isinstance(engine, HFEngine)
    assert not engine.static_cache and not engine.cuda_graphs
    forced = make_engine(
        HFEngineConfig(static_cache="on", cuda_graphs=True), tiny(), stop_token_ids=[2], seed=0
    )
    assert isinstance(forced, HFEngine) and forced.static_cache and not forced.cuda_graphs


def test_logprobs_agree_with_per_prompt_temperature() -> None:
    policy = tiny(peaky=PEAKY)
    prompts = random_prompts(16, 1, 30, seed=2)
    temps = [0.5 + 0.05 * i for i in range(16)]
    params = [SamplingParams(temperature=t, max_new_tokens=16) for t in temps]
    samples = uncached_engine(policy, stops=[2], seed=3, max_batch=64).generate(prompts, params)
    assert_at_noise_floor(logprob_error(policy, prompts, samples, temps), "per-prompt temperature")


def test_top_p_logprobs_are_of_the_renormalised_nucleus() -> None:
    """With top_p < 1 the recorded log-prob exceeds the tempered one by -log(nucleus mass) >= 0."""
    policy = tiny(peaky=8.0)
    prompts = random_prompts(16, 3, 20, seed=4)
    samples = hf_engine(policy, [], seed=5).generate(
        prompts, SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=8)
    )
    ref = recomputed(policy, prompts, samples, [1.0] * len(prompts))
    gap = torch.cat([torch.tensor(s.logprobs) - r for r, s in zip(ref, samples, strict=True)])
    assert (gap > -1e-5).all()
    assert (gap > 1e-3).any()
    assert all(lp <= 1e-6 for s in samples for lp in s.logprobs)


# ---- sampling correctness --------------------------------------------------------------------
def test_small_temperature_is_greedy_and_matches_unbatched_decoding() -> None:
    policy = tiny(peaky=4.0)
    prompts = random_prompts(8, 1, 25, seed=6)
    engine = hf_engine(policy, [], max_batch=8)
    samples = engine.generate(prompts, SamplingParams(temperature=1e-4, max_new_tokens=12))
    for p, s in zip(prompts, samples, strict=True):
        assert s.token_ids == greedy_reference(policy, p, 12)
        assert s.finish_reason == "length"
        assert max(abs(x) for x in s.logprobs) < 1e-4
    nucleus = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1e-9, max_new_tokens=12))
    assert [s.token_ids for s in nucleus] == [s.token_ids for s in samples]
    assert max(abs(x) for s in nucleus for x in s.logprobs) < 1e-5


def test_seeded_sampling_is_reproducible() -> None:
    policy = tiny()
    prompts = random_prompts(12, 2, 20, seed=7)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    a = hf_engine(policy, [2], seed=11).generate(prompts, sp)
    b = hf_engine(policy, [2], seed=11).generate(prompts, sp)
    assert a == b
    c = hf_engine(policy, [2], seed=12).generate(prompts, sp)
    assert [s.token_ids for s in a] != [s.token_ids for s in c]
    engine = hf_engine(policy, [2], seed=11)
    first, second = engine.generate(prompts, sp), engine.generate(prompts, sp)
    assert first == a and second != first  # the generator advances across calls


def test_stop_tokens_end_samples() -> None:
    policy = tiny()
    stops = list(range(40, 56))
    samples = hf_engine(policy, stops, seed=1).generate(
        random_prompts(32, 1, 20, seed=8), SamplingParams(max_new_tokens=30)
    )
    reasons = [s.finish_reason for s in samples]
    assert "stop" in reasons
    for s in samples:
        assert len(s.token_ids) == len(s.logprobs) >= 1
        assert not set(s.token_ids[:-1]) & set(stops)
        if s.finish_reason == "stop":
            assert s.token_ids[-1] in stops
        else:
            assert len(s.token_ids) == 30 and s.token_ids[-1] not in stops


def test_max_new_tokens_per_prompt() -> None:
    policy = tiny()
    prompts = random_prompts(8, 1, 12, seed=9)
    params = [SamplingParams(max_new_tokens=n) for n in range(1, 9)]
    samples = hf_engine(policy, [], seed=2).generate(prompts, params)
    assert [len(s.token_ids) for s in samples] == list(range(1, 9))
    assert all(s.finish_reason == "length" for s in samples)


def test_context_limit() -> None:
    policy = tiny(max_context=16)
    engine = hf_engine(policy, [])
    with pytest.raises(ValueError, match=r"prompt 1 has 17 tokens, longer than the model's context of 16"):
        engine.generate([[11, 12], [11] * 17], SamplingParams())
    full, near = engine.generate([[11] * 16, [12] * 13], SamplingParams(max_new_tokens=10))
    assert full == Sample([], [], "length")
    assert len(near.token_ids) == 3 and near.finish_reason == "length"


def test_invalid_requests() -> None:
    engine = hf_engine(tiny(), [2])
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[10, 5000]], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([[10]], SamplingParams(temperature=0.0))
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[10]], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        engine.generate([[10]], [SamplingParams(), SamplingParams()])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        hf_engine(tiny(), [9999])
    assert engine.generate([], SamplingParams()) == []


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over bins with expected count >= 5 (the rest pooled) and its dof."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return stat, int(keep.sum()) - 1


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.6, 1.0), (1.0, 0.8)])
def test_first_token_frequencies_match_distribution(temperature: float, top_p: float) -> None:
    policy = tiny(peaky=4.0)
    prompt = [1, 20, 30, 40]
    n = 6000
    engine = hf_engine(policy, [], seed=13, max_batch=n // 2)  # two chunks: the config bounds max_batch
    samples = engine.generate(
        [prompt] * n, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=1)
    )
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(logits / temperature, -1)
    if top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep_sorted = (sorted_p.cumsum(0) - sorted_p) < top_p
        keep = torch.zeros_like(keep_sorted).scatter_(0, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    assert 0.05 < float(probs.max()) < 0.95, "the test needs a non-trivial distribution"
    tokens = torch.tensor([s.token_ids[0] for s in samples])
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, "sampled outside the nucleus"
    stat, dof = _chi_square(counts, probs.double())
    assert stat < dof + 6 * math.sqrt(2 * dof), (stat, dof)
    # every recorded log-prob is that of the sampled token under the sampled-from distribution
    for s in samples[:50]:
        assert abs(s.logprobs[0] - math.log(float(probs[s.token_ids[0]]))) < 1e-4


# ---- weights -----------------------------------------------------------------------------------
def test_draw_follows_the_weights_and_never_draws_a_zero() -> None:
    """Inverse transform sampling (the engine's sampler): frequencies match, weight 0 never drawn."""
    from asyncrl.engine.decode import draw

    weights = torch.tensor([[0.0, 1.0, 3.0, 0.0, 4.0], [2.0, 0.0, 0.0, 0.0, 0.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    idx = draw(weights, g).view(2000, 2)
    assert (idx[:, 1] == 0).all()
    counts = torch.bincount(idx[:, 0], minlength=5).double()
    assert counts[0] == counts[3] == 0
    stat, dof = _chi_square(counts[[1, 2, 4]], torch.tensor([1.0, 3.0, 4.0]) / 8)
    assert stat < dof + 4 * math.sqrt(2 * dof)
    # a total that rounds onto the last (zero) weight falls back to the likeliest index
    edge = torch.tensor([[1.0, 0.0]])
    assert all(int(draw(edge, g)) == 0 for _ in range(50))


def test_load_weights_changes_outputs_and_version(tmp_path: Path) -> None:
    prompts = random_prompts(6, 2, 12, seed=14)
    greedy = SamplingParams(temperature=1e-4, max_new_tokens=10)
    engine: GenerationEngine = hf_engine(tiny(seed=0), [])
    assert engine.version == 0
    before = [s.token_ids for s in engine.generate(prompts, greedy)]
    other = tiny(seed=1)
    other.save(tmp_path / "v3")
    engine.load_weights(3, read_weights(tmp_path / "v3"))
    assert engine.version == 3
    after = [s.token_ids for s in engine.generate(prompts, greedy)]
    assert after != before
    assert after == [s.token_ids for s in hf_engine(other, []).generate(prompts, greedy)]
    engine.load_weights(4, tiny(seed=0).state_dict_tensors())
    assert engine.version == 4
    assert [s.token_ids for s in engine.generate(prompts, greedy)] == before
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        engine.load_weights(5, read_weights(tmp_path / "missing"))
    assert engine.version == 4


@pytest.mark.parametrize("static", [False, True])
def test_the_canary_probe_runs_the_generation_path(static: bool) -> None:
    """``probe``: the trainer's log-probs (noise floor), the second half through prefill + decode steps."""
    from asyncrl.policy.canary import probe_logprobs

    policy = tiny("llama", peaky=PEAKY)
    engine = hf_engine(
        policy,
        [2],
        max_batch=8,
        static_cache=static,
        prefix_cache=True,
        prefix_cache_mb=8,
        prefix_sharing=True,
    )
    ids = random_prompts(1, 32, 32, seed=3)[0] + [2]  # a stop token inside: fed, not a stop
    got, want = engine.probe(ids), probe_logprobs(policy.model, ids)
    assert len(got) == len(want) == 32
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < LOGPROB_TOL_MAX
    assert engine.decode_steps == 33 - 16 - 1 and engine.static_chunks == int(static)
    assert (
        engine.prefill_tokens_computed == 16 and engine.prefill_tokens_shared == 16
    )  # two rows, one prefill
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 1  # its KV kept, as for any call
    assert engine.probe(ids) == pytest.approx(got, abs=LOGPROB_TOL_MAX) and engine.prefill_tokens_reused == 30


def test_generate_leaves_train_mode_and_grads_alone() -> None:
    policy = tiny()
    policy.model.train()
    hf_engine(policy, [2]).generate([[10, 11]], SamplingParams(max_new_tokens=4))
    assert policy.model.training
    assert all(p.grad is None for p in policy.model.parameters())


# ---- LoRA: the merged copy (rollout.engine.merge_lora) ----------------------------------------
def tiny_lora(family: str = "qwen2", adapter_seed: int = 0, scale: float = 0.1, **kw: Any) -> Policy:
    """:func:`tiny` with LoRA (rank 4, alpha 8, every linear layer) and a random non-zero adapter
    (``B`` too: a fresh adapter, ``B = 0``, would be the base model exactly)."""
    from asyncrl.config import LoraConfig
    from asyncrl.policy.lora import apply_lora

    policy = tiny(family, peaky=PEAKY, **kw)
    policy.model = apply_lora(policy.model, LoraConfig(rank=4, alpha=8))
    set_adapter(policy, adapter(policy, adapter_seed, scale))
    return policy


def adapter(policy: Policy, seed: int, scale: float) -> dict[str, torch.Tensor]:
    """A random adapter version for ``policy`` (entries ``N(0, scale²)``)."""
    g = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(t.shape, generator=g) * scale for name, t in policy.state_dict_tensors().items()
    }


def set_adapter(policy: Policy, tensors: dict[str, torch.Tensor]) -> None:
    policy.load_tensors(tensors)


@pytest.mark.parametrize(("family", "static"), [("qwen2", False), ("llama", True)])
def test_merged_lora_logprobs_agree_with_the_trainer_and_the_unmerged_engine(
    family: str, static: bool
) -> None:
    """The merged copy samples the LoRA policy: its behaviour log-probs equal the trainer's
    (``token_logprobs`` on the PEFT model) to the float32 noise floor, as the unmerged engine's do, and
    with the same seed both engines draw the same tokens."""
    prompts = random_prompts(21, 2, 40, seed=1)
    sp = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=24)
    out = {}
    for merge in (True, False):
        policy = tiny_lora(family)
        engine = uncached_engine(policy, max_batch=32, static_cache=static, merge_lora=merge)
        assert (engine.merged is not None) == merge and (engine.model is policy.model) != merge
        samples = engine.generate(prompts, sp)
        delta = logprob_error(policy, prompts, samples, [0.7] * len(prompts))
        assert_at_noise_floor(delta, f"LoRA {family} static={static} merged={merge}")
        out[merge] = samples
    assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
    gap = max(
        abs(a - b)
        for x, y in zip(out[True], out[False], strict=True)
        for a, b in zip(x.logprobs, y.logprobs, strict=True)
    )
    print(f"merged vs unmerged engine: max |dlogp| {gap:.2e}")
    assert gap < LOGPROB_TOL_MAX


def test_merged_copy_equals_peft_merge_and_shares_the_unadapted_tensors() -> None:
    """The fold is ``W + (alpha/r) B A`` (peft's own ``merge_and_unload`` gives the same weights); only
    the adapted weights are the copy's own, and the copy's adapter record is the loaded adapter."""
    from asyncrl.policy.lora import MergedCopy, merged_state_dict

    policy = tiny_lora()
    merged = MergedCopy(policy.model)
    want = merged_state_dict(policy.model)
    got = merged.model.state_dict()
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, atol=1e-6, rtol=0)
    peft_ptrs = {t.data_ptr() for t in policy.model.state_dict().values()}
    own = [n for n, t in got.items() if t.data_ptr() not in peft_ptrs]
    assert own and all(n.rsplit(".", 2)[-2].endswith("proj") for n in own), own
    assert len(own) == 2 * 7  # 2 layers x 7 adapted linear layers
    assert all(torch.equal(merged.adapter[k], v) for k, v in policy.state_dict_tensors().items())


def test_a_new_adapter_version_is_served_after_load_not_the_old_merged_copy() -> None:
    """Each load refolds the copy: the engine then samples the new adapter (noise floor against the
    trainer holding it), far from the previous one; a failed load leaves the copy equal to the policy."""
    from asyncrl.policy.lora import AdapterError

    engine_policy, trainer = tiny_lora(adapter_seed=0), tiny_lora(adapter_seed=0)
    engine = uncached_engine(engine_policy, max_batch=16)
    assert engine.merged is not None
    prompts = random_prompts(12, 2, 30, seed=5)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16)
    for version, seed in ((1, 1), (2, 2)):
        new = adapter(trainer, seed, 0.1)
        old_trainer = tiny_lora(adapter_seed=0 if version == 1 else 1)
        set_adapter(trainer, new)
        engine.load_weights(version, new)
        assert engine.version == version and engine.merge_seconds > 0
        samples = engine.generate(prompts, sp)
        assert_at_noise_floor(logprob_error(trainer, prompts, samples, [1.0] * len(prompts)), f"v{version}")
        stale = logprob_error(old_trainer, prompts, samples, [1.0] * len(prompts))
        assert float(stale.mean()) > 100 * LOGPROB_TOL_MEAN  # the previous version is not what is served
    with pytest.raises(AdapterError):
        engine.load_weights(3, {"x.lora_A.default.weight": torch.zeros(1)})
    assert engine.version == 2
    samples = engine.generate(prompts, sp)
    assert_at_noise_floor(
        logprob_error(trainer, prompts, samples, [1.0] * len(prompts)), "after a failed load"
    )


def test_merge_lora_is_ignored_without_lora_and_off_samples_through_the_adapter() -> None:
    plain = tiny()
    assert hf_engine(plain, [2], max_batch=4).merged is None
    lora = tiny_lora()
    engine = make_engine(HFEngineConfig(merge_lora=False), lora, stop_token_ids=[2], seed=0)
    assert isinstance(engine, HFEngine) and engine.merged is None and engine.model is lora.model
    engine = make_engine(HFEngineConfig(), lora, stop_token_ids=[2], seed=0)
    assert isinstance(engine, HFEngine) and engine.merged is not None


# ---- throughput (printed, not asserted) -------------------------------------------------------
def test_throughput_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    policy = Policy.build(ModelConfig())
    engine = make_engine(HFEngineConfig(), policy, stop_token_ids=[], seed=0)
    prompts = random_prompts(64, 8, 40, seed=15)
    sp = SamplingParams(temperature=1.0, max_new_tokens=48)
    engine.generate(prompts, sp)  # warm-up
    t0 = time.perf_counter()
    tokens = sum(len(s.token_ids) for _ in range(2) for s in engine.generate(prompts, sp))
    dt = time.perf_counter() - t0
    assert tokens == 2 * 64 * 48
    with capsys.disabled():
        print(
            f"\n[throughput] HFEngine, default ModelConfig, 64 prompts x 48 new tokens: {tokens / dt:,.0f} tokens/s"
        )


# ---- CPU: prepacked linear layers (rollout.engine.packed_linear) -----------------------------------
@pytest.mark.parametrize(("family", "static"), [("qwen2", False), ("llama", True)])
def test_packed_linear_logprobs_agree_with_the_trainer_and_follow_each_load(
    family: str, static: bool
) -> None:
    """The merged copy's linear layers packed by oneDNN: behaviour log-probs at the trainer's noise floor,
    the unpacked engine's tokens with the same seed, and a new adapter version served after a load (the
    packed weights are refolded with the copy); the policy's own layers are not touched."""
    from asyncrl.engine.cpu.packed import PackedForward, PackedLinear

    needs_onednn()
    prompts = random_prompts(17, 2, 40, seed=3)
    sp = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=20)
    out = {}
    for packed in (False, True):  # the packed engine last: it takes the load below
        policy = tiny_lora(family)
        engine = uncached_engine(policy, max_batch=32, static_cache=static, packed_linear=packed)
        assert isinstance(engine.forward, PackedForward) == packed
        assert any(isinstance(m, PackedLinear) for m in engine.model.modules()) == packed
        assert not any(isinstance(m, PackedLinear) for m in policy.model.modules())
        out[packed] = engine.generate(prompts, sp)
        assert_at_noise_floor(logprob_error(policy, prompts, out[packed], [0.7] * 17), f"packed={packed}")
    assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
    engine.load_weights(1, adapter(policy, 7, 0.1))  # into the engine's policy, which then scores
    samples = engine.generate(prompts, sp)
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [0.7] * 17), "packed, after a load")


def test_a_load_repacks_what_it_changed() -> None:
    """The fused step's stacks decode, so their parts keep no packed copy (prefills compute them as plain
    ``linear``). An adapter version rebuilds only the folded layers' packed copies, not the LM head's (an
    adapter load cannot change it); base weights under their plain names (a checkpoint) rebuild every
    packed copy. After either, log-probs at the trainer's noise floor. Mutants this test kills: every load
    treated as adapter-only (the stale LM head after the base load), the stacks not repacked, the stacks'
    parts left packed, the LM head repacked at an adapter load."""
    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.policy.lora import base_model

    policy = tiny_lora("llama")
    engine = uncached_engine(policy, max_batch=32)
    fwd = engine.forward
    assert isinstance(fwd, FusedForward)
    parts = [p for stack in fwd.fused.stacks for p in stack.parts]
    assert len(parts) == 5 * len(fwd.fused.layers) and all(p.packed is None for p in parts)
    assert not {id(p) for p in parts} & {id(p) for p in fwd.packed}
    head, o_proj = engine.model.lm_head, engine.model.model.layers[0].self_attn.o_proj
    before = head.packed, o_proj.packed, fwd.fused.stacks[0].packed
    prompts = random_prompts(9, 2, 40, seed=5)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)
    engine.load_weights(1, adapter(policy, 7, 0.1))
    assert head.packed is before[0] and o_proj.packed is not before[1]
    assert fwd.fused.stacks[0].packed is not before[2]
    samples = engine.generate(prompts, sp)
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [1.0] * 9), "after an adapter load")
    g = torch.Generator().manual_seed(11)
    inner = base_model(policy.model)
    base = {  # every base weight moved: the LM head (tied to the embeddings) too
        k.replace(".base_layer.", "."): v + 0.05 * torch.randn(v.shape, generator=g)
        for k, v in inner.state_dict().items()
        if ".lora_" not in k and v.is_floating_point()
    }
    engine.load_weights(2, base)
    assert head.packed is not before[0]
    samples = engine.generate(prompts, sp)
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [1.0] * 9), "after a base-weights load")


def test_packed_linear_is_ignored_without_a_merged_copy() -> None:
    from asyncrl.engine.cpu.packed import PackedForward
    from asyncrl.engine.forward import Forward

    assert type(hf_engine(tiny(), [2], max_batch=4, packed_linear=True).forward) is Forward
    engine = make_engine(HFEngineConfig(packed_linear=True), tiny_lora(), stop_token_ids=[2], seed=0)
    assert isinstance(engine, HFEngine)
    assert isinstance(engine.forward, PackedForward) or engine.device.type != "cpu"


# ---- CPU: the written-out decode step (rollout.engine.fused_decode) ---------------------------------
def needs_onednn() -> None:
    """Skip where this torch cannot pack linear weights (the CPU fast path needs oneDNN)."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        pytest.skip("this torch has no oneDNN linear packing")


def count_fused_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the rows of every :class:`FusedDecoder` step run from now on (skips without oneDNN packing)."""
    from asyncrl.engine.cpu import fused

    needs_onednn()
    steps: list[int] = []
    real = fused.FusedDecoder.forward

    def forward(self: fused.FusedDecoder, tokens: torch.Tensor, *a: Any) -> torch.Tensor:
        steps.append(int(tokens.shape[0]))
        return real(self, tokens, *a)

    monkeypatch.setattr(fused.FusedDecoder, "forward", forward)
    return steps


@pytest.mark.parametrize(("family", "compact", "attn"), [("llama", 0.25, "sdpa"), ("qwen2", 0.0, "eager")])
def test_fused_decode_step_agrees_with_the_trainer_and_follows_each_load(
    family: str, compact: float, attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written-out decode step (q/k/v and gate/up stacked into one packed matmul each, the rotary
    tables and the mask once per step, the KV written straight into the cache's buffers, grouped-query
    attention on stacked query heads): log-probs at the trainer's noise floor and the model's own
    forward's tokens with the same seed, over rows that stop at different steps and are compacted away;
    after a load, the new adapter's log-probs (the stacked weights are repacked with the rest). qwen2:
    random q/k/v biases (stacked too). Mutants this test kills: q and k stacked in the wrong order, gate and up swapped, the
    q/k/v biases stacked out of order, the query heads grouped across kv heads in the wrong order, the
    rotary embedding left off k, the mask dropped, the stacked weights not repacked at a load."""
    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.engine.cpu.packed import PackedForward

    steps = count_fused_steps(monkeypatch)
    prompts = random_prompts(17, 2, 40, seed=3)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=20)
    out = {}
    for fused in (False, True):  # the fused engine last: it takes the load below
        policy = tiny_lora(family, attn=attn)
        with torch.no_grad():  # qwen2's q/k/v biases: non-zero, and not alike (built as zeros)
            g = torch.Generator().manual_seed(9)
            for name, p in policy.model.named_parameters():
                if name.endswith(".bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        engine = uncached_engine(policy, max_batch=32, compact_fraction=compact, fused_decode=fused)
        assert isinstance(engine.forward, PackedForward)
        assert isinstance(engine.forward, FusedForward) == fused
        out[fused] = engine.generate(prompts, sp)
        assert_at_noise_floor(logprob_error(policy, prompts, out[fused], [1.0] * 17), f"fused={fused}")
        assert bool(steps) == fused
    assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
    assert {s.finish_reason for s in out[True]} == {"stop", "length"}
    assert len(set(steps)) > 1  # rows were compacted away mid-call
    engine.load_weights(1, adapter(policy, 7, 0.1))  # into the engine's policy, which then scores
    samples = engine.generate(prompts, sp)
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [1.0] * 17), "fused, after a load")


@pytest.mark.parametrize(("family", "attn"), [("llama", "sdpa"), ("qwen2", "eager")])
def test_fused_prefill_agrees_with_the_trainer_across_turns(
    family: str, attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefills through the written-out forward (``fused_prefill``): levels of spans of different lengths
    (a shared system prompt, GRPO groups, cached first turns extended by observations of different lengths,
    new episodes joining) give the model's own prefill's tokens with the same seed and log-probs at the
    trainer's noise floor; the matmuls run on the real tokens only. Mutants this test kills: a window's
    padding run in place of its real tokens, a row's logits taken at another token than its last, the
    causal mask dropped inside a window, the rotary embedding left off the new keys, the query heads
    grouped across kv heads in the wrong order, the cached columns hidden."""
    from asyncrl.engine.cpu import fused as fused_module
    from test_prefix_cache import grpo_prompts

    windows: list[tuple[int, int, int]] = []  # (rows, n, real tokens) of every fused prefill
    real_prefill = fused_module.FusedDecoder.prefill

    def prefill(self: fused_module.FusedDecoder, tokens: torch.Tensor, *a: Any) -> torch.Tensor:
        allowed = a[1]
        windows.append((tokens.shape[0], tokens.shape[1], int(allowed[:, -1, -tokens.shape[1] :].sum())))
        return real_prefill(self, tokens, *a)

    monkeypatch.setattr(fused_module.FusedDecoder, "prefill", prefill)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=10)
    out: dict[bool, list[list[Sample]]] = {}
    for fused in (False, True):
        policy = tiny_lora(family, attn=attn)
        engine = hf_engine(
            policy, [2, 50, 60], max_batch=32, prefix_cache=True, prefix_sharing=True, fused_prefill=fused
        )
        fwd, before = engine.forward, len(windows)
        assert isinstance(fwd, fused_module.FusedForward) and fwd.fused_prefill == fused
        first = grpo_prompts(tasks=3, group=3, seed=4, system=24)
        turns = [engine.generate(first, sp)]
        second = [
            p + s.token_ids + random_prompts(1, 1, 9, seed=i)[0]
            for i, (p, s) in enumerate(zip(first, turns[0], strict=True))
        ]
        second += grpo_prompts(tasks=2, group=2, seed=9, system=24)  # new episodes join
        turns.append(engine.generate(second, sp))
        out[fused] = turns
        for prompts, samples in zip((first, second), turns, strict=True):
            assert_at_noise_floor(
                logprob_error(policy, prompts, samples, [1.0] * len(prompts)), f"fused={fused}"
            )
        assert engine.prefill_tokens_reused > 0 and engine.prefill_tokens_shared > 0
        assert (len(windows) > before) == fused  # the switch picks the path the prefills take
    assert [[s.token_ids for s in t] for t in out[True]] == [[s.token_ids for s in t] for t in out[False]]
    assert windows and any(real < rows * n for rows, n, real in windows)  # windows with padding ran


def test_the_canary_probe_decodes_through_the_fused_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's teacher-forced decode steps run the fused step (what is served), at the trainer's
    log-probs; a stacked copy left stale by a load is seen by the probe."""
    from asyncrl.engine.cpu.fused import FusedForward, FusedLinear
    from asyncrl.policy.canary import probe_logprobs

    steps = count_fused_steps(monkeypatch)
    policy = tiny_lora("llama")
    engine = uncached_engine(policy, stops=[2], max_batch=8)
    assert isinstance(engine.forward, FusedForward)
    ids = random_prompts(1, 32, 32, seed=3)[0] + [2]
    got = engine.probe(ids)
    assert (
        max(abs(a - b) for a, b in zip(got, probe_logprobs(policy.model, ids), strict=True)) < LOGPROB_TOL_MAX
    )
    assert steps == [2] * 16  # two rows, 16 decode steps
    monkeypatch.setattr(FusedLinear, "repack", lambda self: None)  # a load that leaves the stacks stale
    engine.load_weights(1, adapter(policy, 7, 0.1))
    stale = engine.probe(ids)
    assert max(abs(a - b) for a, b in zip(stale, probe_logprobs(policy.model, ids), strict=True)) > 1e-3


def test_the_probe_rides_along_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate_probed``: the probe's two rows join the call's chunk, teacher-forced beside rows that
    sample, so its decode steps are the call's (none of its own); its log-probs are the probe's alone, to
    the noise floor; the call's samples are at the trainer's noise floor and stop as they do. With no room
    in the chunk (``max_batch``) the probe runs as a chunk of its own. Mutants this test kills: the riders
    run apart, a rider row sampled, a forced row stopping at a stop token (the tail holds one), a free
    row's stop ignored."""
    steps = count_fused_steps(monkeypatch)
    policy = tiny_lora("llama")
    engine = uncached_engine(policy, stops=[2], max_batch=7)
    ids = random_prompts(1, 32, 32, seed=3)[0]
    ids[24] = 2  # a stop token in the forced tail
    alone = engine.probe(ids)
    assert steps == [2] * 15
    prompts = random_prompts(5, 2, 30, seed=4)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=24)
    for rows in (5, 6):  # 5 + 2 rows fit max_batch 7: one chunk; 6 + 2 do not
        steps.clear()
        samples, got = engine.generate_probed(prompts[:rows] + prompts[:1] * (rows - 5), sp, ids)
        assert max(abs(a - b) for a, b in zip(got, alone, strict=True)) < LOGPROB_TOL_MAX
        if rows == 5:  # the riders' rows are in the call's first step, and it takes no more steps than 23
            assert steps[0] == 7 and len(steps) <= 23
        else:  # the call's chunk, then the probe's own: 15 steps of two rows
            assert steps[0] == 6 and steps[-15:] == [2] * 15
        assert len(samples) == rows and {s.finish_reason for s in samples} <= {"stop", "length"}
        assert_at_noise_floor(
            logprob_error(policy, prompts[:rows] + prompts[:1] * (rows - 5), samples, [1.0] * rows)
        )
    assert any(s.finish_reason == "stop" for s in samples)


def test_fused_decode_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not without packed linears (no merged copy, or ``packed_linear`` off); the static path and prefills
    never run it, growing-cache decode steps do."""
    from asyncrl.engine.cpu.fused import FusedForward

    steps = count_fused_steps(monkeypatch)
    assert not isinstance(hf_engine(tiny("llama"), [2]).forward, FusedForward)  # no LoRA: no merged copy
    assert not isinstance(hf_engine(tiny_lora("llama"), [2], packed_linear=False).forward, FusedForward)
    assert not isinstance(hf_engine(tiny_lora(), [2], fused_decode=False).forward, FusedForward)
    assert isinstance(hf_engine(tiny_lora(), [2]).forward, FusedForward)
    prompts = random_prompts(4, 2, 12, seed=2)
    sp = SamplingParams(max_new_tokens=6)
    for kw, runs in (({"static_cache": True}, False), ({}, True)):
        engine = hf_engine(tiny_lora("llama"), [], **kw)
        assert isinstance(engine.forward, FusedForward)
        engine.generate(prompts, sp)
        assert engine.decode_steps > 0 and bool(steps) == runs
        steps.clear()


@pytest.mark.parametrize(
    ("lib", "release", "on"),
    [("torch", "2.14.0", False), ("transformers", "5.24.0", False), ("torch", "2.13.0+cu128", True)],
)
def test_the_fast_path_is_off_under_a_release_it_was_not_written_for(
    lib: str, release: str, on: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a torch or transformers release other than :data:`~asyncrl.engine.cpu.WRITTEN_FOR` the engine
    runs the model's own forward (nothing packed, the fused step never runs), says why in one warning line,
    and samples at the trainer's noise floor; a local build of the same release (``+cu128``) keeps the fast
    path, with no line. Mutants this test kills: the gate not asked, transformers' release not checked, the
    local build tag compared, the line not logged."""
    import logging

    import transformers

    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.engine.cpu.packed import PackedLinear
    from asyncrl.engine.forward import Forward

    steps = count_fused_steps(monkeypatch)
    monkeypatch.setattr({"torch": torch, "transformers": transformers}[lib], "__version__", release)
    policy = tiny_lora("llama")
    with caplog.at_level(logging.INFO, logger="asyncrl.engine.cpu"):
        engine = uncached_engine(policy, max_batch=8)
    lines = [r for r in caplog.records if r.name == "asyncrl.engine.cpu"]
    assert isinstance(engine.forward, FusedForward) == on and (type(engine.forward) is Forward) != on
    assert any(isinstance(m, PackedLinear) for m in engine.model.modules()) == on
    want = [] if on else [(logging.WARNING, True)]
    assert [(r.levelno, f"{lib} {release} is not" in r.getMessage()) for r in lines] == want
    prompts = random_prompts(6, 2, 20, seed=3)
    samples = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=8))
    assert bool(steps) == on
    assert_at_noise_floor(logprob_error(policy, prompts, samples, [1.0] * 6), f"{lib} {release}")


def test_the_fast_path_is_written_for_the_pinned_releases() -> None:
    """:data:`~asyncrl.engine.cpu.WRITTEN_FOR` names pyproject.toml's pins: a pin moved without the fast
    path checked against the new release fails here."""
    import tomllib

    from asyncrl.engine.cpu import WRITTEN_FOR

    deps = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    pins = dict(d.split("==") for d in deps if d.split("==")[0] in WRITTEN_FOR)
    assert pins == WRITTEN_FOR


# ---- the caller's train mode (issue #36 E) ----------------------------------------------------------
@pytest.mark.parametrize(("merge", "static"), [(True, False), (False, False), (False, True)])
def test_a_model_in_train_mode_with_gradient_checkpointing_samples_as_in_eval_mode(
    merge: bool, static: bool
) -> None:
    """A trainer (TRL) leaves the policy in train mode with gradient checkpointing on, under which
    transformers runs without the KV cache: the engine runs its forward passes in eval mode itself, so
    it draws the eval-mode engine's tokens with the same seed, at the trainer's log-probs, and the
    probe agrees; the caller's mode and the model's gradients are left as they were."""
    from asyncrl.policy.canary import probe_logprobs

    prompts = random_prompts(9, 2, 30, seed=6)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12)
    ids = random_prompts(1, 20, 20, seed=7)[0]
    kw: dict[str, Any] = {"merge_lora": merge, "static_cache": static, "max_batch": 16}
    want = uncached_engine(tiny_lora("llama"), **kw).generate(prompts, sp)
    policy = tiny_lora("llama")
    policy.model.gradient_checkpointing_enable()
    policy.model.enable_input_require_grads()
    policy.model.train()
    engine = uncached_engine(policy, **kw)
    got = engine.generate(prompts, sp)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert_at_noise_floor(logprob_error(policy, prompts, got, [1.0] * 9), f"train mode, merge={merge}")
    probe = engine.probe(ids)
    policy.model.eval()
    assert (
        max(abs(a - b) for a, b in zip(probe, probe_logprobs(policy.model, ids), strict=True))
        < LOGPROB_TOL_MAX
    )
    policy.model.train()
    assert policy.model.training and all(m.training for m in policy.model.modules())
    assert all(p.grad is None for p in policy.model.parameters())


# ---- bfloat16: the CPU fast path in model.dtype bfloat16 (issue #59 item 1, engine part) -------------
BF16_FLOOR_MAX = 7.7e-3
"""bfloat16's noise floor on the tiny models, largest ``|Δ|`` per token: the model's own KV-cached decode
(the engine with ``packed_linear: false``) against the trainer's forward (``token_logprobs``) on the same
weights, 5.0e-3 to 7.7e-3 (llama/sdpa, 4 runs; eager 4.8e-7: its rows round alike in both); the trainer's
own bfloat16 forward of the same sequences batched 17 together against each alone, 4.9e-4 to 1.0e-3 on
prompts, 2.2e-3 to 7.6e-3 on prompts with sampled continuations (sdpa; eager 0). Printed by
:func:`test_bf16_noise_floor_of_the_trainers_forward` and
:func:`test_bf16_fused_decode_and_prefill_serve_bfloat16` (``-s``, the ``fast=False`` lines)."""
BF16_FLOOR_MEAN = 4.5e-4
"""The mean ``|Δ|`` of that floor: the model's own decode against the trainer 3.4e-4 to 4.5e-4 (sdpa;
eager 6.7e-8); batched against alone 2.7e-6 to 8.2e-5."""
BF16_TOL_MAX = 1.5e-2
"""Tolerance on the largest ``|Δ|`` against the trainer in bfloat16: 2x :data:`BF16_FLOOR_MAX`."""
BF16_TOL_MEAN = 9e-4
"""Tolerance on the mean ``|Δ|`` against the trainer in bfloat16: 2x :data:`BF16_FLOOR_MEAN`."""
BF16_TOL_SAME_MEAN = 1e-4
"""Tolerance on the mean ``|Δ|`` of the fast path against the model's own forward in bfloat16 (the engine
with ``packed_linear: false``, same weights, same tokens): the batch-composition floor's mean (8.2e-5).
The fused step rounds where the model's attention rounds (:func:`~asyncrl.engine.cpu.fused.attend`), so
here it measured 0; with ``baddbmm``'s single rounding it was 1.2e-3 against the trainer."""


def tiny_lora_bf16(family: str, attn: str = "sdpa", adapter_seed: int = 0) -> Policy:
    """:func:`tiny_lora` as ``model.dtype: bfloat16`` loads it: the base weights bfloat16, peft's adapter
    float32 (the merged copy folds it in float32 and rounds once)."""
    from asyncrl.config import LoraConfig
    from asyncrl.policy.lora import apply_lora

    policy = tiny(family, peaky=PEAKY, attn=attn)
    policy.model = apply_lora(policy.model.to(torch.bfloat16), LoraConfig(rank=4, alpha=8))
    set_adapter(policy, adapter(policy, adapter_seed, 0.1))
    return policy


def served_logprob_error(engine: HFEngine, prompts: list[list[int]], samples: list[Sample]) -> torch.Tensor:
    """``|engine − trainer|`` per sampled token, the trainer's forward on the weights the engine serves
    (the merged copy: bfloat16 rounds the fold, which is the weights', not the engine's, difference)."""
    served = Policy(engine.model, engine.policy.tokenizer)
    return logprob_error(served, prompts, samples, [1.0] * len(prompts))


def assert_at_bf16_floor(delta: torch.Tensor, what: str) -> None:
    print(f"{what}: {delta.numel()} tokens, mean |dlogp| {delta.mean():.2e}, max {delta.max():.2e}")
    assert delta.numel() > 0
    assert float(delta.max()) < BF16_TOL_MAX, (what, float(delta.max()))
    assert float(delta.mean()) < BF16_TOL_MEAN, (what, float(delta.mean()))


@pytest.mark.parametrize(("family", "attn"), [("llama", "sdpa"), ("qwen2", "sdpa")])
def test_bf16_noise_floor_of_the_trainers_forward(family: str, attn: str) -> None:
    """The floor the bfloat16 tolerances stand on: the trainer's bfloat16 forward of the same sequences
    batched against each alone differs (bfloat16 rounding is not batch-invariant under sdpa), by less than
    the tolerances; float32 differs by far less."""
    prompts = random_prompts(17, 2, 60, seed=3)
    for dtype, tol in ((torch.bfloat16, BF16_FLOOR_MAX), (torch.float32, LOGPROB_FLOOR_MAX)):
        policy = tiny(family, peaky=PEAKY, attn=attn)
        policy.model.to(dtype)
        ids, mask = right_padded(prompts)
        with torch.no_grad():
            batched = token_logprobs(policy.model, ids, mask)
            alone = [
                token_logprobs(policy.model, torch.tensor([p]), torch.ones(1, len(p)))[0] for p in prompts
            ]
        delta = torch.cat([(a - batched[i, : len(a)]).abs() for i, a in enumerate(alone)])
        print(f"{family} {dtype} batched vs alone: mean {delta.mean():.2e}, max {delta.max():.2e}")
        assert float(delta.max()) <= tol and float(delta.mean()) <= BF16_TOL_SAME_MEAN
        if dtype == torch.bfloat16:
            assert float(delta.max()) > 10 * LOGPROB_TOL_MAX  # bfloat16's floor: not float32's


@pytest.mark.parametrize(("family", "attn"), [("llama", "sdpa"), ("qwen2", "eager")])
def test_bf16_fused_decode_and_prefill_serve_bfloat16(
    family: str, attn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``model.dtype: bfloat16`` gets the fast path (it fell back to the model's own forward: only float32
    linears were packed): the merged copy's linears packed in bfloat16, decode steps and prefills through
    the fused forward, which draws the model's own forward's tokens with the same seed at its log-probs
    (:data:`BF16_TOL_SAME_MEAN`), at the trainer's bfloat16 floor, before and after a load (the stacks
    repacked in bfloat16). Mutants this test kills: bfloat16 not packed (the fallback), the bfloat16
    attention rounded once by ``baddbmm``, an sdpa model's step rounded as eager, no repack at a load."""
    from asyncrl.engine.cpu import fused as fused_module
    from asyncrl.engine.cpu.packed import PackedLinear
    from test_prefix_cache import grpo_prompts

    steps = count_fused_steps(monkeypatch)
    prefills: list[int] = []
    real_prefill = fused_module.FusedDecoder.prefill

    def prefill(self: fused_module.FusedDecoder, tokens: torch.Tensor, *a: Any) -> torch.Tensor:
        prefills.append(int(tokens.shape[0]))
        return real_prefill(self, tokens, *a)

    monkeypatch.setattr(fused_module.FusedDecoder, "prefill", prefill)
    prompts = grpo_prompts(tasks=3, group=3, seed=4, system=24) + random_prompts(6, 2, 30, seed=5)
    sp = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16)
    kw: dict[str, Any] = {"max_batch": 32, "prefix_sharing": True, "compact_fraction": 0.25}
    engines = {
        fast: hf_engine(tiny_lora_bf16(family, attn), [2, 50, 60], packed_linear=fast, **kw)
        for fast in (False, True)
    }
    fwd = engines[True].forward
    assert isinstance(fwd, fused_module.FusedForward) and fwd.fused_prefill
    packed = [m for m in engines[True].model.modules() if isinstance(m, PackedLinear)]
    assert packed and {m.weight.dtype for m in packed} == {torch.bfloat16}
    assert not any(isinstance(m, PackedLinear) for m in engines[False].model.modules())
    for load in (False, True):
        if load:  # a new adapter version into both engines
            for e in engines.values():
                e.load_weights(1, adapter(e.policy, 7, 0.1))
        steps.clear(), prefills.clear()
        out = {fast: e.generate(prompts, sp) for fast, e in engines.items()}
        assert steps and prefills  # the fast engine's decode steps and prefills ran the fused forward
        assert [s.token_ids for s in out[True]] == [s.token_ids for s in out[False]]
        same = torch.cat(
            [
                (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs()
                for a, b in zip(out[True], out[False], strict=True)
            ]
        )
        print(
            f"{family}/{attn} load={load}: fused vs the model's forward: mean {same.mean():.2e}, max {same.max():.2e}"
        )
        assert float(same.mean()) < BF16_TOL_SAME_MEAN
        for fast, e in engines.items():
            assert_at_bf16_floor(
                served_logprob_error(e, prompts, out[fast]), f"{family}/{attn} fast={fast} load={load}"
            )
