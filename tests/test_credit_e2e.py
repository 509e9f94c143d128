"""Every credit strategy trains end to end through ``train`` on a tiny model; ``credit show`` and
``credit ablate`` work on the resulting run. (``outcome``, the default strategy, is trained end to
end by every test in test_runtime_e2e.py.)"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.credit.samples import read_samples
from asyncrl.jobs.credit_inspect import credit_fragment
from asyncrl.jobs.train import train

pytestmark = pytest.mark.slow

TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_context=192",
    "env.kind=calculator",
    "env.min_difficulty=1",
    "env.max_difficulty=1",
    "env.max_turns=3",
    "env.heldout_size=4",
    "rollout.group_size=4",
    "rollout.concurrent_episodes=16",
    "rollout.sampling.max_new_tokens=16",
    "trainer.batch_size=8",
    "trainer.total_steps=2",
    "trainer.checkpoint_every=1",
    "trainer.sft.steps=40",
    "trainer.sft.num_demos=64",
    "trainer.sft.batch_size=16",
    "credit.sample_every=1",
    "credit.sample_size=3",
    "telemetry.log_every_s=0.5",
]

RUNS: dict[str, Path] = {}


def _rows(run_dir: Path, role: str) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    return [r for r in rows if r.get("role") == role and "event" not in r]


def trainer_rows(run_dir: Path) -> list[dict[str, Any]]:
    return _rows(run_dir, "trainer")


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        # three strategies run in `make test-long` only (the suite's 15-minute budget); value_delta
        # and tree stay here, and every strategy's maths is unit-tested in test_credit.py
        pytest.param("process", [], marks=pytest.mark.long),
        pytest.param(
            "gae", ["credit.value.kind=separate", "credit.value.hidden_size=16"], marks=pytest.mark.long
        ),
        ("value_delta", ["credit.process_weight=0"]),
        pytest.param("turn_group", [], marks=pytest.mark.long),
        ("tree", ["rollout.tree.enabled=true", "rollout.tree.points=every_turn", "env.max_difficulty=2"]),
    ],
)
def test_strategy_trains_end_to_end(strategy: str, extra: list[str], tmp_path: Path, cache_dir: Path) -> None:
    cfg = load_config(
        None, [*TINY, f"run_root={tmp_path}", f"cache_dir={cache_dir}", f"credit.strategy={strategy}", *extra]
    )
    run_dir, s = train(cfg, display=False, eval_limit=4)
    assert s["trainer_steps"] == 2 and s["samples_trained"] == 16 and s["lost_trajectories"] == 0
    rows = trainer_rows(run_dir)
    assert any("adv/mean" in r for r in rows)
    files = read_samples(run_dir)
    assert [f.step for f in files] == [1, 2] and all(f.strategy == strategy for f in files)
    for f in files:
        for sample in f.samples:
            assert [(g.start, g.end) for g in sample.segments] == sample.trajectory.segments()
    if strategy in ("gae", "value_delta"):
        last = [r for r in rows if "value/brier" in r][-1]
        assert 0.0 <= last["value/brier"] <= 1.0 and last["loss/value"] >= 0.0
        assert sorted(p.name for p in (run_dir / "credit" / "value").iterdir()) == [
            "step_00000001.safetensors",
            "step_00000002.safetensors",
        ]
        for f in files:
            for sample in f.samples:
                # the terminal boundary is the observed reward; the others are probabilities
                assert sample.segments[-1].v_after == sample.trajectory.final_reward
                assert all(g.v_before is not None and 0 < g.v_before < 1 for g in sample.segments)
    if strategy == "value_delta":  # α = 0: the segment advantages average to the outcome advantage
        for f in files:
            for sample in f.samples:
                mean = sum(g.credit for g in sample.segments) / len(sample.segments)
                assert mean == pytest.approx(sample.outcome_advantage, abs=1e-4)
    if strategy == "tree":  # leaves that went on past a turn were branched, and replays were exact
        worker = [r for r in _rows(run_dir, "rollout-0") if "rollout/tree_roots" in r][-1]
        # an episode of two or more model turns happened (more model turns than episodes delivered),
        # so there was a turn boundary to branch at: the branch check below cannot pass vacuously
        assert worker["rollout/env_calls"] > worker["rollout/episodes"] > 0
        assert worker["rollout/tree_replay_diverged"] == 0
        assert worker["rollout/tree_branch_points"] > 0
    RUNS[strategy] = run_dir


def test_credit_show_and_html_fragment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = RUNS.get("value_delta")
    assert run is not None, "needs the value_delta end-to-end run (run the whole file)"
    html_path = tmp_path / "credit.html"
    assert main(["credit", "show", str(run), "--n", "2", "--html", str(html_path)]) == 0
    out = capsys.readouterr().out
    assert "V before" in out and "credit" in out and "value_delta" in out
    frag = html_path.read_text()
    assert frag.startswith("<div class='asyncrl-credit'>") and frag.count("<table>") == 2
    assert "<script" not in frag and "http" not in frag
    assert main(["credit", "show", str(tmp_path)]) == 2  # not a run with samples: a clear error, exit 2
    assert "no credit samples" in capsys.readouterr().err
    assert "No credit samples" in credit_fragment(tmp_path)  # the report gets a fragment, not an error


def test_credit_ablate_and_replay(capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.jobs.credit_ablate import load_policy
    from asyncrl.rollout.heldout import run_episodes

    run = RUNS.get("value_delta")
    assert run is not None, "needs the value_delta end-to-end run (run the whole file)"
    assert main(["credit", "ablate", str(run), "--trajectories", "2", "--k", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["trajectories"] == 2 and rep["episodes"] == 2 * rep["segments"]
    by_traj: dict[str, list[dict[str, Any]]] = {}
    for r in rep["rows"]:
        assert r["contribution"] == pytest.approx(r["p_after"] - r["p_before"])
        by_traj.setdefault(r["trajectory"], []).append(r)
    for segs in by_traj.values():
        assert segs[-1]["p_after"] == (1.0 if segs[-1]["outcome"] == "success" else 0.0)
        for a, b in itertools.pairwise(segs):
            assert a["p_after"] == b["p_before"]
    # replaying every recorded model turn reproduces the recorded episode exactly
    sample = read_samples(run)[-1].samples[0]
    cfg = load_config(run / "config.yaml")
    policy, _ = load_policy(run, None)
    turns = [t.token_ids for t in sample.trajectory.turns if t.role == "model"]
    (again,) = asyncio.run(
        run_episodes(cfg, policy, [sample.trajectory.task], seed=cfg.seed, prefixes=[turns])
    )
    assert again.token_ids() == sample.trajectory.token_ids()
    assert again.outcome == sample.trajectory.outcome and again.final_reward == sample.trajectory.final_reward
    assert main(["credit", "ablate", str(run), "--checkpoint", "999"]) == 2


def test_credit_show_draws_the_tree_of_a_tree_group(capsys: pytest.CaptureFixture[str]) -> None:
    run = RUNS.get("tree")
    assert run is not None, "needs the tree end-to-end run (run the whole file)"
    assert main(["credit", "show", str(run), "--n", "1"]) == 0
    out = capsys.readouterr().out
    last = read_samples(run)[-1]
    assert last.strategy == "tree" and last.whole and last.groups
    # whole groups are sampled; the tree's root line counts its episodes, each node its leaves below
    for group in last.groups:
        assert {s.trajectory.group_id for s in group.samples} == {group.id}
    assert f"{len(last.groups[0].samples)} episodes" in out and "below" in out and "credit" in out
    for s in last.samples:  # measured values: V after the last segment is the episode's reward
        assert s.segments[-1].v_after == pytest.approx(s.trajectory.final_reward)
