"""All of the orchestrator's rules behind one object: fed the roles' reports, returns alerts and directives.

:class:`Rules` owns one instance of each rule (curriculum, breakers, environment fault rate, drift,
reward hacking, exploration, learning signal and its temperature counter, elastic capacity) and the alert log; it also turns a
worker's refusal of a weight version (``weights/canary_failed``) into a ``weight_canary`` alert. The
orchestrator tick calls :meth:`feed` with the new reports (:mod:`asyncrl.telemetry.reports`, decoded
once per tick), :meth:`directives` to get the document the workers follow, and :meth:`snapshot` /
:meth:`restore` to persist every rule's state in the state store.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgspec

from asyncrl.config import RunConfig
from asyncrl.control.buckets import bucket_prior, buckets_of_source
from asyncrl.control.directives import Directives, compose
from asyncrl.envs import make_task_source
from asyncrl.orchestrator.alerts import Alert, AlertLog
from asyncrl.orchestrator.breaker import Breakers, FaultRateMonitor
from asyncrl.orchestrator.curriculum import Curriculum
from asyncrl.orchestrator.drift import DriftMonitor, HackingMonitor
from asyncrl.orchestrator.elastic import ElasticController
from asyncrl.orchestrator.explore import ExplorationController
from asyncrl.orchestrator.mix import curriculum_shares, env_metrics
from asyncrl.orchestrator.no_signal import SignalMonitor
from asyncrl.orchestrator.temperature import TemperatureRule
from asyncrl.telemetry.report_envs import EnvTally
from asyncrl.telemetry.reports import (
    CANARY_FAILED,
    Decoded,
    Event,
    GroupReport,
    GuardFigures,
    TrainerReport,
    WorkerReport,
)


class Rules:
    def __init__(self, cfg: RunConfig, run_dir: Path | None, buckets: list[str] | None = None) -> None:
        self.env_prior: dict[str, float] = {}
        """``env.kind: mix``: each bucket's share from its environment's weight (:mod:`asyncrl.orchestrator.mix`)."""
        if buckets is None:
            source = make_task_source(cfg.env)
            buckets, self.env_prior = buckets_of_source(source), bucket_prior(source)
        self.envs = EnvTally()
        self.cfg = cfg
        self.alerts = AlertLog(
            run_dir / "alerts.jsonl" if run_dir is not None else None, cfg.telemetry.recent_alerts
        )
        c, env = cfg.orchestrator, cfg.env
        self.curriculum = Curriculum(buckets, c.curriculum)
        self.breakers = Breakers(c.breaker, env=env.kind)
        b = c.breaker
        self.faults = FaultRateMonitor(b.fault_rate_alert, b.fault_rate_window, env=env.path or env.kind)
        self.env_counts: dict[str, GuardFigures] = {}
        """Latest guard counts of every rollout process, keyed ``role:pid``."""
        self.drift = DriftMonitor(c.drift)
        self.hacking = HackingMonitor(c.drift)
        r = cfg.rollout
        self.exploration = ExplorationController(c.exploration, r.temperature_jitter, r.exploration_rate)
        self.elastic = ElasticController(c.elastic)
        self.signal = SignalMonitor(c.signal, cfg.signal_window(), r.group_size)
        self.temperature = TemperatureRule(c.signal, cfg.signal_window())
        self.train_reward: float | None = None
        self.groups = 0

    def feed(self, reports: list[Decoded], now: float | None = None) -> list[Alert]:
        """Consume new reports: group reports, trainer reports, refused weight versions, guard counts."""
        now = time.time() if now is None else now
        out: list[Alert] = []
        self.observe_env(reports)
        for r in reports:
            if isinstance(r, TrainerReport) and r.reward.mean is not None:
                self.train_reward = r.reward.mean
            elif isinstance(r, Event) and r.name == CANARY_FAILED:
                out.append(canary_alert(r.data))
            elif isinstance(r, GroupReport):
                out += self._group(r, now)
        out += self.breakers.tick(now)
        out += self.faults.observe(self.env_totals(), now)
        self.alerts.extend(out)
        return out

    def _group(self, g: GroupReport, now: float) -> list[Alert]:
        """One finished group: a held-out probe feeds the hacking rule, a training group the others."""
        c, out = self.cfg.orchestrator, []
        self.envs.observe(g)
        if g.heldout:
            if self.train_reward is not None:
                success = sum(o == "success" for o in g.outcomes) / len(g.rewards)
                out += self.hacking.observe(self.train_reward, success)
            return out
        self.groups += 1
        if c.breaker.enabled:
            for a in g.anomalies:
                out += self.breakers.observe(g.bucket, a, now)
        if self.breakers.state(g.bucket) != "open":
            for o in g.outcomes:
                self.curriculum.observe(g.bucket, o == "success")
            if c.drift.enabled:
                out += self.drift.observe(g.bucket, sum(g.rewards) / len(g.rewards), now)
        out += self.exploration.observe(g.rewards)
        out += self.signal.observe(g.bucket, g.rewards, g.outcomes)
        out += self.temperature.observe(g.bucket, self.signal)
        return out

    def env_shares(self) -> dict[str, float]:
        """``env.kind: mix``: each environment's share of training draws under the bucket weights the
        workers draw by now (curriculum, drift, breakers)."""
        if not self.env_prior:
            return {}
        return curriculum_shares(self.directives([], []).weights, self.env_prior)

    def observe_env(self, reports: list[Decoded]) -> None:
        """Keep the latest guard counts of every rollout process."""
        for r in reports:
            if isinstance(r, WorkerReport):
                self.env_counts[f"{r.role}:{r.pid}"] = r.guard

    def env_totals(self) -> GuardFigures:
        """The guard counts summed over every rollout process (restarted ones included)."""
        return GuardFigures.total(self.env_counts.values())

    def directives(self, workers: list[str], retire: list[str], now: float | None = None) -> Directives:
        now = time.time() if now is None else now
        return compose(
            self.curriculum.weights(),
            self.drift.factors(now),
            self.breakers.buckets_in("open"),
            self.breakers.buckets_in("half_open"),
            self.cfg.orchestrator.curriculum.floor,
            self.exploration.settings(),
            self.cfg.orchestrator.drift.heldout_rate,
            workers,
            retire,
            self._group_sizes(),
            self.temperature.live(),
        )

    def _group_sizes(self) -> dict[str, int]:
        """``rollout.adaptive_group_size``: larger groups for buckets of rare success (:meth:`Curriculum.group_sizes`)."""
        r = self.cfg.rollout
        if not r.adaptive_group_size or r.tree.enabled:
            return {}
        # a group must fit the staleness budget's slack once the queue holds less than a batch:
        # max_staleness x batch_size episodes (rule 1), or no worker could ever admit it
        fits = self.cfg.staleness_policy().max_staleness * self.cfg.trainer.batch_size
        most = min(r.max_group_size, max(r.group_size, fits))
        return self.curriculum.group_sizes(r.group_size, most, self.cfg.orchestrator.signal.band_low)

    def metrics(self, now: float | None = None) -> dict[str, float]:
        now = time.time() if now is None else now
        return {
            **self.alerts.metrics(),
            **self.curriculum.metrics(),
            **{f"curriculum/group_size/{b}": float(g) for b, g in self._group_sizes().items()},
            **self.breakers.metrics(),
            **self.drift.metrics(now),
            **self.signal.metrics(),
            **self.temperature.metrics(),
            "hacking/flags": float(self.hacking.flags),
            "exploration/temperature_jitter": self.exploration.jitter,
            "exploration/rate": self.exploration.rate,
            "elastic/decisions": float(self.elastic.decisions),
            "env/fault_rate": self.faults.rate,
            **env_metrics(self.envs, self.env_shares()),
        }

    # -- snapshot --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        return {
            "alerts": self.alerts.state(),
            "curriculum": self.curriculum.state(),
            "breakers": self.breakers.snapshot(),
            "drift": self.drift.snapshot(),
            "hacking": self.hacking.snapshot(),
            "exploration": self.exploration.snapshot(),
            "elastic": self.elastic.snapshot(),
            "signal": self.signal.snapshot(),
            "temperature": self.temperature.snapshot(),
            "faults": self.faults.snapshot(),
            "env_counts": {k: msgspec.to_builtins(v) for k, v in self.env_counts.items()},
            "train_reward": self.train_reward,
            "groups": self.groups,
        }

    def restore(self, doc: dict[str, Any]) -> None:
        self.alerts.restore(doc["alerts"])
        self.curriculum.restore(doc["curriculum"])
        self.breakers.restore(doc["breakers"])
        self.drift.restore(doc["drift"])
        self.hacking.restore(doc["hacking"])
        self.exploration.restore(doc["exploration"])
        self.elastic.restore(doc["elastic"])
        self.signal.restore(doc.get("signal", {}))  # absent in snapshots written before the rule existed
        self.temperature.restore(doc.get("temperature", {}))  # likewise
        if "faults" in doc:  # absent in snapshots written before the fault-rate alert existed
            self.faults.restore(doc["faults"])
            counts = doc.get("env_counts", {})
            self.env_counts = {k: msgspec.convert(v, GuardFigures) for k, v in counts.items()}
        self.train_reward = doc.get("train_reward")
        self.groups = int(doc.get("groups", 0))


def canary_alert(event: dict[str, object]) -> Alert:
    """A worker refused a weight version: its engine did not serve it as published (weight-sync canary)."""
    evidence = {k: v for k, v in event.items() if k not in ("time", "event")}
    kept = event.get("kept")
    action = (
        f"version {event.get('version')} refused by {event.get('worker')}: it keeps serving version {kept}; "
        "the trainer publishes its weights again as a new version"
        if kept is not None
        else f"version {event.get('version')} refused by {event.get('worker')}, which had no good version: "
        "the worker stops and is restarted"
    )
    return Alert("weight_canary", "", evidence, action)
