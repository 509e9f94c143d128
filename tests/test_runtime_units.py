"""Unit tests of the runtime's parts: staleness rules, control state, replay buffer, credit,
learner, and the weight follower's fallback on a corrupt snapshot."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from asyncrl.config import CreditConfig, LocalLauncherConfig, ModelConfig, RunConfig, load_config
from asyncrl.engine import GenerationEngine, Sample
from asyncrl.records import Group, SamplingParams, Task, Trajectory, Turn, groups_of, members
from asyncrl.staleness import StalenessPolicy
from asyncrl.trainer.buffer import ReplayBuffer
from helpers import replay_buffer


def traj(
    group: str,
    reward: float,
    versions: tuple[int, ...] = (0,),
    tid: str | None = None,
    task_type: str = "calc",
) -> Trajectory:
    turns = [Turn(role="env", token_ids=[1, 2])]
    for v in versions:
        turns += [
            Turn(role="model", token_ids=[3, 4], logprobs=[-0.5, -0.5], version=v),
            Turn(role="tool", token_ids=[5]),
        ]
    return Trajectory(
        id=tid or f"{group}-{reward}-{versions}-{id(turns)}",
        task=Task(id=group, task_type=task_type),
        turns=turns,
        final_reward=reward,
        outcome="success" if reward > 0 else "failure",
        group_id=group,
    )


# ---- staleness rules -------------------------------------------------------------------------------
def test_modes_fix_the_lag() -> None:
    assert StalenessPolicy.from_config("sync", 5, 8, "drop").max_staleness == 0
    assert StalenessPolicy.from_config("one_step_off", 5, 8, "drop").max_staleness == 1
    assert StalenessPolicy.from_config("async", 5, 8, "drop").max_staleness == 5
    assert StalenessPolicy.from_config("async", 5, 8, "drop").inflight_updates
    assert not StalenessPolicy.from_config("one_step_off", 5, 8, "drop").inflight_updates
    # the stale-sample policy is carried through as configured (a mutant found it unchecked)
    assert StalenessPolicy.from_config("async", 5, 8, "downweight").stale_policy == "downweight"
    assert StalenessPolicy.from_config("async", 5, 8, "drop").stale_policy == "drop"


def test_the_rules_the_gateway_config_and_report_ask() -> None:
    sync, off, live = (
        StalenessPolicy.from_config(m, 5, 8, "drop") for m in ("sync", "one_step_off", "async")
    )
    assert [p.max_sync_every for p in (sync, off, live)] == [1, 2, 6]  # the config's sync_every bound
    assert [p.barrier for p in (sync, off, live)] == [True, False, False]
    assert [p.adapts for p in (sync, off, live)] == [False, False, True]  # rule 6 only in async
    p = StalenessPolicy.from_config("async", 2, 8, "drop")
    assert p.admits_call(3, 5) and not p.admits_call(2, 5)  # rule 2 for a gateway call
    assert p.admits_call(2, 5, max_staleness=3) and not p.admits_call(4, 5, max_staleness=0)
    assert p.session_expired(2, 5) and not p.session_expired(3, 5)  # rule 4 for a gateway session
    assert p.session_expired(4, 5, max_staleness=0) and not p.session_expired(5, 5, max_staleness=0)


def test_admission_limit_is_arealS_rule() -> None:
    p = StalenessPolicy.from_config("async", 2, 16, "drop")
    assert p.admission_limit(0) == 3 * 16
    assert p.admission_limit(4) == 7 * 16
    assert p.admission_limit(4, max_staleness=0) == 5 * 16
    assert (
        StalenessPolicy.from_config("sync", 2, 16, "drop").admission_limit(3) == 4 * 16
    )  # one batch per version


def test_admission_counts_the_workers_own_version() -> None:
    """Rule 1 with the starting worker's version w: the limit is (lag + min(v, w) + 1) × B, so an episode
    started on w lands in a batch trained at most ``lag`` versions after w."""
    p = StalenessPolicy.from_config("one_step_off", 5, 16, "drop")
    assert p.admission_limit(4, worker_version=4) == 6 * 16  # up to batch 5, trained at 5: age 1
    assert p.admission_limit(4, worker_version=3) == 5 * 16  # not batch 5 (age 2): batch 4 at most
    assert p.admission_limit(4, worker_version=5) == 6 * 16  # weights ahead of the announced version
    # the batch the trainer waits for (v) always fits for a worker within the lag of v: no stall
    for lag in (0, 1, 3):
        for v in range(6):
            for w in range(max(0, v - lag), v + 2):
                assert p.admission_limit(v, lag, worker_version=w) >= (v + 1) * 16


def test_refresh_and_too_stale() -> None:
    p = StalenessPolicy.from_config("async", 2, 8, "drop")
    assert not p.must_refresh(3, 5) and p.must_refresh(2, 5)
    assert not p.too_stale(5, 3) and p.too_stale(6, 3)
    assert p.age(5, 7) == 0


# (the state store's contract tests, admission atomicity and the ledger: tests/test_state_store.py)


# ---- replay buffer ---------------------------------------------------------------------------------
def group(gid: str, *members: Trajectory) -> Group:
    return Group.of(members[0].task, list(members), id=gid)


def flat(gid: str, *rewards: float, versions: tuple[int, ...] = (0,), task_type: str = "calc") -> Group:
    """A group ``gid`` of one member per reward."""
    return group(gid, *(traj(gid, r, versions, task_type=task_type) for r in rewards))


def _buffer(**kw: object) -> ReplayBuffer:
    return replay_buffer(batch_size=4, staleness=StalenessPolicy.from_config("async", 1, 4, "drop"), **kw)  # type: ignore[arg-type]


def test_buffer_takes_whole_groups_until_a_batch() -> None:
    b = _buffer()
    b.add(flat("g1", 1, 0))
    batch, dropped = b.take(version=0)
    assert batch is None and dropped == []
    b.add(flat("g2", 1, 0, 1))  # 5 samples: the batch takes both groups whole (overshoots 4)
    batch, dropped = b.take(version=0)
    assert batch is not None and [g.id for g in batch] == ["g1", "g2"] and len(members(batch)) == 5
    assert len(b) == 0 and len(b._groups) == 0


def test_buffer_sets_a_non_finite_member_aside_alone() -> None:
    """A member with a non-finite reward is dropped alone; its group mates train with the count of the
    missing ones (the members whose fate was recorded before, ``missing``, included)."""
    b = replay_buffer(1, StalenessPolicy.from_config("async", 1, 4, "drop"))
    members_ = [traj("t", r) for r in (float("nan"), 1.0)]
    b.add(group("t", *members_), missing=1)
    batch, dropped = b.take(version=0)
    assert batch is not None and batch[0].members == [members_[-1]]
    assert batch[0].members[0].reward_components["group_dropped"] == 2
    assert [d.reason for d in dropped] == ["dropped_non_finite"]
    b.add(flat("all-bad", float("nan")))  # nothing of it is held; its member is reported
    assert len(b._groups) == 0 and [d.reason for d in b.take(version=0)[1]] == ["dropped_non_finite"]


def test_buffer_drops_too_stale_and_invalid() -> None:
    b = _buffer()
    b.add(
        group("g1", traj("g1", 1, versions=(0, 2)), traj("g1", 0, versions=(2,)))
    )  # oldest token: version 0
    empty = Trajectory(
        id="e", task=Task(id="x", task_type="calc"), turns=[Turn(role="env", token_ids=[1])], group_id="g3"
    )
    b.add(group("g3", empty))
    _, dropped = b.take(version=2)  # age 2 > max_staleness 1
    reasons = sorted(d.reason for d in dropped)
    assert reasons == ["dropped_invalid", "dropped_stale"]
    assert [d.age for d in dropped if d.reason == "dropped_stale"] == [2]
    assert len(b._groups) == 1 and b._groups["g1"].members[0].reward_components["group_dropped"] == 1


def test_buffer_never_returns_stale_samples() -> None:
    b = _buffer()
    for v in range(6):
        b.add(flat(f"g{v}", 1, 0, versions=(v,)))
    batch, _ = b.take(version=5)
    assert batch is not None
    assert all(5 - (t.oldest_version() or 0) <= 1 for t in members(batch))


def test_buffer_capacity_evicts_and_reports() -> None:
    b = replay_buffer(
        batch_size=2,
        staleness=StalenessPolicy.from_config("async", 9, 2, "drop"),
        capacity_steps=1,
    )
    for i in range(5):
        b.add(flat(f"g{i}", 1))
    b._groups.move_to_end("g4")
    dropped = b._evict()
    assert len(dropped) == 3 and all(d.reason == "dropped_evicted" for d in dropped)
    assert len(b) == 2


def test_buffer_orders() -> None:
    b = replay_buffer(
        batch_size=2, staleness=StalenessPolicy.from_config("async", 9, 2, "drop"), sampling="freshness"
    )
    b.add(flat("old", 1, 0, versions=(0,)))
    b.add(flat("new", 1, 0, versions=(3,)))
    batch, _ = b.take(version=3)
    assert batch is not None and [g.id for g in batch] == ["new"]
    b = replay_buffer(
        batch_size=2, staleness=StalenessPolicy.from_config("async", 9, 2, "drop"), sampling="advantage"
    )
    b.add(flat("flat", 1, 1))
    b.add(flat("spread", 1, 0))
    batch, _ = b.take(version=0)
    assert batch is not None and [g.id for g in batch] == ["spread"]


def test_buffer_task_mix() -> None:
    b = replay_buffer(
        batch_size=4,
        staleness=StalenessPolicy.from_config("async", 9, 4, "drop"),
        task_mix={"a": 0.5, "b": 0.5},
    )
    for i in range(6):
        b.add(flat(f"a{i}", 1, task_type="a"))
    for i in range(2):
        b.add(flat(f"b{i}", 1, task_type="b"))
    batch, _ = b.take(version=0)
    assert batch is not None
    assert sorted(t.task.task_type for t in members(batch)) == ["a", "a", "b", "b"]


def test_buffer_behaviour_kl_priority_and_length_mix() -> None:
    scores = {"near": 0.01, "far": 0.5}
    b = replay_buffer(
        batch_size=1,
        staleness=StalenessPolicy.from_config("async", 9, 1, "drop"),
        sampling="behaviour_kl",
        scorer=lambda g: scores[g[0].group_id],
    )
    b.add(flat("near", 1))
    b.add(flat("far", 1))
    batch, _ = b.take(version=0)
    assert batch is not None and batch[0].id == "far"
    b = replay_buffer(
        batch_size=4,
        staleness=StalenessPolicy.from_config("async", 9, 4, "drop"),
        length_mix={"short": 0.5, "long": 0.5},
        length_split=8,
    )
    for i in range(5):
        b.add(flat(f"s{i}", 1))  # 2 + 2 + 1 = 5 tokens: short
    for i in range(2):
        b.add(flat(f"l{i}", 1, versions=(0, 0, 0)))  # 11 tokens: long
    batch, _ = b.take(version=0)
    assert batch is not None
    assert sorted(len(t.token_ids()) > 8 for t in members(batch)) == [False, False, True, True]


# ---- credit ----------------------------------------------------------------------------------------
def test_outcome_advantages_on_model_tokens_only() -> None:
    batch = [traj("g", 1.0), traj("g", 0.0)]
    T = len(batch[0].token_ids())
    from asyncrl.credit.outcome import token_advantages

    adv, _ = token_advantages(groups_of(batch), T, CreditConfig(baseline="dr_grpo"))
    mask = torch.tensor([t.loss_mask() for t in batch], dtype=torch.bool)
    assert torch.all(adv[~mask] == 0)
    assert torch.allclose(adv[0][mask[0]], torch.tensor(0.5))
    assert torch.allclose(adv[1][mask[1]], torch.tensor(-0.5))


def test_process_credit_reward_to_go() -> None:
    from asyncrl.credit.outcome import token_advantages

    t = traj("g", 0.0, versions=(0, 0))
    t.turns[1].process_reward = 1.0  # first model turn
    t.turns[3].process_reward = 0.0
    adv, _ = token_advantages(
        groups_of([t]),
        len(t.token_ids()),
        CreditConfig(strategy="process", baseline="dr_grpo", process_weight=0.5, gamma=1.0),
    )
    # reward-to-go: turn 1 -> 1.0, turn 2 -> 0.0; centred by their mean 0.5; times alpha 0.5
    assert adv[0, 2].item() == pytest.approx(0.25) and adv[0, 5].item() == pytest.approx(-0.25)


# ---- learner ---------------------------------------------------------------------------------------
def _tiny_args() -> list[str]:
    return [
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.num_kv_heads=1",
        "model.intermediate_size=64",
        "trainer.lr=0.01",
        "rollout.group_size=2",
        "trainer.batch_size=2",
    ]


def _tiny_cfg() -> RunConfig:
    return load_config(None, _tiny_args())


def test_learner_step_moves_probability_towards_positive_advantage() -> None:
    from asyncrl.policy import Policy
    from asyncrl.policy.scoring import token_logprobs
    from asyncrl.trainer.learner import Learner, collate

    torch.manual_seed(0)
    cfg = _tiny_cfg()
    policy = Policy.build(cfg.model)
    good, bad = traj("g", 1.0), traj("g", 0.0)
    good.turns[1].token_ids = [20, 21]
    bad.turns[1].token_ids = [30, 31]
    # behaviour log-probs = the current policy's (on-policy)
    for t in (good, bad):
        b = collate([t], 0)
        with torch.no_grad():
            lp = token_logprobs(policy.model, b.ids, b.attn)[0]
        t.turns[1].logprobs = lp[2:4].tolist()
    before = [
        token_logprobs(policy.model, collate([t], 0).ids, collate([t], 0).attn)[0, 2:4].sum()
        for t in (good, bad)
    ]
    learner = Learner(cfg, policy)
    for _ in range(3):
        m = learner.step(groups_of([good, bad]), version=0)
    assert m["train/skipped"] == 0
    after = [
        token_logprobs(policy.model, collate([t], 0).ids, collate([t], 0).attn)[0, 2:4].sum()
        for t in (good, bad)
    ]
    assert after[0] > before[0] and after[1] < before[1]


def test_learner_skips_non_finite_step() -> None:
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner

    cfg = _tiny_cfg()
    policy = Policy.build(cfg.model)
    learner = Learner(cfg, policy)
    params = [p.detach().clone() for p in policy.model.parameters()]
    bad = traj("g", float("nan"))
    m = learner.step(groups_of([bad, traj("g", 1.0)]), version=0)
    assert m["train/skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(params, policy.model.parameters(), strict=True))


def _opt_state(learner: object) -> list[torch.Tensor]:
    """Every tensor of the learner's optimiser state, cloned, in a fixed order."""
    state = learner.optimizer.state_dict()["state"]  # type: ignore[attr-defined]
    return [v.clone() for k in sorted(state) for _, v in sorted(state[k].items())]


