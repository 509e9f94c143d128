"""Telemetry building blocks: TensorBoard event files, sinks, the trajectory archive, lifecycle traces,
flow rates, experiment records, and the HTML report (on a synthetic run directory)."""

from __future__ import annotations

import gzip
import json
import math
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import dump_yaml, load_config
from asyncrl.errors import UserError
from asyncrl.jobs.report import write_report
from asyncrl.jobs.runs import compare_runs, list_runs
from asyncrl.records import Lifecycle, Task, ToolCall, Trajectory, Turn, groups_of, members
from asyncrl.telemetry import tensorboard as tb
from asyncrl.telemetry.archive import ArchiveWriter, read_batches
from asyncrl.telemetry.flow import FlowMeter
from asyncrl.telemetry.lifecycle import batch_stats, trace
from asyncrl.telemetry.reports import RolloutFigures, WorkerReport
from asyncrl.telemetry.sinks import Sinks, scalars_of


# ---- TensorBoard event files -------------------------------------------------------------------
def test_crc32c_matches_the_standard_check_value() -> None:
    assert tb.crc32c(b"123456789") == 0xE3069283  # CRC-32C check value (RFC 3720)


HANG_NOTE = "45% of environment time (90s) went to failed calls: hangs stretched the run's wall time"


def test_event_file_round_trip_and_checksums(tmp_path: Path) -> None:
    w = tb.EventFileWriter(tmp_path)
    w.add_scalars(3, {"loss/policy": 0.25, "staleness/mean": 1.5})
    w.add_scalars(-1, {"x": -2.0})  # negative int64 steps use the 10-byte varint
    w.close()
    got = tb.read_scalars(w.path)
    assert got == [(3, "loss/policy", 0.25), (3, "staleness/mean", 1.5), ((1 << 64) - 1, "x", -2.0)]
    data = bytearray(w.path.read_bytes())
    data[-6] ^= 0xFF  # corrupt the last record's payload
    w.path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        tb.read_scalars(w.path)


# ---- sinks --------------------------------------------------------------------------------------
def _cfg(tmp: Path, *extra: str) -> Any:
    return load_config(None, [f"run_root={tmp}", *extra])


def test_scalars_of_tags_worker_keys_and_drops_headers() -> None:
    row = {"time": 1.0, "role": "rollout-1", "pid": 7, "alive_s": 3.0, "rollout/episodes": 4, "x": None}
    assert scalars_of(row) == {"rollout/episodes/rollout-1": 4.0}
    assert scalars_of({"role": "trainer", "event": "role/restart"}) == {}


