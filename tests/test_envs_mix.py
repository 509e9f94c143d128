"""``env.kind: mix``: config errors, weighted sampling, routing, per-environment held-out splits, buckets,
per-environment figures (a broken member shows in its own row only) and ``env check`` of every member."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from asyncrl.config import EnvConfig, load_config, quiet_env
from asyncrl.control.buckets import bucket_of, bucket_prior, buckets_of_source, sample_in_bucket
from asyncrl.control.directives import Directives, group_report
from asyncrl.control.worker import WorkerControl
from asyncrl.envs import check_heldout, make_env, make_task_source
from asyncrl.envs.base import StepResult
from asyncrl.envs.calculator import CalculatorEnv
from asyncrl.envs.check import check_environment
from asyncrl.envs.mix import MixTaskSource
from asyncrl.errors import UserError
from asyncrl.orchestrator.mix import curriculum_shares, env_metrics
from asyncrl.records import Group, Lifecycle, Task, Trajectory, Turn
from asyncrl.rollout.heldout import heldout_tasks, summarise
from asyncrl.telemetry.report_envs import EnvTally, env_blocks, per_env
from helpers import run_texts_sync


def mix(*members: dict[str, Any]) -> EnvConfig:
    return EnvConfig(kind="mix", mix=list(members))


def member(name: str, kind: str, weight: float = 1.0, **env: Any) -> dict[str, Any]:
    return {"name": name, "weight": weight, "env": {"kind": kind, "heldout_size": 8, **env}}


CALC_KB = mix(member("arith", "calculator", 3.0), member("kb", "kb_lookup", 1.0))


# -- config -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "mix"}, "env.kind 'mix' needs the env.mix list"),
        ({"kind": "mix", "mix": []}, "env.kind 'mix' needs the env.mix list"),
        (
            {"kind": "calculator", "mix": [member("a", "calculator")]},
            "env.mix is set but env.kind is 'calculator'",
        ),
        ({"kind": "mix", "mix": [member("a", "calculator"), member("a", "kb_lookup")]}, "'a' is used twice"),
        (
            {
                "kind": "mix",
                "mix": [{"name": "outer", "env": {"kind": "mix", "mix": [member("x", "calculator")]}}],
            },
            "is itself a mix: nested mixes are not supported",
        ),
        ({"kind": "mix", "mix": [member("a", "agent", path="m:run")]}, "cannot be one member of a mix"),
        ({"kind": "mix", "mix": [member("a", "calculator", weight=0)]}, "greater than 0"),
        ({"kind": "mix", "mix": [member("bad name", "calculator")]}, "should match pattern"),
    ],
)
def test_config_mistakes_are_refused_in_words(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EnvConfig(**data)


def test_each_member_keeps_its_own_config() -> None:
    cfg = mix(
        member("a", "calculator", min_difficulty=1, max_difficulty=1),
        member("d", "dataset", dataset={"path": "x.jsonl"}),
    )
    a, d = (m.env for m in cfg.mix or [])
    assert (a.min_difficulty, a.max_difficulty) == (1, 1)
    assert (d.min_difficulty, d.max_difficulty) == (0, 100)  # an answer kind's own default range


# -- sampling, routing, held-out ----------------------------------------------------------------------
def test_sampling_follows_the_weights_and_the_seed() -> None:
    source = make_task_source(CALC_KB)
    draws = [source.sample(random.Random(7)).id for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed, the same task
    counts = Counter(source.sample(rng).env for rng in [random.Random(0)] for _ in range(4000))
    assert set(counts) == {"arith", "kb"}
    assert 0.72 < counts["arith"] / 4000 < 0.78  # weight 3 : 1
    one = source.sample(random.Random(1))
    assert one.id.startswith(f"{one.env}/")


def test_episodes_are_routed_to_their_member() -> None:
    source = make_task_source(CALC_KB)
    env = make_env(CALC_KB, 3)
    for task in source.heldout()[:4]:
        results = run_texts_sync(env, task, env.solve(task))
        assert results[-1].outcome == "success", (task.env, results[-1])
        assert [t.name for t in env.tools] == (["calc"] if task.env == "arith" else ["lookup"])
    stray = Task(id="x", task_type="arithmetic", difficulty=2, env="nope")
    with pytest.raises(UserError, match=r"'nope', which is not a member of env\.mix"):
        run_texts_sync(env, stray, ["<answer>1</answer>"])


def test_each_member_has_its_own_disjoint_heldout_split() -> None:
    source = make_task_source(CALC_KB)
    assert isinstance(source, MixTaskSource)
    held = check_heldout(source, CALC_KB)
    assert Counter(t.env for t in held) == {"arith": 8, "kb": 8}
    assert [t.env for t in held[:4]] == ["arith", "kb", "arith", "kb"]  # a limit still covers both
    for name, m in zip(("arith", "kb"), CALC_KB.mix or [], strict=True):
        own = make_task_source(m.env).heldout()
        assert [t.id for t in held if t.env == name] == [f"{name}/{t.id}" for t in own]
        held_ids = {t.id for t in held if t.env == name}
        rng = random.Random(5)
        trained = [source.members[name].sample(rng) for _ in range(300)]
        assert not {f"{name}/{t.id}" for t in trained} & held_ids


def test_a_member_short_of_heldout_tasks_is_named(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(12))
    )
    cfg = mix(member("arith", "calculator"), member("tiny", "dataset", dataset={"path": str(rows)}))
    with pytest.raises(UserError, match=r"env\.mix member 'tiny'"):
        check_heldout(make_task_source(cfg), cfg)


def test_evaluation_turns_off_every_members_faults() -> None:
    cfg = mix(member("a", "calculator", faults={"exception_rate": 1.0}), member("b", "kb_lookup"))
    quiet = quiet_env(cfg)
    assert [m.env.faults.exception_rate for m in quiet.mix] == [0.0, 0.0]
    assert (cfg.mix or [])[0].env.faults.exception_rate == 1.0


# -- buckets and the curriculum -------------------------------------------------------------------------
def test_buckets_carry_the_environment() -> None:
    source = make_task_source(CALC_KB)
    buckets = buckets_of_source(source)
    assert buckets == ["arith/arithmetic:2", "arith/arithmetic:3", "kb/multi_hop:2", "kb/multi_hop:3"]
    task = sample_in_bucket(source, random.Random(0), "kb/multi_hop:3")
    assert (task.env, task.difficulty, bucket_of(task)) == ("kb", 3, "kb/multi_hop:3")
    prior = bucket_prior(source)
    assert prior["arith/arithmetic:2"] == pytest.approx(0.375) and prior["kb/multi_hop:3"] == pytest.approx(
        0.125
    )
    assert curriculum_shares({}, prior) == pytest.approx({"arith": 0.75, "kb": 0.25})
    # the curriculum turns arith's buckets down: kb's share rises
    shares = curriculum_shares({"arith/arithmetic:2": 0.1, "arith/arithmetic:3": 0.1}, prior)
    assert shares["kb"] > 0.7
    assert (
        bucket_of(Task(id="t", task_type="arithmetic", difficulty=2)) == "arithmetic:2"
    )  # no mix: as before


# -- per-environment figures ------------------------------------------------------------------------------
def play(env: Any, task: Task) -> Trajectory:
    """One scripted episode (the reference solution) as the trajectory the worker would report."""
    results: list[StepResult] = run_texts_sync(env, task, env.solve(task))
    turns = [Turn(role="env", token_ids=[1, 2])]
    for res in results:
        turns.append(Turn(role="model", token_ids=[3, 4, 5], fault=res.fault))
    last = results[-1]
    ok = last.done and last.outcome == "success"
    return Trajectory(
        id=f"tr-{task.id}",
        task=task,
        turns=turns,
        final_reward=last.reward if last.done else 0.0,
        outcome="success" if ok else "failure",
        lifecycle=Lifecycle(rollout_start=1.0),
    )


def test_a_broken_member_shows_in_its_own_row_only() -> None:
    cfg = mix(
        member("good", "calculator"),
        member("broken", "calculator", faults={"exception_rate": 1.0}, guard={"retries": 0}),
    )
    source = make_task_source(cfg)
    env = make_env(cfg, 11)
    tally = EnvTally()
    trajs = []
    for task in source.heldout()[:8]:
        tr = play(env, task)
        trajs.append(tr)
        tally.observe(group_report(Group.of(task, [tr]), -1.0, 1.0))
    probe = Group.of(trajs[0].task, [trajs[0]], heldout=True)  # a held-out probe: not a training figure
    tally.observe(group_report(probe, -1.0, 1.0))
    rows = per_env(
        {"good": 1.0, "broken": 1.0},
        tally,
        {},
        summarise(trajs),
        cost_usd=10.0,
        shares={"good": 0.5, "broken": 0.5},
    )
    good, broken = rows["good"], rows["broken"]
    assert good["faults"] == 0 and broken["faults"] >= 4, rows
    assert good["train_success_rate"] == 1.0 and broken["train_success_rate"] == 0.0, rows
    assert good["final_success"] == 1.0 and broken["final_success"] == 0.0, rows
    assert good["train_episodes"] == broken["train_episodes"] == 4
    assert good["cost_usd"] + broken["cost_usd"] == pytest.approx(10.0)
    assert good["cost_usd"] / broken["cost_usd"] == pytest.approx(good["tokens"] / broken["tokens"])
    metrics = env_metrics(tally, {"good": 0.5, "broken": 0.5})
    assert metrics["env/broken/faults"] == broken["faults"] and metrics["env/good/faults"] == 0.0
    assert metrics["env/good/success_rate"] == 1.0 and metrics["env/broken/curriculum_share"] == 0.5
    html = str(env_blocks({"per_env": rows}))
    assert "broken" in html and "good" in html
    assert env_blocks({}) == []


def test_summarise_reports_each_environment() -> None:
    def traj(env: str, outcome: str) -> Trajectory:
        task = Task(id=f"{env}/t", task_type="x", env=env)
        return Trajectory(
            id=f"{env}-{outcome}-{random.random()}",
            task=task,
            turns=[Turn(role="model", token_ids=[1])],
            outcome=outcome,
        )  # type: ignore[arg-type]

    report = summarise([traj("a", "success"), traj("a", "failure"), traj("b", "failure")])
    assert report["per_env"]["a"]["success_rate"] == 0.5 and report["per_env"]["b"]["success_rate"] == 0.0
    assert report["per_env"]["a"]["episodes"] == 2
    assert "per_env" not in summarise([Trajectory(id="z", task=Task(id="t", task_type="x"), turns=[])])


def test_heldout_limit_covers_every_member() -> None:
    run = type("Run", (), {"env": CALC_KB})()
    assert {t.env for t in heldout_tasks(run, limit=2)} == {"arith", "kb"}  # type: ignore[arg-type]


# -- env check --------------------------------------------------------------------------------------------
class BrokenCalculator(CalculatorEnv):
    """A calculator whose steps raise: the check must blame this member alone."""

    def step(self, model_text: str) -> StepResult:  # type: ignore[override]
        raise RuntimeError("broken on purpose")


def test_env_check_checks_every_member_and_blames_the_broken_one() -> None:
    report = check_environment(CALC_KB, episodes=1, overlap_samples=50)
    assert report.ok, report.render()
    assert any(f.check.startswith("arith: ") for f in report.findings)
    assert any(f.check.startswith("kb: ") for f in report.findings)
    bad = mix(member("arith", "calculator"), member("oops", "plugin", path="test_envs_mix:BrokenCalculator"))
    report = check_environment(bad, episodes=1, overlap_samples=50)
    assert not report.ok
    assert report.errors and all(f.check.startswith("oops: ") for f in report.errors), report.render()


class _State:
    """The run state a worker reads its directives from: the orchestrator's curriculum weights."""

    def __init__(self, weights: dict[str, float]) -> None:
        self.doc = Directives(weights=weights)

    def directives(self) -> Directives:
        return self.doc