def test_learner_skipped_minibatch_step_leaves_weights_and_optimiser_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With two minibatches, a non-finite loss in the second undoes the first one's update too."""
    import asyncrl.trainer.learner as learner_mod
    from asyncrl.policy import Policy

    torch.manual_seed(0)
    cfg = load_config(None, [*_tiny_args(), "trainer.minibatches=2"])
    policy = Policy.build(cfg.model)
    learner = learner_mod.Learner(cfg, policy)
    batch = [traj("g", 1.0), traj("g", 0.0)]
    learner.step(groups_of(batch), version=0)  # a finite step first: the optimiser has moments to protect
    params = [p.detach().clone() for p in policy.model.parameters()]
    moments, lr = _opt_state(learner), learner.scheduler.get_last_lr()
    assert moments, "the finite step should have created optimiser state"
    real, calls = learner_mod.policy_loss, []

    def nan_on_second(*args: object, **kwargs: object) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(1)
        return (loss * float("nan") if len(calls) == 2 else loss), metrics

    monkeypatch.setattr(learner_mod, "policy_loss", nan_on_second)
    m = learner.step(groups_of(batch), version=1)
    assert len(calls) == 2 and m["train/skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(params, policy.model.parameters(), strict=True))
    after = _opt_state(learner)
    assert len(after) == len(moments) and all(torch.equal(a, b) for a, b in zip(moments, after, strict=True))
    assert learner.scheduler.get_last_lr() == lr


# ---- weight follower -------------------------------------------------------------------------------
class _Engine(GenerationEngine):
    def __init__(self) -> None:
        self.version = -1
        self.loaded: list[int] = []

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]
    ) -> list[Sample]:  # pragma: no cover - unused
        raise NotImplementedError

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:
        self.version = version
        self.loaded.append(version)