def test_sinks_log_against_the_trainer_step(tmp_path: Path) -> None:
    s = Sinks(_cfg(tmp_path), tmp_path)
    s.write([{"role": "trainer", "step": 5, "time": time.time(), "loss/policy": 1.0}])
    s.write([{"role": "orchestrator", "time": time.time(), "orchestrator/paused": 1.0}])
    s.close()
    (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    assert tb.read_scalars(path) == [(5, "loss/policy", 1.0), (5, "orchestrator/paused", 1.0)]


@pytest.fixture
def fake_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "fakepkgs"
    pkg.mkdir()
    (pkg / "wandb.py").write_text(
        "calls = []\n"
        "def init(**kw): calls.append(('init', kw))\n"
        "def log(d, step): calls.append(('log', d, step))\n"
        "def finish(): calls.append(('finish',))\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    return pkg


def test_wandb_is_used_only_when_enabled_and_installed(tmp_path: Path, fake_wandb: Path) -> None:
    off = Sinks(_cfg(tmp_path, "telemetry.tensorboard=false"), tmp_path)
    off.write([{"role": "trainer", "step": 1, "loss/policy": 1.0}])
    off.close()
    assert "wandb" not in sys.modules  # disabled: never even imported
    on = Sinks(_cfg(tmp_path, "telemetry.tensorboard=false", "telemetry.wandb=true"), tmp_path)
    on.write([{"role": "trainer", "step": 2, "loss/policy": 0.5}])
    on.close()
    calls = sys.modules["wandb"].calls  # type: ignore[attr-defined]
    assert [c[0] for c in calls] == ["init", "log", "finish"]
    assert calls[1][1:] == ({"loss/policy": 0.5}, 2)


def test_enabled_but_missing_sink_sends_nothing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.telemetry import sinks

    monkeypatch.setattr(sinks, "installed", lambda module: False)
    s = Sinks(
        _cfg(tmp_path, "telemetry.tensorboard=false", "telemetry.mlflow=true", "telemetry.wandb=true"),
        tmp_path,
    )
    s.write([{"role": "trainer", "step": 1, "loss/policy": 1.0}])
    s.close()
    assert s.mlflow is None and s.wandb is None and s.tb is None
    assert sorted(n.split(" ")[0] for n in s.notes) == ["telemetry.mlflow", "telemetry.wandb"]
    assert not (tmp_path / "tensorboard").exists()


# ---- archive ------------------------------------------------------------------------------------
def traj(i: int, *, version: int = 0, reward: float = 0.0, created: float = 100.0) -> Trajectory:
    return Trajectory(
        id=f"t{i}",
        task=Task(id=f"task{i}", task_type="arith"),
        turns=[
            Turn(role="env", token_ids=[1, 2, 3]),
            Turn(
                role="model",
                token_ids=[4, 5],
                logprobs=[-0.1, -0.2],
                version=version,
                started_at=created + 1.0,
                ended_at=created + 3.0,
                env_seconds=0.5,
                tool_call=ToolCall(name="calc", arguments="1+1", ok=i % 2 == 0),
            ),
            Turn(role="tool", token_ids=[6]),
        ],
        final_reward=reward,
        outcome="success" if reward > 0 else "failure",
        group_id=f"g{i}",
        lifecycle=Lifecycle(
            created=created,
            rollout_start=created,
            rollout_end=created + 4.0,
            enqueued=created + 4.0,
            dequeued=created + 6.0,
            trained=created + 9.0,
        ),
    )


def test_archive_round_trip_keeps_batches_in_step_order(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path / "archive", pid=1)
    w.append(0, 0, groups_of([traj(0), traj(1)]))
    w.append(1, 1, groups_of([traj(2, version=1)]))
    raw = w.path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"  # gzip; frames inside are msgpack, never pickle
    batches = read_batches(tmp_path)
    assert [(b.step, b.version, [t.id for t in members(b.groups)]) for b in batches] == [
        (0, 0, ["t0", "t1"]),
        (1, 1, ["t2"]),
    ]
    assert members(batches[0].groups)[0] == traj(0)


def test_archive_survives_a_truncated_tail_and_later_writes_win(tmp_path: Path) -> None:
    w = ArchiveWriter(tmp_path / "archive", pid=1)
    w.append(0, 0, groups_of([traj(0)]))
    w.append(1, 1, groups_of([traj(1)]))
    w.path.write_bytes(w.path.read_bytes()[:-7])  # a crash in the middle of the last append
    assert [b.step for b in read_batches(tmp_path)] == [0]
    time.sleep(0.01)
    resumed = ArchiveWriter(tmp_path / "archive", pid=2)  # the restarted trainer retrains step 0
    resumed.append(0, 0, groups_of([traj(9)]))
    assert [t.id for t in members(read_batches(tmp_path)[0].groups)] == ["t9"]


def test_archive_rejects_garbage_frames(tmp_path: Path) -> None:
    folder = tmp_path / "archive"
    folder.mkdir()
    with gzip.open(folder / "trained-3.msgpack.gz", "wb") as f:
        f.write(struct.pack("<I", 3) + b"\x01\x02\x03")
    with pytest.raises(ValueError, match="not a valid archived batch"):
        read_batches(tmp_path)


# ---- lifecycle ----------------------------------------------------------------------------------
def test_lifecycle_trace_breaks_down_a_trajectorys_life() -> None:
    tr = trace(traj(0), age=2, step=5)
    assert tr["env_s"] == 0.5 and tr["generation_s"] == 2.0
    assert tr["rollout_other_s"] == pytest.approx(1.5)  # 4 s episode - 0.5 env - 2 generation
    assert (tr["queue_wait_s"], tr["buffer_wait_s"], tr["end_to_end_s"]) == (2.0, 3.0, 9.0)
    assert (tr["age"], tr["step"], tr["version"]) == (2, 5, 0)


def test_batch_stats_rates_and_distributions() -> None:
    batch = [traj(0, reward=1.0), traj(1), traj(2, reward=1.0), traj(3)]
    s = batch_stats([trace(t, 0, 1) for t in batch], batch)
    assert s["tools/success_rate"] == 0.5 and s["tools/calls_per_episode"] == 1.0
    assert (s["reward/min"], s["reward/max"]) == (0.0, 1.0)
    assert s["diversity/distinct_2"] == 0.25  # the same bigram (4, 5) in all four outputs
    assert s["lifecycle/buffer_wait_mean_s"] == 3.0


def test_flow_rates_never_go_negative_across_a_restart() -> None:
    f = FlowMeter()

    def worker(episodes: float, busy: float) -> WorkerReport:
        return WorkerReport(rollout=RolloutFigures(episodes=episodes, gen_busy_seconds=busy))

    f.rates({("rollout-0", 1): worker(100.0, 10.0)})
    time.sleep(0.05)
    out = f.rates({("rollout-0", 1): worker(100.0, 10.0), ("rollout-0", 2): worker(3.0, 0.01)})  # restarted
    assert out["throughput/rollout_samples_per_s"] > 0
    assert 0.0 <= out["idle/rollout"] <= 1.0


# ---- a synthetic run directory ------------------------------------------------------------------
def make_run(root: Path, name: str = "synth", *overrides: str, steps: int = 30, alerts: bool = True) -> Path:
    run = root / name
    (run / "metrics").mkdir(parents=True)
    cfg = load_config(None, [f"name={name}", f"run_root={root}", *overrides])
    (run / "config.yaml").write_text(dump_yaml(cfg))
    t0 = 1_800_000_000.0
    rows = []
    for s in range(1, steps + 1):
        rows.append(
            {
                "time": t0 + 2 * s,
                "role": "trainer",
                "pid": 11,
                "alive_s": 2.0 * s + 5,
                "step": s,
                "reward/success_rate": min(1.0, 0.2 + s / 50),
                "reward/success_rate_ma": min(1.0, 0.2 + s / 60),
                "reward/mean": 0.1 * math.sin(s),
                "reward/p50": 0.0,
                "loss/policy": 1.0 / s,
                "kl/behaviour_k3": 0.01 * s,
                "staleness/mean": 1 + 0.5 * math.cos(s),
                "staleness/max": 2.0,
                "queue/ready": float(10 * (s % 7)),
                "queue/leased": 5.0,
                "trainer/busy_seconds": 1.5 * s,
                "trainer/step": float(s),
                "trainer/learn_seconds": 1.2 * s,
                "trainer/publish_seconds": 0.1 * s,
                "trainer/idle_seconds": 0.5 * s,
            }
        )
        rows.append(
            {
                "time": t0 + 2 * s,
                "role": "rollout-0",
                "pid": 12,
                "alive_s": 2.0 * s + 5,
                "rollout/gen_busy_seconds": 1.2 * s,
                "rollout/prefill_seconds": 0.4 * s,
                "rollout/decode_seconds": 0.7 * s,
            }
        )
        rows.append(
            {
                "time": t0 + 2 * s + 1,
                "role": "orchestrator",
                "pid": 10,
                "alive_s": 2.0 * s + 6,
                "orchestrator/paused": float(10 <= s < 14),
            }
        )
    rows.append({"time": t0 + 30, "role": "rollout-0", "event": "role/restart"})
    for i in range(2 * steps):  # training groups: arith:3 never succeeds, arith:2 always differs
        bucket, rewards = ("arith:3", [0.0] * 8) if i % 2 else ("arith:2", [1.0, 0.0] * 4)
        outcomes = ["success" if r else "failure" for r in rewards]
        group = {
            "bucket": bucket,
            "started": t0 + i,
            "heldout": False,
            "rewards": rewards,
            "anomalies": [None] * 8,
        }
        rows.append(
            {"time": t0 + i + 1, "role": "rollout-0", "event": "rollout/group", "outcomes": outcomes, **group}
        )
    (run / "metrics" / "all.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trained = [
        dict(trace(traj(i, reward=float(i % 3 == 0), created=t0 + i), i % 3, 1 + i // 4)) for i in range(60)
    ]
    (run / "traces").mkdir()
    (run / "traces" / "trained.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trained))
    ev = {
        "success_rate": 0.3,
        "mean_reward": 0.3,
        "tool_success_rate": 0.9,
        "avg_steps": 2.0,
        "distinct_2": 0.4,
        "episodes": 16,
    }
    (run / "initial_eval.json").write_text(json.dumps({**ev, "success_rate": 0.2, "top_reply_share": 0.4}))
    (run / "final_eval.json").write_text(json.dumps({**ev, "success_rate": 0.5, "top_reply_share": 0.9}))
    (run / "evals.jsonl").write_text(json.dumps({"version": 10, "step": 10, **ev}) + "\n")
    summary = {
        "mode": "async",
        "initial_success": 0.2,
        "final_success": 0.5,
        "trainer_steps": steps,
        "samples_trained": 64 * steps,
        "wall_seconds": 70.0,
        "staleness_hist": {"0": 3, "1": 5},
        "cost_usd": 0.01,
        "env_faults": {
            "calculator": {
                "calls": 400,
                "fault_rate": 0.3,
                "faults": 36,
                "retries": 120,
                "timeouts": 40,
                "exceptions": 80,
                "malformed": 0,
                "note": HANG_NOTE,  # summarize() puts each environment's note in its row and in notes
            },
        },
        "notes": [HANG_NOTE, "(the summary's copy of the constant-reply note)"],
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "cost.json").write_text(
        json.dumps(
            {
                "total_usd": 0.01,
                "components_usd": {"rollout_device": 0.006, "trainer_device": 0.004},
                "waste_usd": {"idle_devices": 0.002, "stale_dropped": 0.0, "zero_advantage": 0.0015},
                "waste_total_share": 0.2,
                "efficiency": {"usd_per_trained_sample": 1e-5},
            }
        )
    )
    if alerts:
        (run / "alerts.jsonl").write_text(
            json.dumps(
                {
                    "time": t0 + 21,
                    "kind": "reward_hacking",
                    "bucket": "arith",
                    "evidence": {"len": 3},
                    "action": "paused bucket",
                }
            )
            + "\n"
        )
    return run


def test_runs_compare_lists_exactly_the_config_differences(tmp_path: Path) -> None:
    a = make_run(tmp_path, "a", "trainer.lr=1e-4")
    b = make_run(tmp_path, "b", "trainer.lr=3e-4", "control.max_staleness=4")
    c = compare_runs(a, b)
    assert {k for k, _, _ in c["config_diff"]} == {"name", "trainer.lr", "control.max_staleness"}
    assert ("final_success", 0.5, 0.5) in c["metrics"]
    assert [r["run"] for r in list_runs(tmp_path)] == ["a", "b"]
    with pytest.raises(UserError, match="not a run directory"):
        compare_runs(a, tmp_path / "nope")


def test_runs_cli_errors_are_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import main

    assert main(["runs", "list", "--root", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert main(["replay", str(tmp_path)]) == 2


# ---- the report ---------------------------------------------------------------------------------
def test_report_is_self_contained_with_every_section(tmp_path: Path) -> None:
    run = make_run(tmp_path)  # no credit view given: no credit section
    html = write_report(run).read_text()
    for section in (
        "overview",
        "learning",
        "freshness",
        "queue",
        "utilisation",
        "step-wall",
        "latency",
        "evaluation",
        "alerts",
        "signal",
        "cost",
    ):
        assert f'<section id="{section}">' in html
    assert 'id="credit"' not in html
    for chart in (
        "success",
        "freshness",
        "staleness-hist",
        "queue",
        "utilisation",
        "step-wall",
        "heldout",
        "latency",
        "alerts",
        "signal-share",
        "signal-success",
        "cost",
        "waste",
    ):
        assert f'<figure class="chart" id="chart-{chart}">' in html
    assert "reward_hacking" in html and "paused bucket" in html  # the alert timeline and table
    # per-step wall: step 2's interval is 2 s; the trainer learned 1.2 s of it, the worker generated 1.2 s
    assert "<td>2</td><td>2.0</td><td>1.2</td><td>0.1</td><td>0.2</td><td>0.5</td><td>1.2</td>" in html
    assert "admission paused" in html  # the paused band on the queue chart
    # learning signal per bucket: 30 groups each (windows of 32 training groups: one window per bucket)
    assert "<td>arith:2</td><td>30</td><td>100.0%</td>" in html
    assert "<td>arith:3</td><td>30</td><td>0.0%</td><td>0.0% → 0.0%</td><td>0.0%</td>" in html
    assert "<td>all</td><td>60</td><td>50.0%</td>" in html
    assert "Zero-advantage waste (cost ledger): $0.001500 (15.0% of the total cost)" in html
    # environment faults per environment, and why the wall time grew
    assert "Environment faults" in html and "<td>calculator</td><td>400</td><td>30.0%</td>" in html
    assert html.count("hangs stretched the run") == 1  # under the faults, once
    # the held-out section words the constant-reply note from the evaluations, once; not the faults section
    assert "the summary's copy" not in html
    assert html.count("90% of held-out episodes end with the same reply after RL (before RL: 40%)") == 1
    assert "<th>same reply</th>" in html and "<td>90.0%</td>" in html
    no_ns = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for external in ("http://", "https://", "<link", "@import", "url(", " src="):
        assert external not in no_ns


def test_report_includes_the_credit_view_when_available(tmp_path: Path) -> None:
    seen: list[tuple[Path, int]] = []

    def credit_fragment(run_dir: Path, n: int = 5) -> str:
        seen.append((run_dir, n))
        return "<div class='credit-test'>token credit</div>"

    run = make_run(tmp_path, alerts=False)
    html = write_report(run, tmp_path / "out" / "r.html", credit_view=credit_fragment).read_text()
    assert seen == [(run, 5)]
    assert "<div class='credit-test'>token credit</div>" in html
    assert "no alerts.jsonl in this run" in html


def test_runs_cli_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import main

    a = make_run(tmp_path, "a", "trainer.lr=1e-4")
    b = make_run(tmp_path, "b", "trainer.lr=3e-4")
    assert main(["runs", "list", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "20.0% → 50.0%" in out
    assert main(["runs", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "trainer.lr" in out and "0.0003" in out and "final_success" in out
    assert main(["runs", "compare", str(a), str(b), "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)["config_diff"]
    assert ["trainer.lr", 0.0001, 0.0003] in diff


def test_one_jsonl_reader_skips_partial_and_non_object_lines(tmp_path: Path) -> None:
    from asyncrl.telemetry.jsonl import read_jsonl, read_jsonl_dir

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n\n[1, 2]\nnot json\n{"x": 2}\n{"x": 3, "trunc')
    (tmp_path / "b.jsonl").write_text('{"x": 4}\n')
    assert read_jsonl(tmp_path / "a.jsonl") == [{"x": 1}, {"x": 2}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []
    assert [r["x"] for r in read_jsonl_dir(tmp_path)] == [1, 2, 4]


def test_step_walls_split_each_step_by_role_and_phase() -> None:
    """Hand-computed: the trainer launched at t=0 and reported steps at t=10 and t=30 (then repeated
    step 2 at the end); the worker's cumulative counters are interpolated at those instants; a
    restarted worker (new pid) counts from 0."""
    from asyncrl.telemetry.walltime import step_walls

    def tr(t: float, step: int, learn: float, publish: float, busy: float, idle: float) -> dict[str, Any]:
        return {
            "time": t,
            "role": "trainer",
            "pid": 1,
            "alive_s": t,
            "trainer/step": float(step),
            "trainer/learn_seconds": learn,
            "trainer/publish_seconds": publish,
            "trainer/busy_seconds": busy,
            "trainer/idle_seconds": idle,
            "cores/borrowed_thread_seconds": learn / 4,
        }

    def ro(t: float, pid: int, gen: float) -> dict[str, Any]:
        return {
            "time": t,
            "role": "rollout-0",
            "pid": pid,
            "rollout/gen_busy_seconds": gen,
            "rollout/prefill_seconds": gen / 4,
            "rollout/decode_seconds": gen / 2,
        }

    rows = [
        tr(10, 1, 6.0, 0.5, 7.0, 3.0),
        tr(30, 2, 20.0, 1.0, 22.0, 8.0),
        tr(31, 2, 20.0, 1.0, 22.0, 8.0),  # the final row repeats step 2
        ro(5, 7, 4.0),
        ro(20, 7, 10.0),  # killed after this row
        ro(25, 8, 2.0),  # restarted: from 0
        ro(40, 8, 8.0),
        {"time": 12.0, "role": "rollout-0", "event": "role/restart"},
    ]
    one, two = step_walls(rows)
    assert (one.step, one.wall, one.train, one.publish, one.other, one.idle) == (1, 10.0, 6.0, 0.5, 0.5, 3.0)
    assert one.generate == pytest.approx(6.0)  # 0 → 6 (t=10 between the rows at 5 and 20: 4 + 6/15·5)
    assert (two.step, two.wall, two.train, two.publish, two.other, two.idle) == (2, 20.0, 14.0, 0.5, 0.5, 5.0)
    # pid 7: 6 → 10; pid 8: 0 → 2 + 6·5/15 = 4
    assert two.generate == pytest.approx(8.0)
    assert two.prefill == pytest.approx(2.0) and two.decode == pytest.approx(4.0)

    assert two.borrowed == pytest.approx(3.5)  # the trainer's cumulative 1.5 at step 1, 5.0 at step 2