@pytest.mark.parametrize(
    ("weights", "low", "high"),
    [({}, 0.72, 0.78), ({"arith/arithmetic:2": 0.1, "arith/arithmetic:3": 0.1}, 0.18, 0.28)],
)
def test_workers_draw_by_member_weight_times_curriculum_weight(
    weights: dict[str, float], low: float, high: float
) -> None:
    cfg = load_config(
        None,
        [
            "env.kind=mix",
            "env.mix=[{name: arith, weight: 3, env: {kind: calculator, heldout_size: 8}},"
            " {name: kb, env: {kind: kb_lookup, heldout_size: 8}}]",
            "rollout.exploration_rate=0",
        ],
    )
    control = WorkerControl(cfg, _State(weights), "rollout-0", make_task_source(cfg.env), curriculum=True)  # type: ignore[arg-type]
    rng = random.Random(0)
    draws = [control.next_task(rng)[0].env for _ in range(2000)]
    assert low < draws.count("arith") / 2000 < high  # 3:1 by weight; the curriculum's 0.1 turns it down


@pytest.mark.parametrize("kind", ["kb_lookup", "strings", "python", "dataset", "reasoning_gym", "plugin"])
def test_any_kind_can_be_a_member(kind: str, tmp_path: Path) -> None:
    extra: dict[str, Any] = {
        "dataset": {"dataset": {"path": str(tmp_path / "rows.jsonl"), "scorer": "numeric"}},
        "reasoning_gym": {"reasoning_gym": {"datasets": [{"name": "basic_arithmetic"}]}, "max_difficulty": 0},
        "plugin": {"path": "asyncrl.envs.calculator:CalculatorEnv"},
    }.get(kind, {})
    if kind == "reasoning_gym":
        pytest.importorskip("reasoning_gym")
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"question": f"{i}+2=", "answer": str(i + 2)}) + "\n" for i in range(300))
    )
    cfg = mix(member("arith", "calculator"), member("other", kind, **extra))
    source = make_task_source(cfg)
    held = check_heldout(source, cfg)
    task = next(t for t in held if t.env == "other")
    env = make_env(cfg, 0)
    if kind == "python":  # the sandbox may be unavailable here: routing is what is tested
        assert run_texts_sync(env, task, ["<answer>0</answer>"])[-1].done
        return
    assert run_texts_sync(env, task, env.solve(task))[-1].outcome == "success"
