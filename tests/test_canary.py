"""The weight-sync canary: a correct load passes; deliberately broken loads are caught and refused.

Each broken load is a real failure mode of weight sync (verl#7495 and its kin): an adapter written
into the wrong modules (a name-mapping bug), a no-op load (the engine says "loaded" and changed
nothing), another version's tensors, and an adapter in place but not active (only the probe can see
that one). Each must refuse the version: the engine goes back to the previous good version before
anything is generated, the refusal is reported (the trainer republishes) and becomes a
``weight_canary`` alert.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import CanaryConfig, HFEngineConfig, LocalWeightsConfig, ModelConfig, load_config
from asyncrl.engine import HFEngine
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.policy import Policy
from asyncrl.policy.canary import CanaryRecord, expected_fingerprint, fingerprint
from asyncrl.records import SamplingParams
from asyncrl.rollout.canary import WeightCanary, WeightCanaryError
from asyncrl.rollout.worker import WeightFollower
from asyncrl.telemetry.jsonl import MetricWriter
from asyncrl.telemetry.reports import decode_rows
from asyncrl.weights import make_weight_store, publish_policy
from models_util import family_tokenizer, load_tokenizer, smollm2_dir, tiny_model_dir

CANARY = CanaryConfig()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = family_tokenizer(load_tokenizer(smollm2_dir()), "smollm2")
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-canary"), tok)


def lora(path: Path) -> ModelConfig:
    return ModelConfig(path=str(path), lora={"rank": 4, "alpha": 8})


LR = 2e-4
"""One optimiser step of this size is the smallest fault the canary must refuse (a version one step stale)."""


def adam_step(policy: Policy, lr: float = LR) -> None:
    """One Adam step at ``lr`` on the trainable parameters (each moves by about ``lr``)."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    ids = torch.arange(10, 42)[None]
    with torch.enable_grad():
        policy.model(ids, labels=ids).loss.backward()
    torch.optim.Adam(params, lr=lr).step()
    policy.model.zero_grad(set_to_none=True)


def perturb(policy: Policy, scale: float = 0.3) -> None:
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)


class BrokenEngine(HFEngine):
    """The built-in engine with one faulty load (``fault``), then correct again (a transient fault);
    ``persistent`` keeps the adapter switched off after an ``inactive`` fault. ``one_step``: the served
    weights are the published ones plus one Adam step at :data:`LR`; ``stale_cache``: the weights load
    but the prefix cache keeps the previous version's KV (as if entries were not keyed by version).
    Merged copy (``merge_lora``, the default): ``stale_merge``: the new adapter is loaded but the copy
    is folded from the previous version's; ``unfolded``: the copy's record of its adapter
    (:attr:`~asyncrl.policy.lora.MergedCopy.adapter`) is the new version's, its weights are still the
    previous fold (a refresh that skipped the fold). Every fault is made on the PEFT model and then
    folded, so it reaches what the engine serves in both modes."""

    fault = ""
    persistent = False
    stale: dict[str, torch.Tensor] | None = None

    def load_weights(self, version: int, tensors: dict[str, torch.Tensor], *, path: Any = None) -> None:
        fault, self.fault = self.fault, ""
        if not self.persistent:
            set_lora_scaling(self.policy.model, 8 / 4)  # alpha / rank: the adapter active again
        if fault == "noop":  # says loaded, changed nothing
            self.version = version
            return
        if fault == "wrong_modules":  # k_proj's adapter into v_proj and back (same shapes)
            swap = {"k_proj": "v_proj", "v_proj": "k_proj"}
            tensors = {_rename(k, swap): v for k, v in tensors.items()}
        if fault == "other_version":
            assert self.stale is not None
            tensors = self.stale
        if fault == "stale_cache":
            assert self.prefix_cache is not None
            self.policy.load_tensors(tensors)
            self.refresh_merged()
            self.version = version
            for entry in self.prefix_cache.entries.values():
                entry.version = version
            return
        if fault in ("stale_merge", "unfolded"):
            assert self.merged is not None and self.stale is not None
            super().load_weights(version, self.stale, path=path)  # the copy folds the previous adapter
            self.policy.load_tensors(tensors)  # the PEFT model holds the new one
            if fault == "unfolded":
                for name, t in self.merged.adapter.items():
                    t.copy_(tensors[name])
            return
        super().load_weights(version, tensors, path=path)
        if fault == "one_step":
            adam_step(self.policy)
        if fault == "inactive":  # in place, but the forward pass does not use it
            set_lora_scaling(self.policy.model, 0.0)
        self.refresh_merged()
        self.stale = tensors


def set_lora_scaling(model: Any, scale: float) -> None:
    for module in model.modules():
        if isinstance(getattr(module, "scaling", None), dict):
            module.scaling = dict.fromkeys(module.scaling, scale)


