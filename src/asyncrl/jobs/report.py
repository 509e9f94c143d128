"""``asyncrl report RUN``: one self-contained HTML file about a run (no external scripts, styles or fonts).

Sections (each shown when its data exists): run record and headline figures; success and reward
curves with the periodic evaluations; the data-freshness curve next to the loss; staleness histogram;
queue depth timeline with the watermarks and paused periods; role utilisation timeline; latency
breakdown of the trajectory lifecycle; reward and length distributions; evaluation table; alert
timeline (``alerts.jsonl``); learning signal per bucket (:mod:`asyncrl.telemetry.signal`); cost breakdown and waste (``cost.json``); credit view of sample
trajectories (a ``credit_view`` passed in: the CLI gives ``asyncrl.jobs.credit_inspect.credit_fragment``); role events.

This module prepares the data: each section is a list of blocks (:class:`Figure`, :class:`Row`,
:class:`Table`, :class:`Cards`, :class:`Note`, ...; :mod:`asyncrl.telemetry.report_blocks`); the sections
drawn from the roles' metric rows (and the run directory's loading, :class:`RunData`) are
:mod:`asyncrl.telemetry.report_metrics`, since only telemetry reads metric rows by name. The markup is the
Jinja2 template ``telemetry/templates/report.html.j2`` (autoescaped), which inlines ``report.css`` and the two scripts. Charts are
inline SVG built in Python (:mod:`asyncrl.telemetry.svg`). A short inline script checks on
load that every chart holds at least one visible data mark and records the result on ``<body>``
(``data-charts-total``, ``data-charts-rendered``, ``data-js-errors``), so a headless browser's DOM dump
proves the page rendered.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.telemetry import svg
from asyncrl.telemetry.report_blocks import (
    Block,
    Cards,
    Figure,
    Fragment,
    Heading,
    Note,
    Page,
    Row,
    Section,
    git,
    num,
    pct,
    render_page,
    table,
    text_of,
    when,
)
from asyncrl.telemetry.report_envs import env_blocks
from asyncrl.telemetry.report_metrics import RunData, freshness, learning, queue, step_wall, utilisation
from asyncrl.telemetry.reports import decode_rows
from asyncrl.telemetry.signal import signal_blocks, signal_series
from asyncrl.telemetry.svg import Series

CreditView = Callable[[Path, int], str]
"""Markup of ``n`` credit samples of a run (``asyncrl.jobs.credit_inspect.credit_fragment``)."""

STAGE_LABELS = {
    "env_s": "environment",
    "generation_s": "generation",
    "rollout_other_s": "other rollout",
    "queue_wait_s": "queue wait",
    "buffer_wait_s": "buffer wait",
}


# ---- sections -----------------------------------------------------------------------------------
class Report:
    def __init__(self, data: RunData, credit_view: CreditView | None = None) -> None:
        self.d, self.credit_view = data, credit_view
        self.sections: list[Section] = []
        self.n_charts = 0

    def chart(self, chart_id: str, title: str, svg_text: str, empty: str) -> Figure:
        if svg_text:
            self.n_charts += 1
        return Figure(chart_id, title, svg_text, empty)

    def add(self, sid: str, title: str, blocks: list[Block], intro: str = "") -> None:
        self.sections.append(Section(sid, title, blocks, intro))

    # 1. headline
    def headline(self) -> None:
        d, s, rec = self.d, self.d.summary, self.d.record
        facts: list[tuple[str, str]] = [
            ("run directory", str(d.dir)),
            ("status", str(rec.get("status") or ("finished" if s else "incomplete"))),
            ("created (UTC)", str(rec.get("created_utc", "-"))),
            ("mode", d.cfg.control.mode),
            ("environment", f"{d.cfg.env.kind} ({(rec.get('environment') or {}).get('class', '-')})"),
            ("config hash", str(rec.get("config_hash", "-"))),
            ("asyncrl / git", f"{rec.get('asyncrl_version', '-')} / {git(rec)}"),
            ("seeds", ", ".join(f"{k}={v}" for k, v in (rec.get("seeds") or {}).items()) or "-"),
            ("software", ", ".join(f"{k} {v}" for k, v in (rec.get("software") or {}).items() if v) or "-"),
        ]
        head = [
            ("held-out success", pct(s.get("initial_success")) + " → " + pct(s.get("final_success"))),
            ("samples trained", num(s.get("samples_trained"))),
            ("trainer steps", num(s.get("trainer_steps"))),
            ("staleness mean / max", f"{num(s.get('staleness_mean'))} / {num(s.get('staleness_max'))}"),
            (
                "dropped stale / lost",
                f"{num(s.get('samples_dropped_stale'))} / {num(s.get('lost_trajectories'))}",
            ),
            ("trainer busy", pct(s.get("trainer_busy_fraction"))),
            ("wall time", f"{num(s.get('wall_seconds'))} s"),
        ]
        if s.get("token_exact_checked") or s.get("token_exact_unchecked"):
            head.append(
                (
                    "token-exact / re-tokenisable",
                    f"{pct(s.get('token_exact_rate'))} of {num(s.get('token_exact_checked'))} checked "
                    f"({num(s.get('token_exact_unchecked'))} unchecked) / "
                    f"{pct(s.get('retokenization_exact_rate'))}",
                )
            )
        if s.get("cost_usd") is not None:
            head.append(("cost / wasted", f"${s['cost_usd']:.4f} / {pct(s.get('cost_waste_share'))}"))
        self.add("overview", "Overview", [Cards(head), table(["", ""], facts, cls="facts")])

    # 6. latency and distributions
    def latency(self) -> None:
        tr = self.d.traces
        if not tr:
            self.add(
                "latency",
                "Trajectory lifecycle",
                [Note("no lifecycle traces (telemetry.traces off, or nothing trained)")],
            )
            return
        means = [sum(float(t[k]) for t in tr) / len(tr) for k in STAGE_LABELS]
        bars = svg.bar_chart(
            "latency-bars",
            list(STAGE_LABELS.values()),
            means,
            y_label="mean seconds",
            x_label="stage",
            fmt="{:.3f} s",
        )
        e2e = svg.histogram(
            "e2e-hist", [float(t["end_to_end_s"]) for t in tr], x_label="seconds from creation to training"
        )
        rows = []
        for k, label in STAGE_LABELS.items():
            vals = sorted(float(t[k]) for t in tr)
            rows.append(
                (
                    label,
                    f"{means[list(STAGE_LABELS).index(k)]:.3f}",
                    f"{_q(vals, 0.5):.3f}",
                    f"{_q(vals, 0.9):.3f}",
                    f"{vals[-1]:.3f}",
                )
            )
        timing = Row(
            [
                self.chart("chart-latency", "Mean time per lifecycle stage", bars, "no stage timings"),
                self.chart("chart-e2e", "End-to-end latency (created → trained)", e2e, "no timings"),
            ]
        )
        stages = table(["stage", "mean s", "p50 s", "p90 s", "max s"], rows)
        rew = svg.histogram("reward-hist", [float(t["reward"]) for t in tr], x_label="final reward", bins=16)
        lens = svg.histogram(
            "length-hist", [float(t["tokens"]) for t in tr], x_label="tokens per trajectory", bins=20
        )
        dists = Row(
            [
                self.chart("chart-reward-hist", "Reward distribution (trained samples)", rew, "no rewards"),
                self.chart("chart-length-hist", "Length distribution (trained samples)", lens, "no lengths"),
            ]
        )
        self.add(
            "latency",
            "Trajectory lifecycle and data distributions",
            [timing, stages, dists],
            f"{len(tr)} trained trajectories traced.",
        )

    # 7. evaluation
    def evaluation(self) -> None:
        d = self.d
        rows = []
        pts: list[tuple[str, Any, Any, dict[str, Any]]] = (
            [("initial (warm start)", 0, 0, d.initial)] if d.initial else []
        )
        pts += [(f"periodic #{i + 1}", e.get("version"), e.get("step"), e) for i, e in enumerate(d.evals)]
        if d.final:
            pts.append(("final", d.summary.get("last_version"), d.summary.get("trainer_steps"), d.final))
        for name, ver, step, e in pts:
            rows.append(
                (
                    name,
                    num(ver),
                    num(step),
                    pct(e.get("success_rate")),
                    num(e.get("mean_reward")),
                    pct(e.get("tool_success_rate")),
                    num(e.get("avg_steps")),
                    num(e.get("distinct_2")),
                    num(e.get("episodes")),
                )
            )
        cols = [
            "evaluation",
            "version",
            "step",
            "success",
            "mean reward",
            "tool success",
            "avg steps",
            "distinct-2",
            "episodes",
        ]
        body = table(cols, rows) if rows else Note("no evaluations recorded")
        curve = [
            (float(v), float(e["success_rate"]))
            for _, v, _, e in pts
            if v is not None and "success_rate" in e
        ]
        heldout = Series(
            "held-out success", [p[0] for p in curve], [p[1] for p in curve], color="#dc2626", points=True
        )
        chart = svg.share_chart("heldout", [heldout], "weight version", "success rate")
        self.add(
            "evaluation",
            "Held-out evaluation",
            [
                self.chart(
                    "chart-heldout", "Held-out success over weight versions", chart, "no evaluations recorded"
                ),
                body,
            ],
            f"Held-out split, every {d.cfg.telemetry.eval_every} published versions (0: start and end only); latency and faults off.",
        )

    # 8. alerts
    def alerts(self) -> None:
        d = self.d
        events = []
        rows = []
        for a in d.alerts:
            t = when(a.get("time"), d.t0)
            kind = str(a.get("kind", "alert"))
            tip = f"{kind} [{a.get('bucket', '')}] {a.get('evidence', '')} → {a.get('action', '')}"
            if t is not None:
                events.append((t, kind, tip))
            rows.append(
                (
                    num(t) if t is not None else str(a.get("time")),
                    kind,
                    text_of(a.get("bucket")),
                    text_of(a.get("evidence")),
                    text_of(a.get("action")),
                )
            )
        for e in d.events:  # role restarts, weight fallbacks, ... belong on the same timeline
            t = when(e.get("time"), d.t0)
            if t is not None:
                events.append((t, f"event: {e['event']}", f"{e['event']} ({e.get('role', '')})"))
        end = max((float(r["time"]) - d.t0 for r in d.rows), default=None)
        chart = svg.timeline("alerts", events, x_label="seconds since start", x_max=end)
        body: list[Block] = [
            self.chart("chart-alerts", "Alerts and role events", chart, "no alerts or events recorded")
        ]
        if rows:
            body.append(table(["t (s)", "kind", "bucket", "evidence", "action"], rows))
        elif not (d.dir / "alerts.jsonl").is_file():
            body.append(Note("no alerts.jsonl in this run"))
        self.add("alerts", "Alerts", body + self._env_faults())

    def _env_faults(self) -> list[Block]:
        """Fault, retry and timeout counts per environment (``summary.json``'s ``env_faults``)."""
        faults = self.d.summary.get("env_faults") or {}
        cols = [
            "environment",
            "calls",
            "fault rate",
            "faults",
            "retries",
            "timeouts",
            "exceptions",
            "malformed",
        ]
        rows = [
            (
                env,
                f["calls"],
                pct(f["fault_rate"]),
                f["faults"],
                f["retries"],
                f["timeouts"],
                f["exceptions"],
                f["malformed"],
            )
            for env, f in faults.items()
        ]
        if not rows:
            return []
        notes: list[Block] = [Note(str(n), cls="intro") for n in self.d.summary.get("notes") or []]
        # env.kind: mix — each environment's own row (telemetry/report_envs.py)
        return [Heading("Environment faults"), table(cols, rows), *notes, *env_blocks(self.d.summary)]

    # 8b. learning signal
    def signal(self) -> None:
        d = self.d
        series = signal_series(decode_rows(d.events), d.cfg.signal_window())
        alerts = sum(a.get("kind") == "no_signal" for a in d.alerts)
        blocks = signal_blocks(
            series, d.t0, d.cost, alerts, self.chart, d.cfg.orchestrator.signal.no_signal_share
        )
        self.add(
            "signal",
            "Learning signal",
            blocks,
            f"Training groups per bucket in windows of {d.cfg.signal_window()} groups: the share whose rewards "
            "differ (only those carry a GRPO gradient) and the success of their episodes; "
            "a no_signal alert fires when the share stays under the line (orchestrator.signal).",
        )

    # 9. cost
    def cost(self) -> None:
        c = self.d.cost
        if not c:
            return

        def usd_bars(chart_id: str, usd: dict[str, float], x_label: str, color: str = svg.PALETTE[0]) -> str:
            values = [float(v) for v in usd.values()]
            return svg.bar_chart(
                chart_id, list(usd), values, y_label="USD", x_label=x_label, fmt="${:.6f}", color=color
            )

        a = usd_bars("cost-components", c.get("components_usd") or {}, "component")
        w = usd_bars("cost-waste", c.get("waste_usd") or {}, "cause", "#dc2626")
        charts = Row(
            [
                self.chart(
                    "chart-cost",
                    f"Cost by component — total ${float(c.get('total_usd', 0)):.6f}",
                    a,
                    "no cost components",
                ),
                self.chart(
                    "chart-waste",
                    f"Waste — {pct(c.get('waste_total_share'))} of the total",
                    w,
                    "no waste recorded",
                ),
            ]
        )
        rows = [(k, f"{float(v):.6g}") for k, v in (c.get("efficiency") or {}).items()]
        self.add(
            "cost",
            "Cost and waste",
            [charts, table(["efficiency", "value"], rows)],
            f"Device {self.d.cfg.cost.device}; see docs/cost.md for the accounting model.",
        )

    # 10. credit
    def credit(self) -> None:
        if self.credit_view is None:
            return
        try:
            block: Block = Fragment(str(self.credit_view(self.d.dir, 5)), cls="credit")
        except Exception as exc:  # shown, not hidden: the rest of the report is still useful
            block = Note(f"credit view failed: {type(exc).__name__}: {exc}")
        self.add("credit", "Credit view of sample trajectories", [block])

    def build(self) -> str:
        self.headline()
        for section in (learning, freshness, queue, utilisation, step_wall):  # drawn from the metric rows
            self.sections.append(section(self.d, self.chart))
        for part in (
            self.latency,
            self.evaluation,
            self.alerts,
            self.signal,
            self.cost,
            self.credit,
        ):
            part()
        return render_page(
            Page(
                title=f"asyncrl run report — {self.d.dir.name}",
                made=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                n_charts=self.n_charts,
                sections=self.sections,
            )
        )


def write_report(run_dir: Path, out: Path | None = None, *, credit_view: CreditView | None = None) -> Path:
    """Write the run's report (default ``RUN/report.html``) and return its path. ``credit_view`` makes the
    credit section (the CLI passes :func:`asyncrl.jobs.credit_inspect.credit_fragment`)."""
    html = Report(RunData(run_dir), credit_view).build()
    path = out or run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


# ---- helpers ------------------------------------------------------------------------------------
def _q(sorted_vals: list[float], q: float) -> float:
    return (
        sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))] if sorted_vals else 0.0
    )
