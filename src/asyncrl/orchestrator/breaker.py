"""Circuit breakers per environment and bucket.

Each finished episode is classified as healthy or as one **anomaly** kind: ``exception``,
``timeout``, ``malformed``, ``bad_reward`` (a fault the environment guard absorbed after its
retries, or a reset that failed), or ``reward_range`` (a final reward outside
``[reward_min, reward_max]``).

States and transitions (``orchestrator.breaker``):

* **closed** -- the bucket is sampled normally. ``consecutive`` episodes in a row with the *same*
  anomaly kind open it (a healthy episode or another kind restarts the count).
* **open** -- the bucket is not sampled (weight 0) and a ``breaker_open`` alert is raised.
  Episodes of the bucket still arriving (started before it opened) are ignored. After the wait
  (``backoff_s`` at first) it becomes half-open.
* **half_open** -- the bucket is sampled again at the curriculum floor weight as a probe.
  ``probes`` healthy episodes in a row close it (wait reset to ``backoff_s``); an anomaly re-opens
  it with the wait multiplied by ``backoff_factor`` (at most ``max_backoff_s``).

If every bucket is open the workers probe them all (treat them as half-open) rather than stop.

Beside the per-bucket breakers, :class:`FaultRateMonitor` watches the share of failed environment
call attempts across the whole run (the guards' counts reported by every worker), so a tool that
fails 30% of the time raises an ``env_faults`` alert even when no bucket ever sees five failing
episodes in a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import msgspec

from asyncrl.config import BreakerConfig
from asyncrl.orchestrator.alerts import Alert, AlertKind
from asyncrl.telemetry.reports import GuardFigures

State = Literal["closed", "open", "half_open"]
STATE_CODE = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


@dataclass
class _Breaker:
    state: State = "closed"
    kind: str = ""
    streak: int = 0
    healthy: int = 0
    opened_at: float = 0.0
    wait: float = 0.0
    opens: int = 0


class Breakers:
    def __init__(self, c: BreakerConfig, env: str = "") -> None:
        self.c, self.env = c, env
        self.b: dict[str, _Breaker] = {}

    def state(self, bucket: str) -> State:
        b = self.b.get(bucket)
        return b.state if b else "closed"

    def buckets_in(self, state: State) -> list[str]:
        return sorted(k for k, b in self.b.items() if b.state == state)

    def observe(self, bucket: str, anomaly: str | None, now: float) -> list[Alert]:
        """Feed one finished episode of ``bucket`` (``anomaly`` None = healthy)."""
        b = self.b.setdefault(bucket, _Breaker(wait=self.c.backoff_s))
        if b.state == "open":
            return []
        if b.state == "half_open":
            if anomaly is None:
                b.healthy += 1
                if b.healthy >= self.c.probes:
                    b.state, b.streak, b.kind, b.wait = "closed", 0, "", self.c.backoff_s
                    return [
                        self._alert(
                            "breaker_closed", bucket, b, {"healthy_probes": b.healthy}, "sampling resumed"
                        )
                    ]
                return []
            b.wait = min(b.wait * self.c.backoff_factor, self.c.max_backoff_s)
            return [self._open(bucket, b, anomaly, now, probe=True)]
        if anomaly is None:
            b.streak, b.kind = 0, ""
            return []
        b.streak = b.streak + 1 if anomaly == b.kind else 1
        b.kind = anomaly
        if b.streak >= self.c.consecutive:
            return [self._open(bucket, b, anomaly, now, probe=False)]
        return []

    def tick(self, now: float) -> list[Alert]:
        """Move open breakers whose wait is over to half-open."""
        out: list[Alert] = []
        for bucket, b in sorted(self.b.items()):
            if b.state == "open" and now >= b.opened_at + b.wait:
                b.state, b.healthy = "half_open", 0
                out.append(
                    self._alert("breaker_half_open", bucket, b, {"waited_s": now - b.opened_at}, "probing")
                )
        return out

    def _open(self, bucket: str, b: _Breaker, anomaly: str, now: float, probe: bool) -> Alert:
        b.state, b.opened_at, b.healthy = "open", now, 0
        b.opens += 1
        evidence = {"anomaly": anomaly, "streak": b.streak, "failed_probe": probe, "next_probe_s": b.wait}
        b.streak = 0
        return self._alert("breaker_open", bucket, b, evidence, "bucket not sampled")

    def _alert(
        self, kind: AlertKind, bucket: str, b: _Breaker, evidence: Mapping[str, object], action: str
    ) -> Alert:
        return Alert(kind=kind, bucket=bucket, evidence={"env": self.env, **evidence}, action=action)

    def metrics(self) -> dict[str, float]:
        out = {
            "breaker/open": float(len(self.buckets_in("open"))),
            "breaker/half_open": float(len(self.buckets_in("half_open"))),
            "breaker/opens": float(sum(b.opens for b in self.b.values())),
        }
        out.update({f"breaker/state/{k}": STATE_CODE[b.state] for k, b in sorted(self.b.items())})
        return out

    # -- snapshot --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        return {k: asdict(b) for k, b in self.b.items()}

    def restore(self, doc: dict[str, Any]) -> None:
        self.b = {str(k): _Breaker(**v) for k, v in doc.items()}


class FaultRateMonitor:
    """One ``env_faults`` alert per excursion of the environment fault rate above ``threshold``.

    Fed the run's cumulative guard counts (attempts = calls + retries; failed = timeouts +
    exceptions + malformed results); measures the rate over windows of ``window`` attempts; alerts
    when a window's rate exceeds ``threshold`` after one that did not (``threshold`` 0: never).
    """

    def __init__(self, threshold: float, window: int, env: str = "") -> None:
        self.threshold, self.window, self.env = threshold, window, env
        self.start = (0.0, 0.0)  # cumulative (attempts, failed) at the window's start
        self.above = False
        self.alerts = 0
        self.rate = 0.0

    def observe(self, totals: GuardFigures, now: float) -> list[Alert]:
        attempts, failed = _attempts(totals)
        n, bad = attempts - self.start[0], failed - self.start[1]
        if n < self.window or not self.threshold:
            return []
        self.start, self.rate = (attempts, failed), bad / n
        was, self.above = self.above, self.rate > self.threshold
        if not self.above or was:
            return []
        self.alerts += 1
        evidence = {
            "fault_rate": self.rate,
            "attempts": n,
            "failed": bad,
            "threshold": self.threshold,
            **msgspec.structs.asdict(totals),
        }
        return [
            Alert("env_faults", "", evidence, f"environment {self.env}: {self.rate:.0%} of calls failed", now)
        ]

    def snapshot(self) -> dict[str, object]:
        return {"start": list(self.start), "above": self.above, "alerts": self.alerts, "rate": self.rate}

    def restore(self, doc: dict[str, Any]) -> None:
        self.start = (float(doc["start"][0]), float(doc["start"][1]))
        self.above, self.alerts, self.rate = bool(doc["above"]), int(doc["alerts"]), float(doc["rate"])


def _attempts(totals: GuardFigures) -> tuple[float, float]:
    """(attempts, failed attempts) of the environment calls the guards saw."""
    return totals.calls + totals.retries, totals.timeouts + totals.exceptions + totals.malformed


def fault_summary(totals: GuardFigures, env_seconds: float, step_timeout_s: float) -> dict[str, float | str]:
    """The run's environment faults in one dict (``summary.json``'s ``env_faults`` entry).

    ``totals``: the guard counts summed over the workers (:meth:`Rules.env_totals`);
    ``env_seconds``: wall time of all environment steps. ``hang_share`` is the share of that time
    spent in attempts that failed (mostly hangs waiting for ``step_timeout_s``); above 10%, ``note``
    says in words that hangs stretched the run.
    """
    attempts, failed = _attempts(totals)
    lost = totals.fault_seconds
    share = lost / env_seconds if env_seconds > 0 else 0.0
    figures = msgspec.structs.asdict(totals)
    counts = ("calls", "faults", "retries", "timeouts", "exceptions", "malformed", "tool_faults")
    out: dict[str, float | str] = {k: int(figures[k]) for k in counts}
    out |= {"fault_rate": failed / attempts if attempts else 0.0, "fault_seconds": lost, "hang_share": share}
    out["note"] = ""
    if share > 0.1:
        out["note"] = (
            f"{share:.0%} of environment time ({lost:.0f}s) went to failed calls "
            f"({out['timeouts']} timeouts of up to env.guard.step_timeout_s={step_timeout_s:g}s, "
            f"{out['exceptions']} exceptions): hangs stretched the run's wall time"
        )
    return out


def fault_line(f: dict[str, float | str]) -> str:
    """One line for the live display and the plain progress line."""
    return (
        f"{f['fault_rate']:.1%} of {f['calls']} calls failed; {f['faults']} faults, "
        f"{f['retries']} retries, {f['timeouts']} timeouts"
    )
