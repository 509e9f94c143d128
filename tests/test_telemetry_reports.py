"""The typed role reports: their flat names are exactly the documented ones, and a row written by
:class:`~asyncrl.telemetry.jsonl.MetricWriter` decodes back into the report that was written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from asyncrl.telemetry.jsonl import MetricWriter, read_jsonl
from asyncrl.telemetry.reports import (
    LEARNER_NAMESPACES,
    CanaryFigures,
    EvalFigures,
    EvaluatorReport,
    Event,
    GatewayFigures,
    GroupReport,
    GuardFigures,
    LifecycleFigures,
    QueueStats,
    Report,
    RewardFigures,
    RolloutFigures,
    StalenessFigures,
    TrainerFigures,
    TrainerReport,
    WorkerReport,
    decode_row,
)

DOC = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"\n## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end > 0 else len(DOC)]


def documented(title: str) -> set[str]:
    """The metric names in the first column of the table under ``## {title}`` (rows marked as another
    role's, like ``env/fault_rate`` (orchestrator) in the workers' table, left out)."""
    names: set[str] = set()
    for line in _section(title).splitlines():
        if line.startswith("| `") and "(orchestrator)" not in line.split("|")[1]:
            names.update(re.findall(r"`([a-z_]+/[a-z0-9_{}]+)`", line.split("|")[1]))
    return names


def full(cls: type[msgspec.Struct]) -> msgspec.Struct:
    """An instance of a section with a distinct non-zero value in every field."""
    return cls(**{f: float(i + 1) for i, f in enumerate(cls.__struct_fields__)})


def test_the_worker_reports_exactly_the_documented_names() -> None:
    names = WorkerReport.names()
    assert len(names) == len(set(names))
    assert set(names) == documented("Rollout workers")


def test_the_trainer_reports_exactly_the_documented_names_besides_the_learners() -> None:
    doc = documented("Trainer")
    learner = {n for n in doc if n.split("/")[0] in LEARNER_NAMESPACES}
    assert set(TrainerReport.names()) == doc - learner
    assert {n.split("/")[0] for n in learner} <= set(LEARNER_NAMESPACES)


def test_the_evaluator_reports_exactly_the_documented_names() -> None:
    assert set(EvaluatorReport.names()) == documented("Evaluator")


def test_the_group_report_and_the_memory_figures_are_documented() -> None:
    para = DOC[DOC.index("Every finished group is also an event row `rollout/group`") :]
    para = para[: para.index("\n\n")]
    assert set(GroupReport.__struct_fields__) == {
        "bucket",
        "started",
        "heldout",
        "outcomes",
        "rewards",
        "anomalies",
        "env",
        "tokens",
        "faults",
    }
    assert all(f"`{f}`" in para for f in GroupReport.__struct_fields__)
    assert all(f"`{n}`" in DOC for n in ("mem/rss_mb", "mem/peak_rss_mb"))


def test_a_worker_report_round_trips_through_a_metric_row(tmp_path: Path) -> None:
    sent = WorkerReport(
        rollout=full(RolloutFigures),  # type: ignore[arg-type]
        guard=full(GuardFigures),  # type: ignore[arg-type]
        weights=full(CanaryFigures),  # type: ignore[arg-type]
        gateway=full(GatewayFigures),  # type: ignore[arg-type]
    )
    writer = MetricWriter(tmp_path / "rollout-0.jsonl", role="rollout-0")
    writer.report(sent)
    writer.close()
    (row,) = read_jsonl(tmp_path / "rollout-0.jsonl")
    assert row["rollout/episodes"] == 1.0 and row["gateway/open_sessions"] == 13.0  # the documented names
    got = decode_row(row)
    assert isinstance(got, WorkerReport) and got.role == "rollout-0" and got.mem is not None
    assert msgspec.structs.replace(got, role="", pid=None, time=0.0, alive_s=0.0, mem=None) == sent
    plain = decode_row({**WorkerReport().flat(), "role": "rollout-1"})  # no canary, no gateway
    assert isinstance(plain, WorkerReport) and plain.weights is None and plain.gateway is None


def test_the_trainer_report_keeps_every_learner_figure_and_its_own_win() -> None:
    learner = {"loss/policy": 0.5, "kl/ref_k3": 0.1, "reward/mean": 0.75, "reward/novel": 2.0}
    batch = {"staleness/mean": 1.5, "trainer/samples_per_s": 3.0, "lifecycle/queue_wait_mean_s": 9.0}
    report = TrainerReport.of_figures(
        {**learner, **batch},
        trainer=TrainerFigures(step=4.0, samples_trained=32.0),
        lifecycle=LifecycleFigures(queue_wait_mean_s=0.25),
        queue=QueueStats(ready=5.0, capacity=64.0),
    )
    assert report.reward == RewardFigures(mean=0.75)
    assert report.staleness == StalenessFigures(mean=1.5)
    assert report.trainer.step == 4.0 and report.trainer.samples_per_s == 3.0
    assert report.lifecycle.queue_wait_mean_s == 0.25  # the trainer's own figure wins over the batch's
    # a figure no section knows is kept (as the learner's): the row loses nothing the learner returned
    assert report.learner == {"loss/policy": 0.5, "kl/ref_k3": 0.1, "reward/novel": 2.0}
    flat = report.flat()
    assert flat["queue/ready"] == 5.0 and flat["reward/novel"] == 2.0 and "reward/std" not in flat
    again = decode_row({"role": "trainer", "pid": 7, "time": 1.0, "step": 4, **flat})
    assert isinstance(again, TrainerReport)
    assert msgspec.structs.replace(again, role="", pid=None, time=0.0) == report


def test_rows_decode_by_role_and_event() -> None:
    ev = decode_row({"role": "evaluator", "pid": 3, **EvaluatorReport(eval=full(EvalFigures)).flat()})  # type: ignore[arg-type]
    assert isinstance(ev, EvaluatorReport) and ev.eval.seconds == 9.0
    group = GroupReport(
        bucket="calc:1", started=1.0, heldout=False, outcomes=["success"], rewards=[1.0], anomalies=[None]
    )
    row = {"time": 2.0, "role": "rollout-0", "event": "rollout/group", **msgspec.to_builtins(group)}
    assert decode_row(json.loads(json.dumps(row))) == group
    other = decode_row({"time": 2.0, "role": "trainer", "event": "train/non_finite_step", "step": 3})
    assert isinstance(other, Event) and other.name == "train/non_finite_step" and other.data["step"] == 3
    orch = decode_row({"role": "orchestrator", "pid": 1, "orchestrator/paused": 1.0, "mem/peak_rss_mb": 80.0})
    assert type(orch) is Report and orch.mem is not None and orch.mem.peak_rss_mb == 80.0


def test_a_group_report_with_a_missing_field_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="started"):
        decode_row({"role": "rollout-0", "event": "rollout/group", "bucket": "a:1", "heldout": False})


def test_sums_over_workers_treat_an_absent_figure_as_zero() -> None:
    total = RolloutFigures.total([RolloutFigures(episodes=2.0), RolloutFigures(episodes=3.0, tokens=7.0)])
    assert (total.episodes, total.tokens) == (5.0, 7.0)
    assert StalenessFigures.total([StalenessFigures(mean=1.0), StalenessFigures()]) == StalenessFigures(
        mean=1.0, max=0.0
    )
