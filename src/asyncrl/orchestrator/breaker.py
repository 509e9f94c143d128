"""Circuit breakers per environment and bucket.

Each finished episode is classified as healthy or as one **anomaly** kind: ``exception``,
``timeout``, ``malformed``, ``bad_reward`` (a fault the environment guard absorbed after its
retries, or a reset that failed), or ``reward_range`` (a final reward outside
``[reward_min, reward_max]``).

States and transitions (``control.breaker``):

* **closed** -- the bucket is sampled normally. ``consecutive`` episodes in a row with the *same*
  anomaly kind open it (a healthy episode or another kind restarts the count).
* **open** -- the bucket is not sampled (weight 0) and a ``breaker_open`` alert is raised.
  Episodes of the bucket still arriving (started before it opened) are ignored. After the wait
  (``backoff_s`` at first) it becomes half-open.
* **half_open** -- the bucket is sampled again at the curriculum floor weight as a probe.
  ``probes`` healthy episodes in a row close it (wait reset to ``backoff_s``); an anomaly re-opens
  it with the wait multiplied by ``backoff_factor`` (at most ``max_backoff_s``).

If every bucket is open the workers probe them all (treat them as half-open) rather than stop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from asyncrl.orchestrator.alerts import Alert

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
    def __init__(
        self,
        consecutive: int = 5,
        backoff_s: float = 10.0,
        backoff_factor: float = 2.0,
        max_backoff_s: float = 300.0,
        probes: int = 2,
        env: str = "",
    ) -> None:
        self.consecutive, self.backoff_s, self.factor = consecutive, backoff_s, backoff_factor
        self.max_backoff_s, self.probes, self.env = max_backoff_s, probes, env
        self.b: dict[str, _Breaker] = {}

    @classmethod
    def of(cls, cfg: Any) -> Breakers:
        c = cfg.control.breaker
        return cls(c.consecutive, c.backoff_s, c.backoff_factor, c.max_backoff_s, c.probes, env=cfg.env.kind)

    def state(self, bucket: str) -> State:
        b = self.b.get(bucket)
        return b.state if b else "closed"

    def buckets_in(self, state: State) -> list[str]:
        return sorted(k for k, b in self.b.items() if b.state == state)

    def observe(self, bucket: str, anomaly: str | None, now: float) -> list[Alert]:
        """Feed one finished episode of ``bucket`` (``anomaly`` None = healthy)."""
        b = self.b.setdefault(bucket, _Breaker(wait=self.backoff_s))
        if b.state == "open":
            return []
        if b.state == "half_open":
            if anomaly is None:
                b.healthy += 1
                if b.healthy >= self.probes:
                    b.state, b.streak, b.kind, b.wait = "closed", 0, "", self.backoff_s
                    return [
                        self._alert(
                            "breaker_closed", bucket, b, {"healthy_probes": b.healthy}, "sampling resumed"
                        )
                    ]
                return []
            b.wait = min(b.wait * self.factor, self.max_backoff_s)
            return [self._open(bucket, b, anomaly, now, probe=True)]
        if anomaly is None:
            b.streak, b.kind = 0, ""
            return []
        b.streak = b.streak + 1 if anomaly == b.kind else 1
        b.kind = anomaly
        if b.streak >= self.consecutive:
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

    def _alert(self, kind: Any, bucket: str, b: _Breaker, evidence: dict[str, Any], action: str) -> Alert:
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
    def snapshot(self) -> dict[str, Any]:
        return {k: asdict(b) for k, b in self.b.items()}

    def restore(self, doc: dict[str, Any]) -> None:
        self.b = {str(k): _Breaker(**v) for k, v in doc.items()}


def anomaly_of(traj: Any, reward_min: float, reward_max: float) -> str | None:
    """The anomaly kind of a finished trajectory (first guard fault, env_error, reward range) or None."""
    for turn in traj.turns:
        if turn.fault is not None:
            return str(turn.fault.kind)
    if traj.outcome == "env_error":
        return "exception"
    if not reward_min <= traj.final_reward <= reward_max:
        return "reward_range"
    return None