def test_corrupt_latest_snapshot_keeps_previous_version(tmp_path: Path) -> None:
    from asyncrl.config import LocalWeightsConfig
    from asyncrl.rollout.worker import WeightFollower
    from asyncrl.telemetry.jsonl import MetricWriter
    from asyncrl.weights import make_weight_store

    store = make_weight_store(LocalWeightsConfig(keep=5), tmp_path)
    engine = _Engine()
    metrics = MetricWriter(tmp_path / "m.jsonl", role="rollout-0")
    follower = WeightFollower(store, engine, metrics, "rollout-0")
    store.publish(0, {"w": torch.zeros(4)}, step=0)
    follower.refresh()
    assert engine.version == 0
    store.publish(1, {"w": torch.ones(4)}, step=1)
    blob = next((tmp_path / "weights").glob("v*1/model.safetensors"))
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    follower.refresh()
    assert engine.version == 0 and follower.fallbacks == 1 and follower.newest_valid() == 0
    follower.refresh()  # reported once, not retried
    assert follower.fallbacks == 1
    metrics.close()
    assert "weights/fallback" in (tmp_path / "m.jsonl").read_text()
    store.publish(2, {"w": torch.full((4,), 2.0)}, step=2)
    follower.refresh()
    assert engine.version == 2 and engine.loaded == [0, 2]


