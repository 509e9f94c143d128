"""The entropy-collapse counter: a bucket whose groups stopped differing gets a hotter sampling temperature.

When a policy becomes deterministic per task, it solves some tasks of a bucket always and the others
never: the bucket's success ``p`` stays between 0 and 1, but its groups carry a reward difference far
less often than ``s(p, G) = 1 − p^G − (1 − p)^G`` predicts for independent episodes (**cold**: under
half of it, :func:`asyncrl.learning_signal.cold`), so GRPO has nothing to learn from them (the letter_counting run
of issue 57: entropy 0.17 → 0.02 in 24 steps, 316 of 384 trained samples with zero advantage).
Clip-higher (``algo.policy_loss.eps_high``) and the entropy bonus (``algo.entropy_coef``) slow the
collapse from the loss side; this rule acts on sampling, where the missing diversity is.

The rule (``orchestrator.signal.raise_temperature``), per bucket, once every ``W`` of its training groups
(``W``: the no-signal rule's window, :mod:`asyncrl.orchestrator.no_signal`, whose window it reads — the last
``W`` groups, measured mostly at the factor in force): with ``m`` the share of those groups with a
reward difference, ``p`` their success and ``G`` their mean size,

* cold (``m < s(p, G) / 2``): the bucket's factor ``f`` rises by ``temperature_step``, up to
  ``max_temperature_factor``;
* not cold and ``f > 1``: it falls back by a step (towards 1);

each change is a ``temperature`` alert with the evidence. Workers sample the bucket's episodes at ``f ×
rollout.sampling.temperature`` (directives ``temperature_factors``); the trajectory records the
temperature it was sampled at, and the learner scores it at that temperature, so the behaviour
log-probs and the loss stay consistent. Buckets at ``p = 0`` or ``1`` are never cold (``s = 0``): no
temperature makes a difference likely there.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import SignalConfig
from asyncrl.learning_signal import cold, signal_share
from asyncrl.orchestrator.alerts import Alert
from asyncrl.orchestrator.no_signal import SignalMonitor


class TemperatureRule:
    """Per-bucket temperature factors and the rule of the module docstring."""

    def __init__(self, c: SignalConfig, window: int) -> None:
        self.c, self.window = c, window
        self.factors: dict[str, float] = {}
        """Bucket -> its factor on ``rollout.sampling.temperature`` (absent: 1)."""
        self.seen: dict[str, int] = {}
        """Bucket -> training groups observed since its last decision."""

    def observe(self, bucket: str, signal: SignalMonitor) -> list[Alert]:
        """One training group of ``bucket`` went into ``signal``'s windows; a decision every ``window``."""
        if not (self.c.enabled and self.c.raise_temperature):
            return []
        self.seen[bucket] = self.seen.get(bucket, 0) + 1
        share, p = signal.no_signal_share(bucket), signal.success(bucket)
        if self.seen[bucket] < self.window or share is None or p is None:
            return []
        self.seen[bucket] = 0
        g, old = signal.mean_size(bucket), self.factors.get(bucket, 1.0)
        differs = 1.0 - share
        if cold(differs, p, g):
            new = min(self.c.max_temperature_factor, old + self.c.temperature_step)
        else:
            new = max(1.0, old - self.c.temperature_step)
        new = round(new, 6)  # 1.1 − 0.1 is 1 again, not 1.0000000000000002
        if new == old:
            return []
        self.factors[bucket] = new
        evidence = {
            "groups": self.window,
            "signal_share": round(differs, 4),
            "expected_signal_share": round(signal_share(p, g), 4),
            "success": round(p, 4),
            "group_size": g,
        }
        why = (
            "its groups differ far less often than its success predicts"
            if new > old
            else "its groups differ again"
        )
        action = f"sampling temperature × {old:.2f} -> × {new:.2f} for {bucket}: {why}"
        return [Alert("temperature", bucket, evidence, action)]

    def metrics(self) -> dict[str, float]:
        """``signal/temperature_factor/{bucket}`` of every bucket whose factor is not 1."""
        return {f"signal/temperature_factor/{b}": f for b, f in sorted(self.factors.items()) if f != 1.0}

    def live(self) -> dict[str, float]:
        """The factors the workers apply (those not 1)."""
        return {b: f for b, f in self.factors.items() if f != 1.0}

    def snapshot(self) -> dict[str, object]:
        return {"factors": dict(self.factors), "seen": dict(self.seen)}

    def restore(self, doc: dict[str, Any]) -> None:
        self.factors = {str(k): float(v) for k, v in doc.get("factors", {}).items()}
        self.seen = {str(k): int(v) for k, v in doc.get("seen", {}).items()}
