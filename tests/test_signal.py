"""Learning signal: the formula, the no-signal alert during a run, and ``asyncrl env signal`` before one.

* ``s(p, G) = 1 − p^G − (1 − p)^G`` against its loop twin (the binomial sum over mixed groups);
* a task no policy can solve fires ``no_signal`` for its bucket and the run at the window's last group
  (not one group earlier), once per excursion, and the alert survives a snapshot; a learnable task never
  fires it; a hopeless bucket beside a learnable one alerts for the bucket only, never for the run;
* ``asyncrl env signal`` on a plugin no policy can solve reports 0 % with the advice and exits 1; on a
  plugin whose groups always differ it reports the learnable band and exits 0;
* the report's per-bucket series and the summary's ``signal`` count what the group events say.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from asyncrl.config import EnvConfig, RunConfig, load_config
from asyncrl.envs import HashSplitTaskSource, StepResult
from asyncrl.orchestrator.rules import Rules
from asyncrl.records import Task
from asyncrl.signal import advice, group_size_for, signal_share, verdict
from asyncrl.telemetry.reports import GroupReport
from asyncrl.telemetry.signal import signal_series, signal_summary

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- the formula ----------------------------------------------------------------------------------
def _share_loop(p: float, g: int) -> float:
    """P(0 < successes < G) for G independent Bernoulli(p) members, summed term by term."""
    return sum(math.comb(g, k) * p**k * (1 - p) ** (g - k) for k in range(1, g))


@pytest.mark.parametrize("g", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("p", [0.0, 0.01, 0.15, 0.5, 0.9, 1.0])
def test_signal_share_is_the_binomial_sum(p: float, g: int) -> None:
    assert signal_share(p, g) == pytest.approx(_share_loop(p, g), abs=1e-12)


def test_group_size_for_is_the_smallest_size_that_reaches_the_target() -> None:
    for p in (0.01, 0.05, 0.3, 0.5, 0.9):
        g = group_size_for(p, 0.5)
        assert g is not None and signal_share(p, g) >= 0.5
        assert g == 2 or signal_share(p, g - 1) < 0.5
    assert group_size_for(0.0, 0.5) is None and group_size_for(1.0, 0.5) is None
    assert group_size_for(0.05, 0.5) == 14  # 1 - 0.95^14 - 0.05^14 = 0.512; at 13: 0.487


def test_verdicts_and_advice_name_the_knobs() -> None:
    assert [verdict(p, 0.15, 0.5) for p in (0.0, 0.05, 0.3, 0.7, 1.0)] == [
        "no_success",
        "rare",
        "learnable",
        "easy",
        "solved",
    ]
    assert "env.max_difficulty" in advice(0.0, 0.0, 8, 0.15, 0.5)
    assert "rollout.group_size 14" in advice(0.05, 0.3, 8, 0.15, 0.5)
    cold = advice(0.5, 0.0, 8, 0.15, 0.5)  # half the episodes succeed, yet no group differs
    assert "rollout.sampling.temperature" in cold
    assert "temperature" not in advice(0.5, 0.99, 8, 0.15, 0.5)


# -- the no-signal alert --------------------------------------------------------------------------
def _cfg(tmp: Path, *extra: str) -> RunConfig:
    return load_config(None, [f"run_root={tmp}", "rollout.group_size=8", "trainer.batch_size=64", *extra])


def _group(bucket: str, rewards: list[float]) -> GroupReport:
    outcomes = ["success" if r > 0 else "failure" for r in rewards]
    return GroupReport(
        bucket=bucket, started=0.0, heldout=False, outcomes=outcomes, rewards=rewards, anomalies=[None] * 8
    )


def _bernoulli(rng: random.Random, p: float) -> list[float]:
    return [float(rng.random() < p) for _ in range(8)]


def _no_signal(rules: Rules) -> list[tuple[str, str]]:
    return [(a.bucket, a.action) for a in rules.alerts.recent if a.kind == "no_signal"]


def test_an_unsolvable_task_alerts_at_the_end_of_its_window_once(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    window = cfg.signal_window()
    assert window == 4 * (64 // 8)  # window_steps trainer steps' worth of groups
    rules = Rules(cfg, tmp_path, buckets=["never:1"])
    for _ in range(window - 1):
        assert rules.feed([_group("never:1", [0.0] * 8)]) == []
    fired = rules.feed([_group("never:1", [0.0] * 8)])
    assert [(a.kind, a.bucket) for a in fired] == [("no_signal", "never:1"), ("no_signal", "")]
    run_wide = fired[1]
    assert run_wide.evidence["no_signal_share"] == 1.0 and run_wide.evidence["success"] == 0.0
    assert "no bucket has signal" in run_wide.action and "env.max_difficulty" in run_wide.action
    lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["no_signal", "no_signal"]
    assert rules.metrics()["signal/no_signal_share"] == 1.0
    for _ in range(3 * window):  # still no signal: the same excursion, no new alert
        assert rules.feed([_group("never:1", [0.0] * 8)]) == []


def test_the_alert_rearms_after_signal_returns(tmp_path: Path) -> None:
    rules = Rules(_cfg(tmp_path), None, buckets=["b:1"])
    window = rules.cfg.signal_window()
    for _ in range(window):
        rules.feed([_group("b:1", [0.0] * 8)])
    for _ in range(window):  # every group differs: the share falls below the threshold
        rules.feed([_group("b:1", [1.0, 0.0] * 4)])
    for _ in range(window):
        rules.feed([_group("b:1", [1.0] * 8)])  # solved: no difference again
    found = _no_signal(rules)
    assert len(found) == 4 and "env.min_difficulty" in found[-1][1]  # (nearly) solved: harder tasks


def test_a_learnable_task_never_alerts(tmp_path: Path) -> None:
    rules = Rules(_cfg(tmp_path), None, buckets=["a:1", "a:2"])
    rng = random.Random(0)
    for i in range(10 * rules.cfg.signal_window()):
        rules.feed([_group(f"a:{1 + i % 2}", _bernoulli(rng, 0.3))])
    assert _no_signal(rules) == []
    assert rules.metrics()["signal/no_signal_share"] < 0.3  # 0.3^8 + 0.7^8 = 6% expected


def test_a_hopeless_bucket_beside_a_learnable_one_alerts_for_the_bucket_only(tmp_path: Path) -> None:
    rules = Rules(_cfg(tmp_path), None, buckets=["easy:1", "hard:9"])
    rng = random.Random(1)
    for _ in range(3 * rules.cfg.signal_window()):
        rules.feed([_group("easy:1", _bernoulli(rng, 0.4)), _group("hard:9", [0.0] * 8)])
    assert [b for b, _ in _no_signal(rules)] == ["hard:9"]


def test_the_rule_state_survives_a_snapshot(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    rules = Rules(cfg, None, buckets=["never:1"])
    for _ in range(cfg.signal_window() - 1):
        rules.feed([_group("never:1", [0.0] * 8)])
    again = Rules(cfg, None, buckets=["never:1"])
    again.restore(json.loads(json.dumps(rules.snapshot())))
    assert len(again.feed([_group("never:1", [0.0] * 8)])) == 2


def test_the_rule_can_be_switched_off(tmp_path: Path) -> None:
    rules = Rules(_cfg(tmp_path, "orchestrator.signal.enabled=false"), None, buckets=["never:1"])
    for _ in range(2 * rules.cfg.signal_window()):
        rules.feed([_group("never:1", [0.0] * 8)])
    assert _no_signal(rules) == []


# -- the report's series and the summary ---------------------------------------------------------------
def test_signal_series_and_summary_count_the_group_events(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "orchestrator.signal.window_steps=1")  # windows of 8 groups
    groups: list[Any] = []
    for i in range(16):
        hard = GroupReport(
            bucket="hard:9",
            started=float(i),
            heldout=False,
            outcomes=["failure"] * 8,
            rewards=[0.0] * 8,
            anomalies=[None] * 8,
        )
        mixed = _group("easy:1", [1.0, 0.0] * 4 if i < 8 else [1.0] * 8)
        groups += [hard, msgspec.structs.replace(mixed, started=float(i))]
    probe = _group("easy:1", [1.0, 0.0] * 4)
    groups.append(msgspec.structs.replace(probe, heldout=True))  # a held-out probe is not counted
    series = signal_series(groups, cfg.signal_window())
    assert list(series) == ["easy:1", "hard:9", "all"]
    assert [w.signal_share for w in series["easy:1"].windows] == [1.0, 0.0]
    assert [w.success for w in series["easy:1"].windows] == [0.5, 1.0]
    assert series["hard:9"].total.signal_share == 0.0 and series["all"].total.groups == 32
    summary = signal_summary(groups, cfg)
    assert summary["easy:1"]["signal_share"] == 0.5 and summary["easy:1"]["last_signal_share"] == 0.0
    assert "every episode succeeds" in summary["easy:1"]["advice"]
    assert summary["hard:9"]["success"] == 0.0 and "no episode succeeds" in summary["hard:9"]["advice"]


# -- asyncrl env signal on plugins --------------------------------------------------------------------
class CoinTasks(HashSplitTaskSource):
    task_types = ("coin",)
    difficulties = (1, 2)

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        n = rng.randrange(10**9)
        return Task(id=f"coin-{difficulty}-{n}", task_type="coin", difficulty=difficulty, payload={"n": n})

    def content_key(self, task: Task) -> str:
        return task.id


class NeverEnv:
    """No policy can solve it: every answer fails."""

    tools: ClassVar[list[Any]] = []

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> CoinTasks:
        return CoinTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)

    @staticmethod
    def solve(task: Task) -> list[str]:
        return ["<answer>heads</answer>"]

    @staticmethod
    def demonstrate(task: Task, rng: random.Random, corruption_rate: float) -> list[str]:
        return ["<answer>heads</answer>"]

    async def reset(self, task: Task) -> str:
        self.task = task
        return "Call the coin."

    async def step(self, model_text: str) -> StepResult:
        return StepResult(observation="", done=True, reward=0.0, outcome="failure")


SEEN: dict[str, int] = {}


class AlternatingEnv(NeverEnv):
    """Every other episode of a task succeeds, whatever the model says: every group differs."""

    async def step(self, model_text: str) -> StepResult:
        k = SEEN[self.task.id] = SEEN.get(self.task.id, 0) + 1
        ok = k % 2 == 0
        return StepResult(observation="", done=True, reward=float(ok), outcome="success" if ok else "failure")


def _signal_cli(env: str, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    from asyncrl.cli import main

    code = main(
        [
            "env",
            "signal",
            f"{__name__}:{env}",
            "--tasks",
            "2",
            "--json",
            "--set",
            "rollout.group_size=4",
            "--set",
            "rollout.sampling.max_new_tokens=8",
            "--set",
            "env.heldout_size=16",
            "--set",
            "trainer.sft.steps=2",
            "--set",
            "trainer.sft.num_demos=4",
            "--set",
            f"cache_dir={cache}",
        ]
    )
    return code, json.loads(capsys.readouterr().out)


def test_env_signal_on_an_unsolvable_plugin_reports_zero_and_the_advice(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _signal_cli("NeverEnv", cache_dir, capsys)
    assert code == 1 and report["ok"] is False and report["learnable"] == []
    assert [p["name"] for p in report["policies"]] == ["base", "warm start"]
    for policy in report["policies"]:
        assert [b["bucket"] for b in policy["buckets"]] == ["coin:1", "coin:2"]
        for b in policy["buckets"]:
            assert (b["groups"], b["differ"], b["episodes"], b["success"]) == (2, 0, 8, 0.0)
            assert b["verdict"] == "no_success" and "env.max_difficulty" in b["advice"]
            assert "0 of 8 episodes succeeded: the true rate is below 38% at 95% confidence" in b["advice"]


def test_env_signal_on_a_plugin_whose_groups_differ_finds_the_band(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SEEN.clear()
    code, report = _signal_cli("AlternatingEnv", cache_dir, capsys)
    assert code == 0 and report["ok"] is True and report["learnable"] == ["coin:1", "coin:2"]
    start = report["policies"][-1]
    for b in start["buckets"]:
        assert (b["groups"], b["differ"], b["success"], b["signal_share"]) == (2, 2, 0.5, 1.0)
        assert b["verdict"] == "learnable"
        assert b["expected_share"] == pytest.approx(signal_share(0.5, 4))


# -- a real run -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("env", "fires"), [("NeverEnv", True), ("AlternatingEnv", False)])
def test_a_run_says_when_it_cannot_learn(env: str, fires: bool, tmp_path: Path, cache_dir: Path) -> None:
    """Multi-process runs of 8 steps (16 trajectories, groups of 4: windows of 2 steps = 8 groups)."""
    from asyncrl.jobs.train import train

    cfg = load_config(
        None,
        [
            "env.kind=plugin",
            f"env.path={__name__}:{env}",
            "env.heldout_size=16",
            "rollout.group_size=4",
            "rollout.sampling.max_new_tokens=8",
            "trainer.batch_size=16",
            "trainer.total_steps=8",
            "trainer.sft.steps=2",
            "trainer.sft.num_demos=4",
            "telemetry.log_every_s=0.5",
            "orchestrator.signal.window_steps=2",
            f"run_root={tmp_path}",
            f"cache_dir={cache_dir}",
        ],
    )
    run_dir, summary = train(cfg, display=False, eval_limit=4)
    path = run_dir / "alerts.jsonl"
    alerts = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    no_signal = [a for a in alerts if a["kind"] == "no_signal"]
    signal = summary["signal"]
    if fires:  # every bucket and the run: once each, when its first window of 8 groups was full
        assert sorted(a["bucket"] for a in no_signal) == ["", "coin:1", "coin:2"]
        assert all(a["evidence"]["groups"] == cfg.signal_window() == 8 for a in no_signal)
        assert signal["all"]["signal_share"] == 0.0 and signal["all"]["groups"] >= 16
    else:
        assert no_signal == [] and signal["all"]["signal_share"] == 1.0 and signal["all"]["success"] == 0.5