def test_config_cross_checks() -> None:
    from asyncrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"multiple of rollout\.group_size"):
        load_config(None, ["trainer.batch_size=10", "rollout.group_size=4"])
    with pytest.raises(ConfigError, match="sync_every"):
        load_config(None, ["trainer.sync_every=3", "control.mode=sync"])


def test_unused_model_config_is_valid() -> None:
    assert ModelConfig().hidden_size == 64


def _role_env(out: str) -> None:
    import os

    Path(out).write_text(os.environ.get("ASYNCRL_TEST_PROBE", "unset"))


def test_the_launcher_starts_roles_as_launcher_start_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``launcher.start``: spawned roles, or roles forked from a server that still get the launcher's
    environment of the moment they start, not the server's."""
    from asyncrl.launch import make_launcher
    from asyncrl.launch.local import LocalLauncher

    spawn = make_launcher(LocalLauncherConfig(start="spawn"))
    assert isinstance(spawn, LocalLauncher) and spawn._ctx.get_start_method() == "spawn"
    launcher = make_launcher(LocalLauncherConfig(start="forkserver"))
    assert isinstance(launcher, LocalLauncher) and launcher._ctx.get_start_method() == "forkserver"
    for value in ("first", "second"):  # the server, started by the first role, never saw "second"
        monkeypatch.setenv("ASYNCRL_TEST_PROBE", value)
        launcher.start(f"role-{value}", _role_env, str(tmp_path / value))
        launcher.stop(f"role-{value}", timeout=120)
        assert launcher.exitcode(f"role-{value}") == 0
        assert (tmp_path / value).read_text() == value
    from asyncrl.launch.local import _PRELOAD

    for name in _PRELOAD:  # the server skips a module that does not import, silently: each role would pay it
        importlib.import_module(name)
