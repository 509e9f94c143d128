"""Cost ledger arithmetic, waste invariants, the estimator formula, and the cost CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.config import CostConfig, PriceConfig
from asyncrl.cost.estimate import Assumptions, estimate
from asyncrl.cost.ledger import Usage, collect_usage, price
from asyncrl.telemetry.reports import decode_rows

ROOT = Path(__file__).resolve().parents[1]
CFG = CostConfig(
    device="cpu",
    prices=PriceConfig(
        device_hour={"cpu": 3.6}, cpu_core_hour=0.36, env_call=0.001, gb_stored_month=1.0, gb_transferred=2.0
    ),
)
# device: $0.001/s, cpu: $0.0001/s


def rows() -> list[dict[str, object]]:
    return [
        {"time": 1.0, "role": "trainer", "pid": 10, "alive_s": 5.0, "trainer/busy_seconds": 1.0},
        {
            "time": 2.0,
            "role": "trainer",
            "pid": 10,
            "alive_s": 50.0,
            "trainer/busy_seconds": 30.0,
            "trainer/tokens_trained": 600.0,
            "trainer/tokens_processed": 1000.0,
            "trainer/zero_adv_tokens": 100.0,
            "trainer/zero_adv_model_tokens": 40.0,
            "trainer/dropped_stale_tokens": 50.0,
            "trainer/samples_trained": 20.0,
            "trainer/bytes_published": 1e9,
            "queue/bytes_in": 1e9,
            "trainer/truncated_tokens": 100.0,
        },
        # a rollout worker that was killed (pid 20) and its restart (pid 21): both count
        {
            "time": 1.5,
            "role": "rollout-0",
            "pid": 20,
            "alive_s": 20.0,
            "rollout/gen_busy_seconds": 10.0,
            "rollout/tokens": 400.0,
            "rollout/episodes": 10.0,
            "rollout/env_calls": 30.0,
            "rollout/env_seconds": 3.0,
        },
        {
            "time": 3.0,
            "role": "rollout-0",
            "pid": 21,
            "alive_s": 30.0,
            "rollout/gen_busy_seconds": 20.0,
            "rollout/tokens": 600.0,
            "rollout/episodes": 15.0,
            "rollout/env_calls": 45.0,
            "rollout/env_seconds": 4.5,
            "rollout/env_retries": 3.0,
            "cost/reward_seconds": 2.0,
            "cost/reward_cache_hits": 3.0,
            "cost/reward_cache_misses": 1.0,
        },
        {"time": 3.1, "role": "rollout-0", "event": "weights/fallback"},
    ]


def test_usage_adds_up_every_incarnation() -> None:
    u = collect_usage(decode_rows(rows()), wall_seconds=50.0)
    assert u.devices == 2
    assert u.rollout_alive_s == 50.0 and u.rollout_busy_s == 30.0
    assert u.tokens_generated == 1000.0 and u.samples_generated == 25.0
    assert u.env_calls == 75.0 and u.env_retries == 3.0
    assert u.tokens_masked == 400.0
    # orchestrator-observed lifetimes replace self-reports, and a process that never reported counts
    u2 = collect_usage(
        decode_rows(rows()),
        wall_seconds=50.0,
        lifetimes={
            ("trainer", 10): 52.0,
            ("rollout-0", 20): 21.0,
            ("rollout-0", 21): 31.0,
            ("rollout-1", 30): 4.0,
        },
    )
    assert u2.trainer_alive_s == 52.0 and u2.rollout_alive_s == 56.0 and u2.devices == 3


def test_hand_priced_components_and_waste() -> None:
    u = collect_usage(decode_rows(rows()), wall_seconds=50.0)
    c = price(u, CFG, success_gain_points=10.0)
    comp = c.components
    assert comp["rollout_device"] == pytest.approx(50 * 0.001)
    assert comp["trainer_device"] == pytest.approx(50 * 0.001)
    assert comp["reward"] == pytest.approx(2 * 0.0001)
    assert comp["environment"] == pytest.approx(75 * 0.001 + 7.5 * 0.0001)
    assert comp["transfer"] == pytest.approx(2.0 * 2.0)  # 1 GB queue + 1 GB weights
    assert c.total == pytest.approx(sum(comp.values()))
    w = c.waste
    assert w["idle_devices"] == pytest.approx((50 - 30) * 0.001 + (50 - 30) * 0.001)
    gen_tok = 30 * 0.001 / 1000  # busy generation cost per token
    train_tok = 30 * 0.001 / 1000  # busy training cost per processed token
    assert w["stale_dropped"] == pytest.approx(50 * gen_tok)
    assert w["early_terminated"] == pytest.approx(100 * gen_tok)
    assert w["zero_advantage"] == pytest.approx(40 * gen_tok + 100 * train_tok)
    assert w["masked_tokens"] == pytest.approx((400 - 60) * train_tok)
    assert w["failed_env_calls"] == pytest.approx(3 * comp["environment"] / 75)
    assert c.efficiency["usd_per_trained_sample"] == pytest.approx(c.total / 20)
    assert c.efficiency["usd_per_success_point"] == pytest.approx(c.total / 10)
    assert c.efficiency["reward_cache_hit_rate"] == pytest.approx(0.75)


def test_waste_is_a_subset_of_the_total() -> None:
    import random

    rng = random.Random(0)
    for _ in range(200):
        u = Usage(wall_seconds=100, rollout_alive_s=rng.uniform(1, 100), trainer_alive_s=rng.uniform(1, 100))
        u.rollout_busy_s = rng.uniform(0, u.rollout_alive_s)
        u.trainer_busy_s = rng.uniform(0, u.trainer_alive_s)
        u.tokens_generated = rng.uniform(100, 1000)
        u.tokens_processed = rng.uniform(100, 1000)
        u.tokens_trained = rng.uniform(0, u.tokens_processed)
        # consistent counts: trained model tokens <= generated; disjoint stale / truncated / zero-advantage
        u.tokens_trained = min(u.tokens_trained, u.tokens_generated)
        u.tokens_dropped_stale = rng.uniform(0, u.tokens_generated - u.tokens_trained)
        u.zero_adv_model_tokens = rng.uniform(0, u.tokens_trained)
        u.tokens_truncated = rng.uniform(0, u.tokens_trained - u.zero_adv_model_tokens)
        u.zero_adv_tokens = u.zero_adv_model_tokens + rng.uniform(0, u.tokens_processed - u.tokens_trained)
        u.env_calls = rng.uniform(1, 100)
        u.env_retries = rng.uniform(0, u.env_calls)
        c = price(u, CFG)
        assert c.waste_total <= c.total + 1e-12
        assert all(v >= 0 for v in c.waste.values())
        dev_busy = (u.rollout_busy_s + u.trainer_busy_s) * 0.001
        device_waste = sum(v for k, v in c.waste.items() if k != "failed_env_calls")
        assert device_waste <= c.components["rollout_device"] + c.components["trainer_device"] + 1e-12
        assert device_waste - c.waste["idle_devices"] <= dev_busy + 1e-12


def test_estimator_formula() -> None:
    a = Assumptions(
        trajectories=1000,
        tokens_per_trajectory=50,
        rollout_tokens_per_s=100,
        train_tokens_per_s=250,
        env_calls_per_trajectory=3,
        env_seconds_per_call=2,
        reward_seconds_per_trajectory=0.5,
        value_model_fraction=0.5,
        transfer_bytes_per_trajectory=1e6,
        stored_bytes=1e9,
        wall_seconds=30 * 24 * 3600,
        startup_device_seconds=10,
    )
    e = estimate(a, CFG)
    assert e["rollout_device"] == pytest.approx(1000 * 50 / 100 * 0.001)
    assert e["trainer_device"] == pytest.approx(1000 * 50 / 250 * 0.001)
    assert e["value_model"] == pytest.approx(0.5 * e["trainer_device"])
    assert e["environment"] == pytest.approx(3000 * (0.001 + 2 * 0.0001))
    assert e["reward"] == pytest.approx(1000 * 0.5 * 0.0001)
    assert e["storage"] == pytest.approx(1.0 * 1.0)
    assert e["transfer"] == pytest.approx(1000 * 1e6 / 1e9 * 2.0)
    assert e["startup_device"] == pytest.approx(0.01)
    # estimating with a run's own measured figures reproduces its steady-state device cost
    u = collect_usage(decode_rows(rows()), wall_seconds=50.0)
    from asyncrl.cost.estimate import assumptions_from_usage

    back = estimate(assumptions_from_usage(u), CFG)
    assert back["rollout_device"] == pytest.approx(price(u, CFG).components["rollout_device"])
    assert back["environment"] == pytest.approx(price(u, CFG).components["environment"])


def test_cost_estimate_cli_json_and_errors() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "cost",
            "estimate",
            "configs/demo.yaml",
            "--trajectories",
            "1000",
            "--tokens-per-trajectory",
            "50",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["assumptions"]["trajectories"] == 1000
    assert out["total_usd"] == pytest.approx(sum(out["components_usd"].values()))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "cost",
            "estimate",
            "configs/demo.yaml",
            "--trajectories",
            "-5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert (
        res.returncode == 2 and "--trajectories must be >= 0" in res.stderr and "Traceback" not in res.stderr
    )
    res = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "cost", "report", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 2 and "no cost.json" in res.stderr
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "cost",
            "estimate",
            "configs/demo.yaml",
            "--set",
            "cost.device=tpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 2 and "cost.device 'tpu' has no price" in res.stderr


def test_cost_report_of_a_short_run_says_the_estimate_is_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No metric row in the first 10% of the run: no "-100.0%" error, but a reason."""
    import yaml

    from asyncrl.config import RunConfig
    from asyncrl.jobs.cost_report import cost_report, render_report

    late = [  # both roles started at t=0 and first reported at t=100: nothing before the 10% cut
        {"time": 100.0, "role": "trainer", "pid": 1, "alive_s": 100.0, "trainer/tokens_trained": 600.0},
        {
            "time": 100.0,
            "role": "rollout-0",
            "pid": 2,
            "alive_s": 100.0,
            "rollout/tokens": 400.0,
            "rollout/episodes": 10.0,
        },
    ]
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "roles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in late))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(RunConfig().model_dump(mode="json")))
    usage = collect_usage(decode_rows(late), wall_seconds=100.0)
    (tmp_path / "cost.json").write_text(json.dumps(price(usage, CFG).to_dict()))
    report = cost_report(tmp_path)
    early = report["estimate_from_first_10pct"]
    assert early["available"] is False and early["relative_error"] is None
    render_report(report, tmp_path)
    out = capsys.readouterr().out
    assert "-100.0%" not in out and "unavailable" in out and "first 10%" in out, out


