"""The entropy-collapse counter (``orchestrator.signal.raise_temperature``, :mod:`asyncrl.orchestrator.temperature`).

Synthetic group streams through the orchestrator's rules: a bucket whose tasks are each always solved
or always failed (deterministic per task) gets a hotter temperature, bounded, with an alert; it cools
back once its groups differ; a hopeless bucket and a switched-off rule never move. The worker side (a
tiny model sampling at the factor) is in ``tests/test_group_size.py``.
"""

from __future__ import annotations

from asyncrl.config import RunConfig, load_config
from asyncrl.orchestrator.rules import Rules
from asyncrl.telemetry.reports import GroupReport
from helpers import training_group

G = 8
WINDOW = 4  # groups per decision: window_steps 1 × batch_size 32 // group_size 8


def _cfg(*extra: str) -> RunConfig:
    return load_config(
        None,
        [
            f"rollout.group_size={G}",
            "trainer.batch_size=32",
            "orchestrator.signal.window_steps=1",
            "orchestrator.signal.raise_temperature=true",  # off by default
            *extra,
        ],
    )


def _deterministic(n: int, bucket: str = "calc:1") -> list[GroupReport]:
    """Half the tasks always solved, half never: success 1/2, no group differs (cold)."""
    return [training_group(bucket, [float(i % 2)] * G) for i in range(n)]


def _differing(n: int, bucket: str = "calc:1") -> list[GroupReport]:
    return [training_group(bucket, [1.0, 0.0] * (G // 2)) for _ in range(n)]


def _temperature_alerts(rules: Rules) -> int:
    return int(rules.alerts.metrics().get("alerts/temperature", 0))


def test_a_bucket_deterministic_per_task_gets_a_hotter_temperature_up_to_the_bound() -> None:
    rules = Rules(_cfg(), None, buckets=["calc:1"])
    rules.feed(_deterministic(WINDOW - 1))
    assert rules.directives([], []).temperature_factors == {}  # no decision before a full window
    rules.feed(_deterministic(1))
    assert rules.directives([], []).temperature_factors == {"calc:1": 1.1}
    assert rules.metrics()["signal/temperature_factor/calc:1"] == 1.1
    rules.feed(_deterministic(20 * WINDOW))
    assert rules.directives([], []).temperature_factors == {"calc:1": 1.5}  # max_temperature_factor
    assert _temperature_alerts(rules) == 5  # 1.1, 1.2, 1.3, 1.4, 1.5: one alert per change
    # the groups differ again: the factor comes back down a step per window, to none
    rules.feed(_differing(5 * WINDOW))
    assert rules.directives([], []).temperature_factors == {}
    assert _temperature_alerts(rules) == 10


def test_a_hopeless_bucket_and_a_switched_off_rule_keep_the_temperature() -> None:
    hopeless = Rules(_cfg(), None, buckets=["calc:1"])
    hopeless.feed(
        [training_group("calc:1", [0.0] * G) for _ in range(4 * WINDOW)]
    )  # p = 0: s(p, G) = 0, not cold
    off = Rules(_cfg("orchestrator.signal.raise_temperature=false"), None, buckets=["calc:1"])
    off.feed(_deterministic(4 * WINDOW))
    for rules in (hopeless, off):
        assert rules.directives([], []).temperature_factors == {} and not _temperature_alerts(rules)


def test_only_the_cold_bucket_heats_and_the_factor_survives_a_snapshot() -> None:
    rules = Rules(_cfg(), None, buckets=["calc:1", "calc:2"])
    rules.feed(_deterministic(2 * WINDOW, "calc:1") + _differing(2 * WINDOW, "calc:2"))
    assert rules.directives([], []).temperature_factors == {"calc:1": 1.2}
    again = Rules(_cfg(), None, buckets=["calc:1", "calc:2"])
    again.restore(rules.snapshot())
    again.feed(_deterministic(WINDOW, "calc:1"))
    assert again.directives([], []).temperature_factors == {"calc:1": 1.3}