def _rename(name: str, swap: dict[str, str]) -> str:
    for a, b in swap.items():
        if f".{a}." in name:
            return name.replace(f".{a}.", f".{b}.")
    return name


class Rig:
    """A trainer policy publishing to a store, and a worker's engine following it with the canary."""

    def __init__(
        self, tiny: Path, tmp: Path, canary: CanaryConfig = CANARY, *, ride: bool = False, **engine: Any
    ) -> None:
        cfg = lora(tiny)
        torch.manual_seed(0)
        self.trainer = Policy.load(tiny, cfg=cfg)
        settings = {"max_batch": 8, "cuda_graphs": False, "prefix_cache": False, "prefix_sharing": False}
        self.engine = BrokenEngine(
            Policy.load(tiny, cfg=cfg), HFEngineConfig(**(settings | engine)), [2], seed=0
        )
        self.engine.version = -1
        self.store = make_weight_store(LocalWeightsConfig(keep=10), tmp)
        self.events = tmp / "rollout-0.jsonl"
        self.metrics = MetricWriter(self.events, role="rollout-0")
        self.reported: list[int] = []
        self.canary = WeightCanary(canary, ("float32", "float32"))
        self.follower = WeightFollower(
            self.store, self.engine, self.metrics, "rollout-0", self.reported.append, self.canary, ride=ride
        )
        self.version = 0
        self.calls: list[int] = []
        """The rows of every engine call the batcher made (:meth:`load`)."""

    def load(self) -> int | None:
        """The worker's way: load the newest version; with ``ride``, one model turn through its batcher
        then, the probe riding along it; the version that turn is stamped with (``None`` without ``ride``).
        :attr:`calls` records the batcher's engine calls (not the probes run on their own: no rows)."""
        self.follower.refresh()
        if not self.follower.ride:
            return None
        engine, calls = self.engine, self.calls

        class Counting(TurnBatcher):
            async def _call(self) -> None:
                generate, probed = engine.generate, engine.generate_probed

                def counted(prompts: list[list[int]], *args: Any) -> Any:
                    if prompts:  # a probe run on its own has none
                        calls.append(len(prompts))
                    return (probed if args[1:] else generate)(prompts, *args)

                engine.generate = engine.generate_probed = counted  # type: ignore[method-assign]
                try:
                    await super()._call()
                finally:
                    del engine.generate, engine.generate_probed

        async def turn() -> int:
            batcher = Counting(engine, check=self.follower, max_batch=8, max_wait_s=0.0)
            try:
                _, version = await batcher.generate([5, 6, 7, 8, 9], SamplingParams(max_new_tokens=4))
            finally:
                batcher.close()
            return version

        return asyncio.run(turn())

    def publish(self, canary: CanaryConfig = CANARY) -> int:
        publish_policy(self.store, self.version, self.trainer, step=self.version, canary=canary)
        self.version += 1
        return self.version - 1

    def record(self, version: int) -> CanaryRecord:
        record = CanaryRecord.from_manifest(self.store.load(version).manifest)
        assert record is not None
        return record

    def served_probe(self, version: int) -> float:
        """mean |Δ log p| between what the engine serves now and ``version``'s record."""
        rec = self.record(version)
        got = self.engine.probe(rec.probe_ids)
        return sum(abs(a - b) for a, b in zip(got, rec.probe_logprobs, strict=True)) / len(got)

    def failures(self) -> list[dict[str, Any]]:
        self.metrics.close()
        rows = [json.loads(line) for line in self.events.read_text().splitlines()]
        self.metrics = self.follower.metrics = MetricWriter(self.events, role="rollout-0")
        return [r for r in rows if r.get("event") == "weights/canary_failed"]


@pytest.mark.parametrize("ride", [False, True])
def test_a_correct_load_passes_and_the_engine_serves_the_trainers_version(
    tiny: Path, tmp_path: Path, ride: bool
) -> None:
    """Riding along: each probe runs inside the turn after its load (one engine call, no second)."""
    rig = Rig(tiny, tmp_path, ride=ride)
    rig.publish()
    assert rig.load() == (0 if ride else None)
    perturb(rig.trainer)
    rig.publish()
    assert rig.load() == (1 if ride else None) and rig.calls == ([1, 1] if ride else [])
    assert rig.follower.pending is None
    assert rig.engine.version == 1 and rig.canary.checked == 2 and rig.canary.failed == 0
    assert rig.canary.rode == (2 if ride else 0)
    assert rig.reported == [] and rig.failures() == []
    last = rig.canary.last
    assert last is not None and last.tensors_checked == len(rig.trainer.state_dict_tensors())
    assert last.probe_mean_abs_diff is not None and last.probe_mean_abs_diff < 1e-5
    assert rig.served_probe(0) > 100 * CANARY.probe_tolerance_float32  # the probe tells the versions apart
    metrics = rig.canary.figures().flat()
    assert metrics["weights/canary_checked"] == 2 and metrics["weights/canary_seconds"] > 0