def test_cost_estimate_assumptions_from_config_then_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrl.cli import main
    from asyncrl.config import CostAssumptionsConfig

    monkeypatch.chdir(ROOT)
    base = ["cost", "estimate", "configs/demo.yaml", "--json"]
    assert main([*base, "--set", "cost.assumptions.tokens_per_trajectory=50"]) == 0
    a = json.loads(capsys.readouterr().out)["assumptions"]
    assert a["tokens_per_trajectory"] == 50  # from the config
    assert a["trajectories"] == CostAssumptionsConfig().trajectories  # the config section's default
    assert (
        main([*base, "--set", "cost.assumptions.tokens_per_trajectory=50", "--tokens-per-trajectory", "70"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["assumptions"]["tokens_per_trajectory"] == 70  # a flag wins
    assert main([*base, "--set", "cost.assumptions.trajectories=-1"]) == 2
    assert "cost.assumptions.trajectories = -1: must be >= 0" in capsys.readouterr().err


def test_cost_estimate_help_is_the_config_field_docs(capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.cli import main
    from asyncrl.config import CostAssumptionsConfig

    with pytest.raises(SystemExit):
        main(["cost", "estimate", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse re-wraps lines (also at hyphens)
    for name, field in CostAssumptionsConfig.model_fields.items():
        assert f"--{name.replace('_', '-')}X" in help_text
        assert "".join((field.description or "").split()) in help_text, name
