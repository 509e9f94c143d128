"""Learning signal: the formula, the no-signal alert during a run, and ``asyncrl env signal`` before one.

* ``s(p, G) = 1 − p^G − (1 − p)^G`` against its loop twin (the binomial sum over mixed groups);
* a task no policy can solve fires ``no_signal`` for its bucket and the run at the window's last group
  (not one group earlier), once per excursion, and the alert survives a snapshot; a learnable task never
  fires it; a hopeless bucket beside a learnable one alerts for the bucket only, never for the run;
* ``asyncrl env signal`` on a plugin no policy can solve reports 0 % with the advice and exits 1; on a
  plugin whose groups always differ it reports the learnable band and exits 0;
* ``env signal`` for people: buckets in numeric order (2 before 10), consecutive levels of one verdict
  as one row and one advice line, pass@G per bucket (tasks with a success, not episodes), advice that
  never lowers a task type's lowest level (unless ``env.min_difficulty`` cut lower ones off) and names
  ``trainer.sft.source: rollouts``, ``--levels`` / ``--max-difficulty``, and a held-out split too small
  for ``env.heldout_size`` in one line with exit 2;
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
from asyncrl.errors import UserError
from asyncrl.learning_signal import advice, bucket_order, group_size_for, levels_label, signal_share, verdict
from asyncrl.orchestrator.rules import Rules
from asyncrl.records import Task, Trajectory
from asyncrl.telemetry.report_signal import signal_series, signal_summary
from asyncrl.telemetry.reports import GroupReport

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
    assert "env.max_difficulty" in advice(0.0, 0.0, 8, 0.15, 0.5, lowest=False, pass_at_g=0.0)
    rare = advice(0.05, 0.3, 8, 0.15, 0.5, lowest=False, pass_at_g=0.4)
    assert "rollout.group_size 14" in rare and "pass@8 40% of tasks" in rare
    assert "trainer.sft.source: rollouts" in rare
    cold = advice(0.5, 0.0, 8, 0.15, 0.5, lowest=None, pass_at_g=0.5)  # half succeed, no group differs
    assert "rollout.sampling.temperature" in cold
    assert "temperature" not in advice(0.5, 0.99, 8, 0.15, 0.5, lowest=None, pass_at_g=1.0)


@pytest.mark.parametrize("p", [0.0, 0.05])
def test_advice_never_lowers_a_difficulty_that_is_the_lowest(p: float) -> None:
    """At a task type's lowest level the advice names what can still work, not a lower level; above
    it (or not known) a lower level is among the steps."""
    pass_at_g = 0.0 if p == 0.0 else 0.25
    at_floor = advice(p, 0.0, 8, 0.15, 0.5, lowest=True, pass_at_g=pass_at_g)
    assert "max_difficulty" not in at_floor and "lower" not in at_floor, at_floor
    assert "trainer.sft.source: rollouts" in at_floor
    for lowest in (False, None):
        assert "env.max_difficulty" in advice(p, 0.0, 8, 0.15, 0.5, lowest=lowest, pass_at_g=pass_at_g)
    if p == 0.0:  # pass@G is 0: the rollouts warm start needs more samples, or a tool / demonstrations
        assert "pass@8 0%" in at_floor and "more samples per task than 8" in at_floor
        assert "tool" in at_floor


def test_buckets_sort_by_level_as_a_number() -> None:
    names = ["leg:10", "leg:2", "leg:0", "a/leg:11", "leg:1", "coin:3"]
    assert sorted(names, key=bucket_order) == ["a/leg:11", "coin:3", "leg:0", "leg:1", "leg:2", "leg:10"]
    assert levels_label([0, 1, 2, 3, 5, 10, 11]) == "0–3, 5, 10–11"
    assert levels_label([7]) == "7"


def test_levels_option_reads_lists_and_ranges() -> None:
    import argparse

    from asyncrl.cli.parser import _levels
    from asyncrl.jobs.env_signal import Levels

    assert _levels("0,1,5") == {0, 1, 5}
    assert _levels("0-3, 7,10–11") == {0, 1, 2, 3, 7, 10, 11}
    for bad in ("a", "3-1", "-2", "1,,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            _levels(bad)
    both = Levels(frozenset({0, 1, 5}), 4)
    assert [d for d in range(8) if both.keeps(d)] == [0, 1]
    assert [d for d in range(8) if Levels(None, 2).keeps(d)] == [0, 1, 2]
    assert (
        both.describe() == "levels 0–1, 5 and up to level 4"
        and Levels(None, None).describe() == "every level"
    )


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


def test_the_reports_buckets_are_in_numeric_order(tmp_path: Path) -> None:
    groups = [_group(b, [1.0, 0.0] * 4) for b in ("x:10", "x:9", "x:1")]
    assert list(signal_series(groups, 8)) == ["x:1", "x:9", "x:10", "all"]


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
            assert b["pass_at_g"] == 0.0 and b["verdict"] == "no_success"
            assert "0 of 8 episodes succeeded: the true rate is below 38% at 95% confidence" in b["advice"]
        floor, above = policy["buckets"]  # coin:1 is the plugin's lowest level: nothing lower to advise
        assert (floor["lowest"], above["lowest"]) == (True, False)
        assert "max_difficulty" not in floor["advice"] and "trainer.sft.source: rollouts" in floor["advice"]
        assert "env.max_difficulty" in above["advice"]
        [merged] = policy["merged"]  # one verdict over both levels: one line, counts pooled
        assert (merged["bucket"], merged["levels"], merged["episodes"]) == ("coin:1–2", [1, 2], 16)
        assert merged["lowest"] and "max_difficulty" not in merged["advice"]
        assert "0 of 16 episodes succeeded" in merged["advice"]


def test_env_signal_on_a_plugin_whose_groups_differ_finds_the_band(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SEEN.clear()
    code, report = _signal_cli("AlternatingEnv", cache_dir, capsys)
    assert code == 0 and report["ok"] is True and report["learnable"] == ["coin:1", "coin:2"]
    start = report["policies"][-1]
    for b in start["buckets"]:
        assert (b["groups"], b["differ"], b["success"], b["signal_share"]) == (2, 2, 0.5, 1.0)
        assert b["pass_at_g"] == 1.0  # every task succeeded at least once in its group
        assert b["verdict"] == "learnable"
        assert b["expected_share"] == pytest.approx(signal_share(0.5, 4))


def _traj(task: Task, i: int, ok: bool) -> Trajectory:
    return Trajectory(
        id=f"{task.id}-{i}",
        task=task,
        turns=[],
        final_reward=float(ok),
        outcome="success" if ok else "failure",
    )


def test_group_signal_counts_pass_at_g_per_task() -> None:
    """pass@G counts tasks with at least one success in their group, not successful episodes."""
    from asyncrl.jobs.groups import group_signal

    tasks = [Task(id=f"t{i}", task_type="coin", difficulty=1, payload={}) for i in range(3)]
    wins = [[0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    groups = [[_traj(t, i, bool(w)) for i, w in enumerate(ws)] for t, ws in zip(tasks, wins, strict=True)]
    c = group_signal(groups)
    assert (c.groups, c.differ, c.solved, c.successes, c.episodes) == (3, 1, 2, 5, 12)


class LevelTasks(CoinTasks):
    difficulties = tuple(range(12))


class ManyLevelsEnv(NeverEnv):
    """Twelve levels (0–11), none solvable."""

    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> CoinTasks:
        return LevelTasks(
            seed=cfg.seed,
            heldout_size=cfg.heldout_size,
            min_difficulty=cfg.min_difficulty,
            max_difficulty=cfg.max_difficulty,
        )


def _plugin_cfg(env: str, cache: Path, *extra: str) -> RunConfig:
    from asyncrl.envs.check import ENV_OWN_DIFFICULTIES

    own = [f"env.{k}={v}" for k, v in ENV_OWN_DIFFICULTIES.items()]
    sets = ["env.kind=plugin", f"env.path={__name__}:{env}", *own, "rollout.group_size=2"]
    sets += ["rollout.sampling.max_new_tokens=4", "trainer.sft.steps=0", f"cache_dir={cache}", *extra]
    return load_config(None, sets)


def test_lowest_level_is_the_task_types_unless_min_difficulty_cut_it(cache_dir: Path) -> None:
    from asyncrl.envs import make_task_source
    from asyncrl.jobs.env_signal import lowest_buckets

    every = _plugin_cfg("ManyLevelsEnv", cache_dir, "env.heldout_size=12")
    buckets = [f"coin:{d}" for d in range(12)]
    assert lowest_buckets(make_task_source(every.env), buckets) == {"coin:0"}
    cut = _plugin_cfg("ManyLevelsEnv", cache_dir, "env.heldout_size=12", "env.min_difficulty=2")
    assert lowest_buckets(make_task_source(cut.env), buckets[2:]) == set()  # levels 0-1 exist below


def test_a_quick_scan_plays_only_the_levels_asked_for(cache_dir: Path) -> None:
    from asyncrl.jobs.env_signal import Levels, tasks_by_bucket

    cfg = _plugin_cfg("ManyLevelsEnv", cache_dir, "env.heldout_size=24")
    every, lowest = tasks_by_bucket(cfg, 1, Levels(None, None))
    assert list(every) == [f"coin:{d}" for d in range(12)] and lowest == {"coin:0"}  # numeric order
    some, _ = tasks_by_bucket(cfg, 1, Levels(frozenset({0, 1, 5, 10}), 5))
    assert list(some) == ["coin:0", "coin:1", "coin:5"]
    assert [len(ts) for ts in some.values()] == [1, 1, 1]
    with pytest.raises(UserError, match="keeps none of this environment's levels \\(0–11\\)"):
        tasks_by_bucket(cfg, 1, Levels(frozenset({40}), None))


def test_env_signal_merges_the_levels_of_one_verdict_into_one_line(cache_dir: Path) -> None:
    """12 unsolvable levels: 12 buckets in numeric order in the JSON, one table row and one advice line,
    which does not tell the user to lower a difficulty that starts at the lowest level."""
    from asyncrl.jobs.env_signal import Levels, check_signal

    cfg = _plugin_cfg("ManyLevelsEnv", cache_dir, "env.heldout_size=12")
    report = check_signal(cfg, tasks=1, levels=Levels(None, None), name="many")
    [base] = report.policies
    assert [b.bucket for b in base.buckets] == [f"coin:{d}" for d in range(12)]
    assert [(b.bucket, b.groups, b.episodes, b.lowest) for b in base.merged] == [("coin:0–11", 12, 24, True)]
    text = report.render()
    rows = [line for line in text.splitlines() if line.startswith("base ") and "coin" in line]
    assert len(rows) == 1 and rows[0].split()[1:4] == ["coin:0–11", "12", "0%"]
    [line] = [x for x in text.splitlines() if x.startswith("  coin")]
    assert line.startswith(
        "  coin levels 0–11: no episode succeeds (pass@2 0%), down to this task type's lowest"
    )
    assert "max_difficulty" not in line and "0 of 24 episodes succeeded" in line
    assert report.to_dict()["policies"][0]["merged"][0]["levels"] == list(range(12))


class LadderEnv(ManyLevelsEnv, AlternatingEnv):
    """Levels 0–2 as AlternatingEnv (every group differs), levels 3–11 unsolvable."""

    async def step(self, model_text: str) -> StepResult:
        if self.task.difficulty > 2:
            return StepResult(observation="", done=True, reward=0.0, outcome="failure")
        return await super().step(model_text)


def test_levels_above_a_learnable_one_are_told_to_go_down_to_it(cache_dir: Path) -> None:
    """Two runs of levels, two rows: the unsolvable levels above a learnable lowest level are told to
    train where there is success (env.max_difficulty), the learnable ones are in the band."""
    from asyncrl.jobs.env_signal import Levels, check_signal

    SEEN.clear()
    cfg = _plugin_cfg("LadderEnv", cache_dir, "env.heldout_size=12")
    [base] = check_signal(cfg, tasks=1, levels=Levels(None, None), name="ladder").policies
    assert [(b.bucket, b.verdict, b.lowest) for b in base.merged] == [
        ("coin:0–2", "learnable", True),
        ("coin:3–11", "no_success", False),
    ]
    assert base.merged[0].pass_at_g == 1.0 and base.merged[0].success == 0.5
    assert "env.max_difficulty" in base.merged[1].advice and "lower levels" in base.merged[1].advice


class FewTasks(CoinTasks):
    """Six distinct tasks per level: a held-out split of a few tasks at most."""

    heldout_permille = 500
    max_attempts = 50

    def generate(self, rng: random.Random, difficulty: int) -> Task:
        n = rng.randrange(6)
        return Task(id=f"few-{difficulty}-{n}", task_type="coin", difficulty=difficulty, payload={"n": n})


class FewTasksEnv(NeverEnv):
    @classmethod
    def make_task_source(cls, cfg: EnvConfig) -> CoinTasks:
        return FewTasks(seed=cfg.seed, heldout_size=cfg.heldout_size)


def test_env_signal_says_a_held_out_split_too_small_in_one_line(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """env.heldout_size above the held-out tasks the levels have: one line and exit 2, as train says it
    (it was a ValueError traceback)."""
    from asyncrl.cli import main

    code = main(
        [
            "env",
            "signal",
            f"{__name__}:FewTasksEnv",
            "--set",
            "env.heldout_size=64",
            "--set",
            f"cache_dir={cache_dir}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("asyncrl: error: env.heldout_size: FewTasks: could only find")
    assert "lower env.heldout_size (now 64)" in err


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
