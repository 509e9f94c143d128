"""``asyncrl report RUN``: one self-contained HTML file about a run (no external scripts, styles or fonts).

Sections (each shown when its data exists): run record and headline figures; success and reward
curves with the periodic evaluations; the data-freshness curve next to the loss; staleness histogram;
queue depth timeline with the watermarks and paused periods; role utilisation timeline; latency
breakdown of the trajectory lifecycle; reward and length distributions; evaluation table; alert
timeline (``alerts.jsonl``); learning signal per bucket (:mod:`asyncrl.telemetry.signal`); cost breakdown and waste (``cost.json``); credit view of sample
trajectories (a ``credit_view`` passed in: the CLI gives ``asyncrl.jobs.credit_inspect.credit_fragment``); role events.

This module prepares the data: each section is a list of blocks (:class:`Figure`, :class:`Row`,
:class:`Table`, :class:`Cards`, :class:`Note`, ...; :mod:`asyncrl.telemetry.report_blocks`). The markup is the Jinja2 template
``templates/report.html.j2`` (autoescaped), which inlines ``report.css`` and the two scripts. Charts are
inline SVG built in Python (:mod:`asyncrl.telemetry.svg`). A short inline script checks on
load that every chart holds at least one visible data mark and records the result on ``<body>``
(``data-charts-total``, ``data-charts-rendered``, ``data-js-errors``), so a headless browser's DOM dump
proves the page rendered.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.errors import UserError
from asyncrl.telemetry import svg
from asyncrl.telemetry.jsonl import read_jsonl, read_jsonl_dir
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
from asyncrl.telemetry.reports import decode_rows
from asyncrl.telemetry.signal import signal_blocks, signal_series
from asyncrl.telemetry.svg import Band, Chart, HLine, Series
from asyncrl.telemetry.walltime import step_walls

CreditView = Callable[[Path, int], str]
"""Markup of ``n`` credit samples of a run (``asyncrl.jobs.credit_inspect.credit_fragment``)."""

STAGE_LABELS = {
    "env_s": "environment",
    "generation_s": "generation",
    "rollout_other_s": "other rollout",
    "queue_wait_s": "queue wait",
    "buffer_wait_s": "buffer wait",
}


# ---- loading -----------------------------------------------------------------------------------
def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


class RunData:
    def __init__(self, run_dir: Path) -> None:
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"{str(run_dir)!r}: not a run directory (no config.yaml)")
        from asyncrl.config import load_config

        self.dir = run_dir
        self.cfg = load_config(run_dir / "config.yaml")
        rows: list[dict[str, Any]] = []
        rows.extend(read_jsonl_dir(run_dir / "metrics"))
        rows.sort(key=lambda r: float(r.get("time") or 0.0))
        self.events = [r for r in rows if "event" in r]
        self.rows = [r for r in rows if "event" not in r]
        self.trainer = [r for r in self.rows if r.get("role") == "trainer"]
        self.orch = [r for r in self.rows if r.get("role") == "orchestrator"]
        self.record = _json(run_dir / "run.json")
        self.summary = _json(run_dir / "summary.json")
        self.initial = _json(run_dir / "initial_eval.json")
        self.final = _json(run_dir / "final_eval.json")
        self.evals = read_jsonl(run_dir / "evals.jsonl")
        self.traces = read_jsonl(run_dir / "traces" / "trained.jsonl")
        self.alerts = read_jsonl(run_dir / "alerts.jsonl")
        self.cost = _json(run_dir / "cost.json")
        starts = [float(r["time"]) - float(r.get("alive_s") or 0.0) for r in self.rows if "time" in r]
        self.t0 = min(starts, default=float(self.record.get("created") or 0.0))

    def series(
        self, rows: list[dict[str, Any]], key: str, x: str = "step"
    ) -> tuple[list[float], list[float | None]]:
        xs: list[float] = []
        ys: list[float | None] = []
        for r in rows:
            if key not in r:
                continue
            xv = float(r["time"]) - self.t0 if x == "time" else r.get(x)
            if xv is None:
                continue
            v = r[key]
            xs.append(float(xv))
            ys.append(float(v) if isinstance(v, (int, float)) else None)
        return xs, ys


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

    # 2. success and reward
    def learning(self) -> None:
        d = self.d
        xs, ys = d.series(d.trainer, "reward/success_rate")
        mx, my = d.series(d.trainer, "reward/success_rate_ma")
        ex, ey = self._eval_points("success_rate")
        success = svg.line_chart(
            "success",
            Chart(
                series=[
                    Series("train batch", xs, ys, color="#93c5fd"),
                    Series("moving average", mx, my, color="#2563eb"),
                    Series("held-out eval", ex, ey, color="#dc2626", points=True),
                ],
                x_label="trainer step",
                y_label="success rate",
                y_min=0.0,
                y_max=1.0,
                percent=True,
            ),
        )
        rx, ry = d.series(d.trainer, "reward/mean")
        erx, ery = self._eval_points("mean_reward")
        reward = svg.line_chart(
            "reward",
            Chart(
                series=[
                    Series("batch mean", rx, ry),
                    Series("held-out eval", erx, ery, points=True, color="#dc2626"),
                ],
                x_label="trainer step",
                y_label="reward",
            ),
        )
        row = Row(
            [
                self.chart("chart-success", "Success rate", success, "no trained batches yet"),
                self.chart("chart-reward", "Reward", reward, "no trained batches yet"),
            ]
        )
        self.add(
            "learning",
            "Success and reward",
            [row],
            "Per trained batch (training reward) and on the held-out split (evaluation, independent of training reward).",
        )

    def _eval_points(self, key: str) -> tuple[list[float], list[float | None]]:
        d = self.d
        pts: list[tuple[float, float]] = []
        if key in d.initial:
            pts.append((0.0, float(d.initial[key])))
        pts += [(float(e.get("step", 0)), float(e[key])) for e in d.evals if key in e]
        if key in d.final and d.summary.get("trainer_steps") is not None:
            pts.append((float(d.summary["trainer_steps"]), float(d.final[key])))
        return [p[0] for p in pts], [p[1] for p in pts]

    # 3. freshness next to the loss
    def freshness(self) -> None:
        d = self.d
        sx, sy = d.series(d.trainer, "staleness/mean")
        mx, my = d.series(d.trainer, "staleness/max")
        limit = d.cfg.staleness_policy().max_staleness  # rule 5: the mode fixes it
        fresh = svg.line_chart(
            "freshness",
            Chart(
                series=[
                    Series("mean version lag", sx, sy),
                    Series("max version lag", mx, my, dashed=True, color="#ea580c"),
                ],
                x_label="trainer step",
                y_label="versions",
                y_min=0.0,
                hlines=[HLine(float(limit), f"max_staleness {limit}")],
            ),
        )
        lx, ly = d.series(d.trainer, "loss/policy")
        kx, ky = d.series(d.trainer, "kl/behaviour_k3")
        loss = svg.line_chart(
            "loss",
            Chart(
                series=[Series("policy loss", lx, ly, color="#9333ea")],
                x_label="trainer step",
                y_label="loss",
            ),
        )
        kl = svg.line_chart(
            "kl",
            Chart(
                series=[Series("KL(behaviour ‖ current), k3", kx, ky, color="#0891b2")],
                x_label="trainer step",
                y_label="KL",
            ),
        )
        first = Row(
            [
                self.chart(
                    "chart-freshness",
                    "Data freshness: version lag of each trained batch",
                    fresh,
                    "no trained batches yet",
                ),
                self.chart("chart-loss", "Policy loss", loss, "no loss recorded"),
            ]
        )
        drift = self.chart(
            "chart-kl", "Policy drift: KL between behaviour and current policy", kl, "no KL recorded"
        )
        ages = [float(t["age"]) for t in d.traces] or [
            float(k) for k, n in (d.summary.get("staleness_hist") or {}).items() for _ in range(int(n))
        ]
        hist = svg.histogram("staleness-hist", ages, x_label="age in versions at training", integer=True)
        second = Row(
            [
                drift,
                self.chart(
                    "chart-staleness-hist",
                    "Staleness histogram (trained samples)",
                    hist,
                    "no trained samples",
                ),
            ]
        )
        self.add(
            "freshness",
            "Data freshness, loss and drift",
            [first, second],
            "The version lag of each trained batch (how old its data was) next to the loss it produced.",
        )

    # 4. queue
    def queue(self) -> None:
        d = self.d
        rx, ry = d.series(d.trainer, "queue/ready", x="time")
        lx, ly = d.series(d.trainer, "queue/leased", x="time")
        cap = d.cfg.transport.capacity
        oc = d.cfg.orchestrator
        bands: list[Band] = []
        start: float | None = None
        for r in d.orch:
            t = float(r["time"]) - d.t0
            if r.get("orchestrator/paused") and start is None:
                start = t
            elif not r.get("orchestrator/paused") and start is not None:
                bands.append(Band(start, t, "admission paused (high watermark)"))
                start = None
        if start is not None and d.orch:
            bands.append(Band(start, float(d.orch[-1]["time"]) - d.t0, "admission paused (high watermark)"))
        chart = svg.line_chart(
            "queue",
            Chart(
                series=[
                    Series("ready", rx, ry),
                    Series("leased by trainer", lx, ly, dashed=True, color="#16a34a"),
                ],
                x_label="seconds since start",
                y_label="entries",
                y_min=0.0,
                bands=bands,
                hlines=[
                    HLine(oc.high_watermark * cap, "high watermark"),
                    HLine(oc.low_watermark * cap, "low watermark"),
                ],
            ),
        )
        paused = sum(b.x1 - b.x0 for b in bands)
        self.add(
            "queue",
            "Queue depth",
            [
                self.chart(
                    "chart-queue", "Queue depth and watermark state", chart, "no queue figures recorded"
                )
            ],
            f"Capacity {cap}; shaded: admission paused ({paused:.0f} s in all).",
        )

    # 5. utilisation
    def utilisation(self) -> None:
        d = self.d
        busy_key = {"trainer": "trainer/busy_seconds"}
        per: dict[str, list[tuple[float, float]]] = {}
        prev: dict[tuple[str, int], tuple[float, float]] = {}
        times = [float(r["time"]) for r in d.rows]
        window = max(2.0, (max(times) - min(times)) / 120) if times else 2.0  # ~120 points per role
        for r in d.rows:
            role = str(r.get("role", ""))
            key = busy_key.get(role, "rollout/gen_busy_seconds" if role.startswith("rollout") else "")
            if not key or key not in r or r.get(key) is None:
                continue
            ident = (role, int(r.get("pid") or 0))
            t, b = float(r["time"]), float(r[key])
            if ident in prev and t - prev[ident][0] >= window:
                pt, pb = prev[ident]
                per.setdefault(role, []).append((t - d.t0, max(0.0, min(1.0, (b - pb) / (t - pt)))))
                prev[ident] = (t, b)
            elif ident not in prev:
                prev[ident] = (t, b)
        series = [Series(role, [p[0] for p in pts], [p[1] for p in pts]) for role, pts in sorted(per.items())]
        chart = svg.line_chart(
            "utilisation",
            Chart(
                series=series,
                x_label="seconds since start",
                y_label="busy fraction",
                y_min=0.0,
                y_max=1.0,
                percent=True,
            ),
        )
        self.add(
            "utilisation",
            "Role utilisation",
            [
                self.chart(
                    "chart-utilisation",
                    "Busy fraction per role (trainer: training steps; rollout: generation)",
                    chart,
                    "not enough rows for rates",
                )
            ],
        )

    def step_wall(self) -> None:
        """Where each step's wall time went (:func:`asyncrl.telemetry.walltime.step_walls`)."""

        walls = step_walls(self.d.rows)
        if not walls:
            self.add("step-wall", "Wall time per step", [Note("no trainer steps recorded")])
            return
        xs = [float(w.step) for w in walls]
        parts = [
            ("step wall", "wall", "#111827"),
            ("train", "train", "#2563eb"),
            ("publish", "publish", "#7c3aed"),
            ("trainer idle", "idle", "#9ca3af"),
            ("rollout generating", "generate", "#16a34a"),
            ("prefill", "prefill", "#f59e0b"),
            ("decode", "decode", "#dc2626"),
        ]
        chart = svg.line_chart(
            "step-wall",
            Chart(
                series=[
                    Series(label, xs, [getattr(w, f) for w in walls], color=c, points=True)
                    for label, f, c in parts
                ],
                x_label="trainer step",
                y_label="seconds",
                y_min=0.0,
            ),
        )
        cols = [
            "step",
            "wall s",
            "train",
            "publish",
            "other",
            "idle",
            "rollout",
            "prefill",
            "decode",
            "lent thr·s",
        ]
        fields = ["wall", "train", "publish", "other", "idle", "generate", "prefill", "decode", "borrowed"]
        rows = [[str(w.step), *(f"{getattr(w, f):.1f}" for f in fields)] for w in walls]
        rows.append(["all", *(f"{sum(getattr(w, f) for w in walls):.1f}" for f in fields)])
        self.add(
            "step-wall",
            "Wall time per step",
            [
                self.chart(
                    "chart-step-wall", "Seconds per training step, by role and phase", chart, "no steps"
                ),
                table(cols, rows),
            ],
            "Each step's interval (trainer row to trainer row): the trainer's learning, publishing, other work "
            "and idle time; the rollout workers' generation (prefill + decode, summed over workers), which "
            "overlaps training in async mode; thread-seconds lent between roles (core lending).",
        )

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
        chart = svg.line_chart(
            "heldout",
            Chart(
                series=[
                    Series(
                        "held-out success",
                        [p[0] for p in curve],
                        [p[1] for p in curve],
                        color="#dc2626",
                        points=True,
                    )
                ],
                x_label="weight version",
                y_label="success rate",
                y_min=0.0,
                y_max=1.0,
                percent=True,
            ),
        )
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
        comp = c.get("components_usd") or {}
        waste = c.get("waste_usd") or {}
        a = svg.bar_chart(
            "cost-components",
            list(comp),
            [float(v) for v in comp.values()],
            y_label="USD",
            x_label="component",
            fmt="${:.6f}",
        )
        w = svg.bar_chart(
            "cost-waste",
            list(waste),
            [float(v) for v in waste.values()],
            y_label="USD",
            x_label="cause",
            fmt="${:.6f}",
            color="#dc2626",
        )
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
        for part in (
            self.headline,
            self.learning,
            self.freshness,
            self.queue,
            self.utilisation,
            self.step_wall,
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
    credit section (the CLI passes :func:`asyncrl.jobs.credit_inspect.credit_fragment`; the credit package sits
    above telemetry, so the report does not import it)."""
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
