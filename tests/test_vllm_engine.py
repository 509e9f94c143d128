"""The vLLM generation backend (``rollout.engine.kind: vllm``).

Two kinds of tests:

* everywhere (the main environment has no vLLM): choosing ``vllm`` without it installed is a
  clear :class:`UserError` naming the install command, raised before any work; the backend's
  config default (truncated-IS policy loss) and its explicit override.
* ``vllm``-marked, in the environment ``make test-vllm`` builds: behaviour log-probs agree with
  the trainer's recomputation under identical weights, stop / length semantics match the built-in
  engine, weights reload from the weight store's versioned snapshots (version stamped, prefix cache
  not reused across versions, retention race handled), the demo-shaped model (head size 16) is
  served with padded heads and still agrees with the trainer before and after reloads, and a short
  run of the demo's model shape trains end to end. These
  are skipped where vLLM is not importable, unless ``ASYNCRL_REQUIRE_VLLM=1`` (set by
  ``make test-vllm``), which turns the skip into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import EngineConfig, HFEngineConfig, ModelConfig, RunConfig, VLLMEngineConfig, load_config
from asyncrl.engine import HFEngine, Sample, make_engine, read_weights
from asyncrl.errors import UserError
from asyncrl.policy import Policy, token_logprobs
from asyncrl.records import SamplingParams

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
# head size 32: the smallest vLLM's CPU attention supports, served as it is.
TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 96}
# the demo's shape: head size 64 / 4 = 16, which vLLM's CPU attention lacks: served padded to 32.
DEMO = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192}
VLLM_FLOOR_MAX = 2.4e-6
"""The float32 noise floor of vLLM (CPU) vs the trainer's log-probs: the largest ``|Δ|`` per sampled
token, 4.8e-7 to 2.4e-6 (mean 1.6e-7 to 4.2e-7) over the tiny, small and padded demo models, 1,024 tokens
each (docs/engines.md, measured with ``bench/engines.py``; this file's own runs: max 9.5e-7 and 1.9e-6)."""
VLLM_TOL_MAX = 2e-5
"""Tolerance on the largest ``|Δ|``: about 8x :data:`VLLM_FLOOR_MAX` (was 1e-2, which hid position bugs)."""
VLLM_TOL_MEAN = 2e-6
"""Tolerance on the mean ``|Δ|``: about 5x the largest measured mean (4.2e-7)."""


def at_vllm_floor(delta: torch.Tensor) -> bool:
    """vLLM's log-probs equal the trainer's to float32 rounding (:data:`VLLM_TOL_MAX`, :data:`VLLM_TOL_MEAN`)."""
    return delta.numel() > 0 and float(delta.max()) < VLLM_TOL_MAX and float(delta.mean()) < VLLM_TOL_MEAN


def tiny(seed: int = 0, peaky: float = 0.0, shape: dict[str, int] = TINY) -> Policy:
    policy = Policy.build(ModelConfig(seed=seed, max_context=128, **shape))  # type: ignore[arg-type]
    if peaky:
        with torch.no_grad():
            weight = policy.model.get_input_embeddings().weight
            assert isinstance(weight, torch.Tensor)
            weight.mul_(peaky)
    return policy


# ---- without vLLM ------------------------------------------------------------------------------
@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )


def test_missing_vllm_is_a_clear_user_error(no_vllm: None) -> None:
    with pytest.raises(UserError) as err:
        make_engine(VLLMEngineConfig(), tiny(), [2], seed=0)
    msg = str(err.value)
    assert "rollout.engine.kind is 'vllm'" in msg
    assert "make test-vllm" in msg and "rollout.engine.kind=hf" in msg


def test_train_fails_before_the_warm_start_without_vllm(no_vllm: None, tmp_path: Path) -> None:
    from asyncrl.jobs.train import train

    cfg = load_config(
        None, [f"run_root={tmp_path}", f"cache_dir={tmp_path / 'cache'}", "rollout.engine.kind=vllm"]
    )
    with pytest.raises(UserError, match="make test-vllm"):
        train(cfg, display=False)
    assert not (tmp_path / "cache").exists()  # nothing was trained or written first
    assert not any(tmp_path.iterdir())


def test_vllm_backend_defaults_to_truncated_is_unless_set() -> None:
    assert RunConfig().algo.policy_loss.kind == "ppo_clip"
    cfg = load_config(None, ["rollout.engine.kind=vllm"])
    assert cfg.algo.policy_loss.kind == "decoupled_ppo"  # PPO + truncated IS (is_cap)
    again = RunConfig.model_validate_json(cfg.model_dump_json())  # stable through the run's config.yaml
    assert again.algo.policy_loss.kind == "decoupled_ppo"
    explicit = load_config(None, ["rollout.engine.kind=vllm", "algo.policy_loss.kind=ppo_clip"])
    assert explicit.algo.policy_loss.kind == "ppo_clip"


