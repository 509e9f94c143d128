"""One small real run, then everything the observe capability promises about it: TensorBoard event
files that hold the trainer's figures, periodic held-out evaluation, every metric documented, the
archive and a replay that reproduces the recorded losses, the experiment record, and a report that
renders in headless Chromium with no console errors."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.jobs.train import train
from asyncrl.telemetry.experiment import config_hash
from asyncrl.telemetry.tensorboard import read_scalars
from browser_util import chromium, open_in_browser, screenshot

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "name=observe",
    "model.max_context=320",
    "env.kind=calculator",
    "env.min_difficulty=2",
    "env.max_difficulty=3",
    "env.heldout_size=32",
    "env.latency.kind=lognormal",
    "env.latency.seconds=0.01",
    "rollout.group_size=4",
    "rollout.concurrent_episodes=32",
    "rollout.sampling.max_new_tokens=24",
    "trainer.batch_size=16",
    "trainer.total_steps=8",
    "trainer.checkpoint_every=2",
    "trainer.sft.steps=150",
    "telemetry.log_every_s=0.5",
    "telemetry.eval_every=2",
    "telemetry.eval_tasks=8",
    "telemetry.eval_nice=0",
    "telemetry.eval_idle=false",  # the periodic points below need the evaluator to compute beside training
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("observe")
    cfg = load_config(None, [*OVERRIDES, f"run_root={tmp}", f"cache_dir={tmp / 'cache'}"])
    return train(cfg, display=False, eval_limit=16)


def rows_of(run_dir: Path, role: str) -> list[dict[str, Any]]:
    path = run_dir / "metrics" / f"{role}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "event" not in r]


def test_tensorboard_holds_the_trainers_figures(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, summary = run
    (events,) = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    scalars = read_scalars(events)
    loss = {step: v for step, tag, v in scalars if tag == "loss/policy"}
    trainer = {r["step"]: r for r in rows_of(run_dir, "trainer")}
    # one point per batch that trained; a step whose every group had equal rewards trains nothing
    # (trainer.skip_equal_reward_groups) and is counted as empty instead
    trained = sorted(s for s, r in trainer.items() if "loss/policy" in r)
    empty = max(float(r.get("trainer/empty_steps", 0.0)) for r in rows_of(run_dir, "trainer"))
    assert trained and sorted(loss) == trained, (sorted(loss), trained)
    assert len(trained) + empty == summary["trainer_steps"], (trained, empty, summary["trainer_steps"])
    for step, v in loss.items():
        assert v == pytest.approx(trainer[step]["loss/policy"], rel=1e-6, abs=1e-7)  # float32 in the file
    tags = {tag for _, tag, _ in scalars}
    assert {
        "staleness/mean",
        "queue/ready",
        "throughput/rollout_samples_per_s",
        "rollout/episodes/rollout-0",
    } <= tags


def test_periodic_evaluation_on_the_heldout_split(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = run
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert evals, "the evaluator evaluated no version"
    versions = [e["version"] for e in evals]
    assert versions[0] >= 2 and all(b - a >= 2 for a, b in itertools.pairwise(versions))
    assert all(e["episodes"] == 8 for e in evals)  # telemetry.eval_tasks held-out tasks each
    rows = rows_of(run_dir, "evaluator")
    assert [r["eval/version"] for r in rows] == versions
    cost = json.loads((run_dir / "cost.json").read_text())
    assert cost["usage"]["devices"] == 2  # one rollout worker + the trainer: evaluation is not billed


def test_every_recorded_metric_is_documented(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = run
    doc = (ROOT / "docs" / "metrics.md").read_text()
    patterns = []
    for name in set(re.findall(r"`([a-z_]+/[^`\s]+)`", doc)):
        rx = re.escape(name).replace(r"\*", r"[a-z0-9_]+")
        rx = re.sub(r"\\\{[a-z_]+\\\}", r"[a-z0-9_-]+", rx)
        patterns.append(re.compile(rx + "$"))
    header = {"time", "role", "pid", "alive_s", "step"}
    keys = set()
    for path in (run_dir / "metrics").glob("*.jsonl"):
        for r in map(json.loads, path.read_text().splitlines()):
            if "event" not in r:
                keys |= set(r) - header
    missing = sorted(k for k in keys if not any(p.match(k) for p in patterns))
    assert not missing, f"metrics missing from docs/metrics.md: {missing}"


def test_replay_trains_from_the_archive_and_reproduces_the_losses(
    run: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from asyncrl.bootstrap import pinned_threads
    from asyncrl.jobs.replay import replay
    from asyncrl.policy import Policy
    from asyncrl.trainer.learner import Learner

    run_dir, summary = run
    out = replay(run_dir, save=True)
    assert out["replayed_steps"] == out["archived_steps"] == summary["trainer_steps"]
    assert out["steps_compared"] == summary["trainer_steps"]
    assert out["max_abs_diff"]["loss/policy"] < 1e-5 and out["max_abs_diff"]["train/grad_norm"] < 1e-4
    # the replayed learner ends where the run's trainer ended (its last checkpoint), whether or not
    # the tiny run's batches carried any signal
    trained = sorted((run_dir / "checkpoints").glob("step_*"))[-1] / "policy"
    want = Policy.load(trained).state_dict_tensors()
    got = Policy.load(run_dir / "replay" / "policy").state_dict_tensors()
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)
    threads: list[int] = []  # the learner steps on the trainer's one thread, not the caller's two
    step = Learner.step
    monkeypatch.setattr(
        Learner, "step", lambda self, *a: threads.append(torch.get_num_threads()) or step(self, *a)
    )
    with pinned_threads(2):
        short = replay(run_dir, steps=2)
    assert short["replayed_steps"] == 2 and threads == [1, 1]


def test_run_record_identifies_the_run(run: tuple[Path, dict[str, Any]]) -> None:
    run_dir, _ = run
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "finished"
    assert rec["config_hash"] == config_hash(load_config(run_dir / "config.yaml"))
    assert rec["seeds"]["seed"] == 0 and rec["environment"]["class"].endswith("CalculatorEnv")
    assert rec["software"]["torch"] and rec["asyncrl_version"]
    assert rec["git"] is None or re.fullmatch(r"[0-9a-f]{40}", rec["git"]["commit"])


@pytest.mark.browser
def test_report_renders_in_headless_chromium(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from asyncrl.jobs.report import write_report

    run_dir, _ = run
    page = write_report(run_dir)
    binary = chromium()
    attrs, console = open_in_browser(binary, page)
    assert attrs.get("data-report-checked") == "1", attrs
    assert attrs["data-js-errors"] == "0", attrs.get("data-js-error-messages")
    assert console == []  # the page logs nothing: any console line is an error or a leak
    assert int(attrs["data-charts-total"]) == int(attrs["data-charts-expected"]) >= 10
    assert attrs["data-charts-rendered"] == attrs["data-charts-total"], attrs["data-charts-empty"]
    shot = screenshot(binary, page, tmp_path / "report.png")
    assert shot.stat().st_size > 50_000  # a full page of charts, not a blank image
    shutil.copy(shot, run_dir / "report.png")


@pytest.mark.browser
def test_browser_check_catches_a_broken_page(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The check above can fail: a script error and a chart without data are both seen."""
    from asyncrl.jobs.report import write_report

    html = write_report(run[0], tmp_path / "r.html").read_text()
    broken = html.replace("<main>", "<main><script>notAFunction();</script>", 1).replace(
        'class="data"', 'class="nodata"', 12
    )
    (tmp_path / "broken.html").write_text(broken)
    attrs, console = open_in_browser(chromium(), tmp_path / "broken.html")
    assert attrs["data-js-errors"] == "1" and "notAFunction" in attrs["data-js-error-messages"]
    assert any("notAFunction" in line for line in console)
    assert int(attrs["data-charts-rendered"]) < int(attrs["data-charts-total"])
