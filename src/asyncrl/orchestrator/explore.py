"""Exploration control: temperature jitter and the exploration-task rate.

The signal is the share of finished groups whose members all got the same reward (zero group
advantage: nothing to learn from). With ``orchestrator.exploration.adaptive`` on, after every
``window`` groups:

* share ``>= zero_signal_high`` -> raise ``temperature_jitter`` and ``exploration_rate`` by ``step``
  (up to ``max_temperature_jitter`` / ``max_exploration_rate``): the policy is too sure (or the
  tasks too easy or too hard) and needs more diverse samples;
* share ``<= zero_signal_low`` -> lower both by ``step`` back towards the configured
  ``rollout.temperature_jitter`` / ``rollout.exploration_rate``.

Workers read the current values through :class:`~asyncrl.control.WorkerControl`. Early termination
(``early_stop_invalid``) is applied by the episode runner, not here; its trajectories end with
outcome ``early_stopped`` and their tokens count as ``early_terminated`` waste in the cost ledger.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config import ExplorationConfig
from asyncrl.control import Exploration
from asyncrl.orchestrator.alerts import Alert


class ExplorationController:
    def __init__(self, x: ExplorationConfig, base_jitter: float, base_rate: float) -> None:
        self.x, self.base_jitter, self.base_rate = x, base_jitter, base_rate
        self.max_jitter = max(x.max_temperature_jitter, base_jitter)
        self.max_rate = max(x.max_exploration_rate, base_rate)
        self.jitter, self.rate = base_jitter, base_rate
        self.groups = self.zero = 0

    def observe(self, group_rewards: list[float]) -> list[Alert]:
        x = self.x
        if not x.adaptive or len(group_rewards) < 2:
            return []
        self.groups += 1
        self.zero += len(set(group_rewards)) == 1
        if self.groups < x.window:
            return []
        share = self.zero / self.groups
        self.groups = self.zero = 0
        old = (self.jitter, self.rate)
        if share >= x.zero_signal_high:
            self.jitter = min(self.max_jitter, self.jitter + x.step)
            self.rate = min(self.max_rate, self.rate + x.step)
        elif share <= x.zero_signal_low:
            self.jitter = max(self.base_jitter, self.jitter - x.step)
            self.rate = max(self.base_rate, self.rate - x.step)
        if (self.jitter, self.rate) == old:
            return []
        action = f"temperature_jitter {old[0]:.2f} -> {self.jitter:.2f}, exploration_rate {old[1]:.2f} -> {self.rate:.2f}"
        return [Alert(kind="exploration", bucket="", evidence={"zero_signal_share": share}, action=action)]

    def settings(self) -> Exploration:
        return Exploration(temperature_jitter=self.jitter, exploration_rate=self.rate)

    def snapshot(self) -> dict[str, object]:
        return {"jitter": self.jitter, "rate": self.rate, "groups": self.groups, "zero": self.zero}

    def restore(self, doc: dict[str, Any]) -> None:
        self.jitter, self.rate = float(doc["jitter"]), float(doc["rate"])
        self.groups, self.zero = int(doc["groups"]), int(doc["zero"])