@pytest.mark.parametrize(
    ("fault", "caught_by", "merge"),
    [
        ("wrong_modules", "fingerprint", True),
        ("noop", "fingerprint", True),
        ("other_version", "fingerprint", True),
        ("inactive", "probe", True),
        ("inactive", "probe", False),
        ("stale_merge", "fingerprint", True),
        ("unfolded", "probe", True),
    ],
)
@pytest.mark.parametrize("ride", [False, True])
def test_a_broken_load_is_refused_and_the_previous_version_kept(
    tiny: Path, tmp_path: Path, fault: str, caught_by: str, merge: bool, ride: bool
) -> None:
    """With the merged copy (the default) and, for ``inactive``, without it (sampling through the adapter).
    Riding along, a fault the fingerprint sees is refused at the load, before any call; one only the probe
    sees is refused by the turn the probe rides along, which is then generated again under version 1."""
    from asyncrl.orchestrator.rules import Rules

    rig = Rig(tiny, tmp_path, ride=ride, merge_lora=merge)
    assert (rig.engine.merged is not None) == merge
    for _ in range(2):  # versions 0 and 1 load correctly
        rig.publish()
        rig.load()
        perturb(rig.trainer)
    assert rig.engine.version == 1
    bad = rig.publish()
    rig.engine.fault = fault
    rig.calls.clear()
    stamped = rig.load()
    # refused: the engine is back on version 1, exactly; nothing generated under the bad one came out
    if ride:
        assert stamped == 1 and rig.calls == ([1] if caught_by == "fingerprint" else [1, 1])
    assert rig.engine.version == 1 and rig.follower.good is not None and rig.follower.good.version == 1
    assert rig.served_probe(1) < 1e-5 and rig.served_probe(bad) > CANARY.probe_tolerance_float32
    assert rig.canary.failed == 1 and rig.reported == [bad] and rig.follower.newest_valid() == 1
    rig.follower.refresh()  # remembered: not loaded again
    assert rig.canary.checked == 3 and rig.engine.version == 1
    (event,) = rig.failures()
    assert event["version"] == bad and event["kept"] == 1 and event["worker"] == "rollout-0"
    if caught_by == "fingerprint":
        assert event["tensors_differing_count"] > 0
    else:  # weights in place, forward pass not using them: only the probe sees it
        assert event["tensors_differing_count"] == 0
        assert event["probe_mean_abs_diff"] > event["probe_tolerance"]
    # the orchestrator turns the event into a weight_canary alert
    rules = Rules(load_config(None, []), tmp_path, buckets=["calc"])
    (alert,) = rules.feed(decode_rows([event]))
    assert alert.kind == "weight_canary" and "keeps serving version 1" in alert.action
    assert json.loads((tmp_path / "alerts.jsonl").read_text())["evidence"]["version"] == bad
    # the trainer's next version (its answer to the report) loads normally
    rig.publish()
    rig.follower.refresh()
    assert rig.engine.version == bad + 1 and rig.canary.failed == 1


@pytest.mark.parametrize(
    ("fault", "static"),
    [
        ("one_step", False),
        ("stale_cache", False),
        ("stale_cache", True),
        ("unfolded", False),
        ("unfolded", True),
    ],
)
@pytest.mark.parametrize("ride", [False, True])
def test_a_fault_one_adam_step_small_is_refused(
    tiny: Path, tmp_path: Path, fault: str, static: bool, ride: bool
) -> None:
    """Served weights one Adam step (lr 2e-4) off the published ones are refused by both parts; a prefix
    cache still holding the KV of the version one step before (correct weights, stale cache) is seen by
    the probe alone, through the engine's generation path (cached prefill + decode steps); so is a
    merged copy still folded from the version one step before while it reports the new adapter. Riding
    along, the probe's rows are in a call beside a row that samples."""
    rig = Rig(tiny, tmp_path, ride=ride, prefix_cache=True, prefix_sharing=True, static_cache=static)
    perturb(rig.trainer)
    rig.publish()
    rig.load()  # version 0 loads; its probe leaves its KV in the prefix cache
    assert rig.canary.failed == 0 and rig.engine.version == 0
    adam_step(rig.trainer)  # version 1: one optimiser step on
    bad = rig.publish()
    rig.engine.fault = fault
    assert rig.load() == (0 if ride else None)
    assert rig.canary.failed == 1 and rig.reported == [bad] and rig.engine.version == 0
    assert rig.served_probe(0) < 1e-5  # back on version 0, exactly (the probe's own noise floor)
    (event,) = rig.failures()
    assert event["probe_mean_abs_diff"] > event["probe_tolerance"], event
    if fault == "one_step":
        assert event["tensors_differing_count"] > 0
    elif fault == "stale_cache":  # the weights are right: only the generation path's cached KV is old
        assert event["tensors_differing_count"] == 0
        assert rig.engine.prefill_tokens_reused > 0
    else:  # the adapter the copy reports is right: only its weights are old
        assert event["tensors_differing_count"] == 0
    print(f"{fault} static={static}: probe mean |dlogp| {event['probe_mean_abs_diff']:.2e}")


