"""Learning signal: which groups can teach a GRPO policy anything, and what to change when none can.

It sits on the lowest floor (it imports nothing of asyncrl) so that ``asyncrl env signal`` (the check
before a run, :mod:`asyncrl.jobs.env_signal`), the no-signal rule during a run
(:mod:`asyncrl.orchestrator.no_signal`) and the report's per-bucket chart (:mod:`asyncrl.telemetry.report_signal`)
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
* **pass@G** of a bucket: the share of its tasks with at least one success in their group of ``G``
  (the groups already played, no extra episode). A warm start from the policy's own successful episodes
  (``trainer.sft.source: rollouts``) has something to learn from exactly where it is above 0.
* **Advice** (:func:`advice`) names the next step that can work: a larger group where success is rare,
  the rollouts warm start, a lower level only where the task type has one (never at its lowest level),
  and, where no episode succeeds at all, what can still lift pass@G above 0 (more samples per task, a
  tool, demonstrations that show the work, a partial reward).
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


ROLLOUTS = "a warm start from the policy's own successful episodes (trainer.sft.source: rollouts)"
"""The warm start that needs no demonstration: it keeps what the policy already solves once in a while."""


def advice(
    p: float,
    measured: float | None,
    group_size: int,
    low: float,
    high: float,
    *,
    lowest: bool | None,
    pass_at_g: float | None,
) -> str:
    """What to change for a bucket with success ``p``, a measured share ``measured`` of groups with a
    reward difference and ``pass_at_g``, the share of its tasks with at least one success in a group of
    ``group_size`` (``None``: not measured), as one sentence naming the config fields. ``lowest``: the
    bucket is at its task type's lowest level (``False``: a lower one exists; ``None``: not known) — the
    advice never says to lower a difficulty that cannot go lower."""
    v = verdict(p, low, high)
    if v == "no_success":
        text = _no_success(group_size, lowest)
    elif v == "solved":
        text = "every episode succeeds: raise the difficulty (env.min_difficulty) or drop this bucket"
    elif v == "rare":
        text = _rare(p, group_size, lowest, pass_at_g)
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


def _no_success(g: int, lowest: bool | None) -> str:
    """Advice at ``p = 0`` (pass@G is 0 too): a lower level where one exists, else what can still work."""
    beyond = (
        f"{ROLLOUTS} needs one success per task, so give it more samples per task than {g}; or give the "
        "environment a tool that does the hard step, demonstrations that show the work, or a partial "
        "reward instead of all-or-nothing"
    )
    if lowest is None:
        return f"no episode succeeds (pass@{g} 0%): lower the difficulty where there is a lower level (env.max_difficulty); {beyond}"
    if lowest:
        return f"no episode succeeds (pass@{g} 0%), down to this task type's lowest level: {beyond}"
    return (
        f"no episode succeeds (pass@{g} 0%): scan this task type's lower levels (asyncrl env signal --levels) "
        f"and train on those with success (env.max_difficulty); if none has any, {beyond}"
    )


def _rare(p: float, g: int, lowest: bool | None, pass_at_g: float | None) -> str:
    """Advice at ``0 < p < low``: a larger group, the rollouts warm start (pass@G > 0), a lower level."""
    size = group_size_for(p, 0.5)
    bigger = f"rollout.group_size {size} gives half the groups a difference" if size else "a larger group"
    solved = f", pass@{g} {pass_at_g:.0%} of tasks" if pass_at_g is not None else ""
    lower = "" if lowest else "; or lower env.max_difficulty to reach the band"
    return f"success is rare ({p:.0%}{solved}): {bigger}; {ROLLOUTS} lifts success toward the band{lower}"


def share_or_none(hits: int, total: int) -> float | None:
    """``hits / total``, or ``None`` when nothing was measured (never a made-up 0)."""
    return hits / total if total else None


def fmt_share(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.0%}"


def bucket_order(bucket: str) -> tuple[str, int, str]:
    """Sort key of a bucket ``[env/]type:difficulty``: by task type, then by difficulty as a number
    (``x:2`` before ``x:10``); a difficulty that is not a number sorts after the numbers, by text."""
    task_type, _, level = bucket.rpartition(":")
    return (task_type, int(level), "") if level.isdigit() else (task_type, 1 << 62, level)


def levels_label(levels: list[int]) -> str:
    """``0–35`` for a run of levels, ``0–3, 5, 10`` for runs and single levels (ascending input)."""
    runs: list[list[int]] = []
    for d in levels:
        if runs and d == runs[-1][-1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)