def test_evaluation_uses_the_builtin_engine_with_the_vllm_backend(
    no_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held-out evaluation is comparable across backends: it samples with hf, needing no vLLM."""
    import asyncrl.engine as engine_module
    from asyncrl.rollout.heldout import evaluate_policy

    kinds: list[str] = []
    real = engine_module.make_engine

    def spy(cfg: EngineConfig, *a: Any, **kw: Any) -> Any:
        kinds.append(cfg.kind)
        return real(cfg, *a, **kw)

    monkeypatch.setattr(engine_module, "make_engine", spy)
    cfg = load_config(
        None,
        ["env.kind=calculator", "env.heldout_size=8", "model.max_context=128", "rollout.engine.kind=vllm"],
    )
    report = evaluate_policy(cfg, tiny(seed=0), seed=3)
    assert report["episodes"] == 8 and report["avg_steps"] >= 1
    assert kinds == ["hf"]


# ---- with vLLM ---------------------------------------------------------------------------------
def _require_vllm() -> None:
    if not HAVE_VLLM:
        if os.environ.get("ASYNCRL_REQUIRE_VLLM") == "1":
            pytest.fail("vLLM is not importable here but ASYNCRL_REQUIRE_VLLM=1 (make test-vllm)")
        pytest.skip("vLLM is not installed in this environment (make test-vllm runs these)")


@pytest.fixture(scope="module")
def vllm_setup() -> Iterator[tuple[Any, Policy]]:
    """One engine for the module: vLLM's start-up costs tens of seconds on a small CPU."""
    _require_vllm()
    torch.set_num_threads(1)
    policy = tiny(seed=0, peaky=4.0)
    engine = make_engine(VLLMEngineConfig(max_batch=32), policy, [2, 50, 60], seed=0)  # type: ignore[arg-type]
    try:
        yield engine, policy
    finally:
        engine.close()


def random_prompts(n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(10, 100, (k,), generator=g).tolist() for k in lengths]


def recomputed(
    policy: Policy, prompts: list[list[int]], samples: list[Sample], temps: list[float]
) -> torch.Tensor:
    """|trainer log-prob − engine log-prob| of every sampled token (trainer layout: right padding)."""
    seqs = [p + s.token_ids for p, s in zip(prompts, samples, strict=True)]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.no_grad():
        lp = token_logprobs(policy.model, ids, mask, torch.tensor(temps))
    return torch.cat(
        [
            lp[i, len(p) : len(p) + len(s.token_ids)] - torch.tensor(s.logprobs)
            for i, (p, s) in enumerate(zip(prompts, samples, strict=True))
        ]
    )


@pytest.mark.vllm
def test_vllm_logprobs_agree_with_trainer_and_stops_hold(vllm_setup: tuple[Any, Policy]) -> None:
    engine, policy = vllm_setup
    prompts = random_prompts(24, 2, 40, seed=1)
    temps = [0.7 + 0.05 * (i % 8) for i in range(len(prompts))]
    params = [SamplingParams(temperature=t, top_p=1.0, max_new_tokens=20) for t in temps]
    samples = engine.generate(prompts, params)
    assert len(samples) == len(prompts)
    for s in samples:
        assert len(s.logprobs) == len(s.token_ids)  # one behaviour log-prob per sampled token
        assert s.token_ids, "vLLM returned an empty continuation"
        assert len(s.token_ids) <= 20, f"{len(s.token_ids)} tokens, past max_new_tokens=20"
        stops = [k for k, t in enumerate(s.token_ids) if t in (2, 50, 60)]
        if s.finish_reason == "stop":  # ends at its first stop token, which is included
            assert stops == [len(s.token_ids) - 1]
        else:
            assert stops == [] and len(s.token_ids) == 20
    assert {s.finish_reason for s in samples} == {"stop", "length"}
    delta = recomputed(policy, prompts, samples, temps).abs()
    print(f"vllm vs trainer: {delta.numel()} tokens, mean |dlogp| {delta.mean():.2e}, max {delta.max():.2e}")
    assert at_vllm_floor(delta)


@pytest.mark.vllm
def test_vllm_top_p_and_context_limit(vllm_setup: tuple[Any, Policy]) -> None:
    engine, policy = vllm_setup
    prompts = random_prompts(8, 2, 10, seed=3)
    samples = engine.generate(prompts, SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=12))
    gap = -recomputed(policy, prompts, samples, [1.0] * len(prompts))  # recorded − tempered = −log(mass)
    assert (gap > -1e-4).all() and gap.max() > 1e-3  # the nucleus was renormalised, never shrunk
    near_full = [[10 + k % 80 for k in range(126)], [10 + k % 80 for k in range(128)]]
    out = engine.generate(near_full, SamplingParams(max_new_tokens=50))
    assert len(out[0].token_ids) <= 2 and out[0].finish_reason in ("stop", "length")
    assert out[1].token_ids == [] and out[1].finish_reason == "length"
    with pytest.raises(ValueError, match="longer than the model's context"):
        engine.generate([[10 + k % 80 for k in range(129)]], SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([[10, 11]], SamplingParams(temperature=0.0))


@pytest.mark.vllm
def test_vllm_reloads_versioned_snapshots(vllm_setup: tuple[Any, Policy], tmp_path: Path) -> None:
    from asyncrl.rollout.worker import WeightFollower
    from asyncrl.weights import LocalWeightStore

    engine, policy = vllm_setup
    prompts = random_prompts(12, 20, 30, seed=4)
    shared = [prompts[0] + [11, 12]]  # shares a prefix with a prompt cached under the old weights
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    engine.generate(prompts, sp)  # fill vLLM's prefix cache under the current weights
    store = LocalWeightStore(tmp_path / "weights", keep=1)
    follower = WeightFollower(store, engine)
    start = engine.version
    other = tiny(seed=7, peaky=4.0)
    store.publish(start + 1, other.state_dict_tensors(), step=1)
    follower.refresh()
    assert engine.version == start + 1 and follower.loads == 1 and follower.load_seconds > 0
    after = engine.generate(prompts + shared, sp)
    d_new = recomputed(other, prompts + shared, after, [1.0] * 13).abs()
    d_old = recomputed(policy, prompts + shared, after, [1.0] * 13).abs()
    assert at_vllm_floor(d_new)  # sampled from the new weights, cache included
    assert d_old.mean() > 100 * d_new.mean()

    # The snapshot directory vanished (retention) after verification: the verified tensors are used.
    store.publish(start + 2, policy.state_dict_tensors(), step=2)
    loaded = store.load(start + 2)
    shutil.rmtree(loaded.path)
    engine.load_weights(start + 2, loaded.tensors, path=loaded.path)
    assert engine.version == start + 2
    back = engine.generate(prompts, sp)
    assert at_vllm_floor(recomputed(policy, prompts, back, [1.0] * 12).abs())
    assert len(engine.reload_seconds) >= 2 and max(engine.reload_seconds) < 30


@pytest.mark.vllm
def test_vllm_probe_passes_the_weight_sync_canary(vllm_setup: tuple[Any, Policy], tmp_path: Path) -> None:
    """vLLM's prompt log-probs are the trainer's (float32 tolerance); no fingerprint: the probe carries it."""
    from asyncrl.config import CanaryConfig
    from asyncrl.policy.canary import probe_logprobs
    from asyncrl.rollout.canary import WeightCanary
    from asyncrl.rollout.worker import WeightFollower
    from asyncrl.weights import LocalWeightStore, publish_policy

    engine, policy = vllm_setup
    ids = random_prompts(1, 32, 32, seed=9)[0]
    got, want = engine.probe(ids), probe_logprobs(policy.model, ids)
    assert len(got) == len(want) == 31
    assert (
        sum(abs(a - b) for a, b in zip(got, want, strict=True)) / 31 < CanaryConfig().probe_tolerance_float32
    )
    assert engine.fingerprint(["model.embed_tokens.weight"]) is None
    store = LocalWeightStore(tmp_path / "weights", keep=2)
    canary = WeightCanary(CanaryConfig(), ("float32", "float32"))
    follower = WeightFollower(store, engine, canary=canary)
    other = tiny(seed=7, peaky=4.0)
    publish_policy(store, engine.version + 1, other, step=1, canary=CanaryConfig())
    follower.refresh()
    assert canary.checked == 1 and canary.failed == 0 and canary.last is not None
    assert canary.last.tensors_checked == 0 and canary.last.probe_mean_abs_diff is not None
    publish_policy(store, engine.version + 1, policy, step=2, canary=CanaryConfig())
    follower.refresh()
    assert canary.checked == 2 and canary.failed == 0


@pytest.mark.vllm
def test_vllm_engine_versions_match_the_builtin_engine_interface(vllm_setup: tuple[Any, Policy]) -> None:
    """Same interface as HFEngine: the same calls give samples of the same shape and semantics."""
    engine, policy = vllm_setup
    hf = HFEngine(
        policy,
        HFEngineConfig(cuda_graphs=False, prefix_cache=False, prefix_sharing=False),
        [2, 50, 60],
        seed=0,
    )
    prompts = random_prompts(6, 3, 8, seed=5)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    for out in (engine.generate(prompts, sp), hf.generate(prompts, sp)):
        assert [len(s.token_ids) == len(s.logprobs) for s in out] == [True] * 6
        assert all(s.finish_reason in ("stop", "length") for s in out)
    assert engine.max_context == hf.max_context == 128


@pytest.mark.vllm
def test_vllm_pads_the_demo_heads_exactly(tmp_path: Path) -> None:
    """Head size 16 is served padded to 32; behaviour log-probs still match the trainer's on the
    real model, and reloads (tensors, weight file, snapshot directory) are padded too."""
    from asyncrl.engine.vllm_backend import VLLMModelError, plan_head_padding
    from asyncrl.weights import LocalWeightStore

    _require_vllm()
    torch.set_num_threads(1)
    policy = tiny(seed=0, peaky=4.0, shape=DEMO)
    engine: Any = make_engine(VLLMEngineConfig(max_batch=32), policy, [2, 50, 60], seed=0)  # type: ignore[arg-type]
    try:
        assert engine.head_padding == 32
        prompts = random_prompts(24, 2, 40, seed=1)
        temps = [0.7 + 0.05 * (i % 8) for i in range(len(prompts))]
        params = [SamplingParams(temperature=t, top_p=1.0, max_new_tokens=20) for t in temps]
        delta = recomputed(policy, prompts, engine.generate(prompts, params), temps).abs()
        print(
            f"padded 16->32: {delta.numel()} tokens, mean |dlogp| {delta.mean():.2e}, max {delta.max():.2e}"
        )
        assert at_vllm_floor(delta)

        sp = SamplingParams(temperature=1.0, max_new_tokens=12)
        other = tiny(seed=7, peaky=4.0, shape=DEMO)
        store = LocalWeightStore(tmp_path / "weights", keep=2)
        for version, (source, how) in enumerate(
            [(other, "snapshot"), (policy, "file"), (other, "tensors")], start=engine.version + 1
        ):
            path = store.publish(version, source.state_dict_tensors(), step=version)
            if how == "snapshot":
                snap = store.load(version)
                engine.load_weights(version, snap.tensors, path=snap.path)
            elif how == "file":
                engine.load_weights(version, read_weights(path), path=path)
            else:
                engine.load_weights(version, source.state_dict_tensors())
            assert engine.version == version
            out = engine.generate(prompts, sp)
            d_new = recomputed(source, prompts, out, [1.0] * len(prompts)).abs()
            d_old = recomputed(policy if source is other else other, prompts, out, [1.0] * len(prompts)).abs()
            assert at_vllm_floor(d_new), how  # the reloaded weights, padded
            assert d_old.mean() > 100 * d_new.mean(), how
    finally:
        engine.close()
    assert plan_head_padding({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 2}) is None
    with pytest.raises(VLLMModelError, match="none is a multiple of 34"):
        plan_head_padding({"model_type": "qwen2", "hidden_size": 136, "num_attention_heads": 4})
    with pytest.raises(VLLMModelError, match="cannot be padded exactly"):
        plan_head_padding(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            }
        )


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_backend_trains_end_to_end(tmp_path: Path) -> None:
    """A short async run with rollouts from vLLM on the demo's model shape (heads padded 16 -> 32):
    weights reach vLLM mid-run, nothing is lost."""
    import json

    from asyncrl.jobs.train import train

    _require_vllm()
    cfg = load_config(
        None,
        [
            f"run_root={tmp_path}",
            f"cache_dir={tmp_path / 'cache'}",
            "rollout.engine.kind=vllm",
            "model.max_context=320",
            "env.kind=calculator",
            "env.min_difficulty=2",
            "env.max_difficulty=3",
            "env.heldout_size=16",
            "rollout.group_size=8",
            "rollout.concurrent_episodes=32",
            "rollout.sampling.max_new_tokens=24",
            "trainer.batch_size=16",
            "trainer.total_steps=6",
            "trainer.checkpoint_every=2",
            "trainer.sft.steps=30",
            "telemetry.log_every_s=0.5",
        ],
    )
    assert cfg.algo.policy_loss.kind == "decoupled_ppo"
    run_dir, s = train(cfg, display=False)
    assert s["trainer_steps"] == 6 and s["samples_trained"] == 6 * 16
    assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0
    assert s["staleness_max"] <= cfg.control.max_staleness
    rows = [json.loads(line) for line in (run_dir / "metrics" / "rollout-0.jsonl").read_text().splitlines()]
    last = [r for r in rows if "rollout/weight_loads" in r][-1]
    assert last["rollout/weight_loads"] >= 2  # initial weights + at least one newer version, via reload
    assert last["rollout/version"] >= 1
