"""Learning signal per bucket over a run: the summary's ``signal`` and the report's "Learning signal" section.

Read from the ``rollout/group`` events (:class:`~asyncrl.telemetry.reports.GroupReport`, one per finished
group; held-out probes left out, as they are not trained). Per bucket and over the whole run, the groups
are cut, in the order they started, into consecutive windows of ``W`` groups (the no-signal rule's
window, :mod:`asyncrl.orchestrator.no_signal`); each window gives the share of groups whose rewards differed
(the groups that carry a GRPO gradient) and the success share of their episodes. The summary keeps the
whole-run and the last-window figures per bucket; the report draws every window, beside the cost
ledger's ``zero_advantage`` waste (what the groups without a difference cost) and the run's ``no_signal``
alerts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.learning_signal import advice, bucket_order, share_or_none
from asyncrl.telemetry import svg
from asyncrl.telemetry.report_blocks import Block, Figure, Note, Row, Table, pct
from asyncrl.telemetry.reports import Decoded, GroupReport
from asyncrl.telemetry.svg import HLine, Series

RUN = "all"
"""The whole run's key among the buckets."""


@dataclass
class GroupCounts:
    """Training groups summed: a window of a bucket's (or of the run's), or an environment's."""

    end: float = 0.0
    """Start time of its last group (seconds since the epoch)."""
    groups: int = 0
    differ: int = 0
    """Groups whose rewards differed."""
    successes: int = 0
    solved: int = 0
    """Groups with at least one success (pass@G's numerator)."""
    episodes: int = 0
    reward: float = 0.0
    faults: int = 0
    tokens: int = 0

    def add(self, g: GroupReport) -> None:
        self.end = max(self.end, g.started)
        self.groups += 1
        self.differ += len(set(g.rewards)) > 1
        self.successes += sum(o == "success" for o in g.outcomes)
        self.solved += "success" in g.outcomes
        self.episodes += len(g.rewards)
        self.reward += sum(g.rewards)
        self.faults += g.faults
        self.tokens += g.tokens

    @property
    def signal_share(self) -> float | None:
        return share_or_none(self.differ, self.groups)

    @property
    def success(self) -> float | None:
        return share_or_none(self.successes, self.episodes)


@dataclass
class BucketSeries:
    windows: list[GroupCounts] = field(default_factory=list)
    total: GroupCounts = field(default_factory=GroupCounts)


def signal_series(reports: Iterable[Decoded], window: int) -> dict[str, BucketSeries]:
    """{bucket (and ``"all"``): its windows of ``window`` training groups and its total}, from the group
    reports among ``reports``, in the order the groups started."""
    groups = sorted((r for r in reports if isinstance(r, GroupReport)), key=lambda g: g.started)
    out: dict[str, BucketSeries] = {}
    for g in groups:
        if g.heldout or not g.rewards:
            continue
        for key in (g.bucket, RUN):
            s = out.setdefault(key, BucketSeries())
            if not s.windows or s.windows[-1].groups >= window:
                s.windows.append(GroupCounts())
            s.windows[-1].add(g)
            s.total.add(g)
    return dict(sorted(out.items(), key=lambda kv: (kv[0] == RUN, bucket_order(kv[0]))))


def signal_summary(reports: Iterable[Decoded], cfg: RunConfig) -> dict[str, Any]:
    """The summary's ``signal``: per bucket (and ``all``) groups, shares over the run and in its last window,
    and the advice for the last window (:func:`asyncrl.learning_signal.advice`)."""
    c, g = cfg.orchestrator.signal, cfg.rollout.group_size
    out: dict[str, Any] = {}
    for key, s in signal_series(reports, cfg.signal_window()).items():
        last = s.windows[-1]
        p, solved = last.success, share_or_none(last.solved, last.groups)
        fix = (
            advice(p, last.signal_share, g, c.band_low, c.band_high, lowest=None, pass_at_g=solved)
            if p is not None
            else None
        )
        out[key] = {
            "groups": s.total.groups,
            "signal_share": s.total.signal_share,
            "success": s.total.success,
            "last_window_groups": last.groups,
            "last_signal_share": last.signal_share,
            "last_success": p,
            "last_pass_at_g": solved,
            "advice": fix,
        }
    return out


def signal_blocks(
    series: dict[str, BucketSeries], t0: float, cost: dict[str, Any], alerts: int, threshold: float
) -> list[Block]:
    """The report section: share of groups with a reward difference and success per bucket over time,
    a table per bucket, and the zero-advantage waste beside them."""
    if not series:
        return [Note("no training groups recorded (no rollout/group events)")]

    def lines(value: Callable[[GroupCounts], float | None]) -> list[Series]:
        return [
            Series(
                key,
                [w.end - t0 for w in s.windows],
                [value(w) for w in s.windows],
                color="#111827" if key == RUN else "",
                dashed=key == RUN,
            )
            for key, s in series.items()
        ]

    since = "seconds since start"
    alert_line = [HLine(1.0 - threshold, "no_signal alert below")]
    shares = lines(lambda w: w.signal_share)
    differ = svg.line_chart(
        "signal-share", shares, since, "groups with a difference", share=True, hlines=alert_line
    )
    success = svg.line_chart("signal-success", lines(lambda w: w.success), since, "success", share=True)
    row = Row(
        Figure("chart-signal-share", "Groups with a reward difference, per bucket", differ, "no groups"),
        Figure("chart-signal-success", "Success, per bucket", success, "no groups"),
    )
    rows = [
        (
            key,
            s.total.groups,
            pct(s.total.signal_share),
            f"{pct(s.windows[0].signal_share)} → {pct(s.windows[-1].signal_share)}",
            pct(s.total.success),
            f"{pct(s.windows[0].success)} → {pct(s.windows[-1].success)}",
        )
        for key, s in series.items()
    ]
    cols = ["bucket", "groups", "with a difference", "first → last window", "success", "first → last window"]
    z, total = (cost.get("waste_usd") or {}).get("zero_advantage"), cost.get("total_usd")
    share = f" ({float(z) / float(total):.1%} of the total cost)" if z is not None and total else ""
    note = (
        f"Zero-advantage waste (cost ledger): ${float(z):.6f}{share}; no_signal alerts: {alerts}."
        if z is not None
        else f"No cost ledger in this run; no_signal alerts: {alerts}."
    )
    return [row, Table(cols, rows), Note(note, cls="intro")]
