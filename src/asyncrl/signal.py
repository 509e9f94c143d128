"""Learning signal: which groups can teach a GRPO policy anything, and what to change when none can.

It sits on the lowest floor (it imports nothing of asyncrl) so that ``asyncrl env signal`` (the check
before a run, :mod:`asyncrl.jobs.signal`), the no-signal rule during a run
(:mod:`asyncrl.orchestrator.signal`) and the report's per-bucket chart (:mod:`asyncrl.telemetry.signal`)
say the same thing in the same words.

Definitions
-----------
* A group **has a reward difference** when its members' final rewards are not all equal. A
  group-relative advantage (GRPO, Shao et al. 2024: ``A_i = r_i − mean(r)``) is zero for every member
  of a group without one, so such a group contributes no gradient (the cost ledger books it as
  ``zero_advantage`` waste).
* **Expected share of groups with a reward difference.** With a binary reward (1 on success, else 0),
  episodes of one group independent, each a success with probability ``p``, a group of ``G`` members
  has a reward difference unless all succeed or all fail::

      s(p, G) = 1 − p^G − (1 − p)^G

  (``s(0, G) = s(1, G) = 0``; ``s(p, 1) = 0``; ``s`` is largest at ``p = 1/2``). Measured shares can be
  lower: ``p`` is an average over tasks, and a policy that always solves some tasks and never others has
  no difference in any group even at ``p = 1/2`` (sampling too cold for the task mix).
* **The learnable band** ``[low, high]`` of success (``orchestrator.signal.band_low`` / ``band_high``,
  15–50 % by default): low enough that there is something to learn, high enough that groups of the
  configured size mostly carry a difference. A bucket is classified by its success ``p`` and the share
  ``m`` of its groups with a difference (:func:`verdict`):

  ========== ====================================================================================
  verdict    when
  ========== ====================================================================================
  no_success ``p = 0``: nothing to learn from; the task is out of reach of this policy
  solved     ``p = 1``: nothing left to learn
  rare       ``0 < p < low``: a few groups carry a difference; more members per group help
  learnable  ``low ≤ p ≤ high``
  easy       ``high < p < 1``: signal, but little left to gain
  ========== ====================================================================================

  and, whatever the band, **cold** when ``m`` is under half of ``s(p, G)``: successes and failures fall
  on different tasks, not within groups.
"""

from __future__ import annotations

import math
from typing import Literal

Verdict = Literal["no_success", "rare", "learnable", "easy", "solved"]


def signal_share(p: float, group_size: int) -> float:
    """``s(p, G) = 1 − p^G − (1 − p)^G``: the expected share of groups of ``group_size`` binary-reward
    episodes with success probability ``p`` whose rewards differ (module docstring)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"success probability {p} is outside [0, 1]")
    if group_size < 2:
        return 0.0
    return max(0.0, 1.0 - p**group_size - (1.0 - p) ** group_size)


def group_size_for(p: float, target: float) -> int | None:
    """The smallest group size ``G ≥ 2`` with ``s(p, G) ≥ target``; ``None`` when no size reaches it (``p``
    is 0 or 1, or ``target ≥ 1``). With ``q = max(p, 1 − p)``, ``q^G ≤ p^G + (1 − p)^G ≤ 2 q^G``, so the
    answer is at most ``⌈log((1 − target) / 2) / log q⌉``: the search is bounded."""
    q = max(p, 1.0 - p)
    if not 0.0 < p < 1.0 or target >= 1.0:
        return None
    bound = max(2, math.ceil(math.log((1.0 - target) / 2.0) / math.log(q)))
    return next(g for g in range(2, bound + 1) if signal_share(p, g) >= target)


def verdict(p: float, low: float, high: float) -> Verdict:
    """The band a success rate ``p`` falls in (module docstring)."""
    if p <= 0.0:
        return "no_success"
    if p >= 1.0:
        return "solved"
    if p < low:
        return "rare"
    return "learnable" if p <= high else "easy"


def cold(measured: float | None, p: float, group_size: int) -> bool:
    """Groups carry a difference far less often than ``s(p, G)`` predicts (under half of it)."""
    expected = signal_share(p, group_size)
    return measured is not None and expected > 0.0 and measured < expected / 2.0


def advice(p: float, measured: float | None, group_size: int, low: float, high: float) -> str:
    """What to change for a bucket with success ``p`` and a measured share ``measured`` of groups with a
    reward difference (``None``: not measured), as one sentence naming the config fields."""
    v = verdict(p, low, high)
    if v == "no_success":
        text = (
            "no episode succeeds: lower the difficulty (env.max_difficulty, or drop this task type), "
            "warm-start longer (trainer.sft.steps), or make the reward partial instead of all-or-nothing"
        )
    elif v == "solved":
        text = "every episode succeeds: raise the difficulty (env.min_difficulty) or drop this bucket"
    elif v == "rare":
        g = group_size_for(p, 0.5)
        bigger = f"rollout.group_size {g} gives half the groups a difference" if g else "a larger group"
        text = (
            f"success is rare ({p:.0%}): {bigger}, or warm-start longer (trainer.sft.steps) / lower "
            "env.max_difficulty to reach the band"
        )
    elif v == "easy":
        text = f"mostly solved ({p:.0%}): little left to gain; raise env.min_difficulty for harder tasks"
    else:
        text = "in the learnable band"
    if cold(measured, p, group_size):
        text += (
            f"; only {measured:.0%} of groups differ against {signal_share(p, group_size):.0%} expected: "
            "the policy solves some tasks always and others never, so raise rollout.sampling.temperature"
        )
    return text


def share_or_none(hits: int, total: int) -> float | None:
    """``hits / total``, or ``None`` when nothing was measured (never a made-up 0)."""
    return hits / total if total else None


def fmt_share(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.0%}"