def test_a_persistent_fault_stops_the_worker_rather_than_serve_unverified_weights(
    tiny: Path, tmp_path: Path
) -> None:
    rig = Rig(tiny, tmp_path)
    for _ in range(2):
        rig.publish()
        rig.follower.refresh()
        perturb(rig.trainer)
    rig.publish()
    rig.engine.fault, rig.engine.persistent = "inactive", True  # going back to version 1 cannot help
    with pytest.raises(WeightCanaryError, match="back on weight version 1, which now fails the canary too"):
        rig.follower.refresh()
    assert rig.reported == [2] and len(rig.failures()) == 1


def test_a_first_version_that_fails_has_nothing_to_go_back_to(tiny: Path, tmp_path: Path) -> None:
    rig = Rig(tiny, tmp_path)
    perturb(rig.trainer)
    rig.publish()
    rig.engine.fault = "noop"  # the engine keeps the initial policy, which is not version 0 here
    with pytest.raises(WeightCanaryError, match="no earlier version passed it"):
        rig.follower.refresh()
    assert rig.reported == [0] and rig.engine.version == 0
    assert len(rig.failures()) == 1


def test_a_version_without_a_record_loads_unverified(tiny: Path, tmp_path: Path) -> None:
    rig = Rig(tiny, tmp_path)
    rig.publish(CanaryConfig(enabled=False))
    rig.follower.refresh()
    assert rig.engine.version == 0 and rig.canary.unverified == 1 and rig.canary.checked == 0


def test_the_fingerprint_sees_order_and_tolerates_reduction_order_and_dtype() -> None:
    torch.manual_seed(0)
    w = {"a": torch.randn(300, 70), "b": torch.randn(5000)}
    base = fingerprint(w)
    from asyncrl.policy.canary import Verdict, compare_fingerprints

    def differs(other: dict[str, torch.Tensor], rtol: float = CANARY.fingerprint_rtol) -> list[str]:
        v = Verdict()
        compare_fingerprints(base, fingerprint(other), rtol, v)
        return v.tensors_differing

    assert differs({k: v.clone() for k, v in w.items()}) == []
    assert differs({"a": w["a"].flip(0), "b": w["b"]}) == ["a"]  # same sum and norm, other order
    assert differs({"a": w["a"], "b": w["b"] + 1e-6 * torch.randn(5000)}) == ["b"]  # one tiny Adam step
    assert differs({"a": w["a"]}) == ["b"]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert differs({k: v.clone() for k, v in w.items()}) == []
    finally:
        torch.set_num_threads(threads)
    # an engine in bfloat16 is compared with the published tensors rounded to bfloat16
    record = CanaryRecord(base, [1, 2], [0.0])
    half = {k: v.bfloat16() for k, v in w.items()}
    want = expected_fingerprint(record, "bfloat16", w)
    v = Verdict()
    compare_fingerprints(want, fingerprint(half), CANARY.fingerprint_rtol, v)
    assert v.ok and want.dtype == "bfloat16"


def assert_every_load_passed_the_canary(run_dir: Path, summary: dict[str, Any]) -> None:
    """For the end-to-end runs (tests/test_runtime_e2e.py, tests/test_lora.py): every version was
    published with its record, every load a worker made was checked, and none failed."""
    loads = 0
    for path in (run_dir / "metrics").glob("rollout-*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        loads += int(max((r.get("rollout/weight_loads", 0) for r in rows), default=0))
    canary = summary["weights_canary"]
    rode = canary.pop("rode")
    assert canary == {"checked": loads, "failed": 0, "unverified": 0, "alerts": 0}, (canary, loads)
    assert 1 <= rode <= loads, rode  # weights.canary.ride_along: the probes of the loads a call followed
    assert loads >= 2, loads
    manifests = list((run_dir / "weights").glob("v*/manifest.json"))
    assert manifests and all(CanaryRecord.from_manifest(json.loads(m.read_text())) for m in manifests)
