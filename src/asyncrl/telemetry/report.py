"""``asyncrl report RUN``: one self-contained HTML file about a run (no external scripts, styles or fonts).

Sections (each shown when its data exists): run record and headline figures; success and reward
curves with the periodic evaluations; the data-freshness curve next to the loss; staleness histogram;
queue depth timeline with the watermarks and paused periods; role utilisation timeline; latency
breakdown of the trajectory lifecycle; reward and length distributions; evaluation table; alert
timeline (``alerts.jsonl``); cost breakdown and waste (``cost.json``); credit view of sample
trajectories (``asyncrl.credit.inspect.credit_fragment``, when that module exists); role events.

Charts are inline SVG built in Python (:mod:`asyncrl.telemetry.svg`). A short inline script checks on
load that every chart holds at least one visible data mark and records the result on ``<body>``
(``data-charts-total``, ``data-charts-rendered``, ``data-js-errors``), so a headless browser's DOM dump
proves the page rendered.
"""

from __future__ import annotations

import datetime
import importlib
import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from asyncrl.errors import UserError
from asyncrl.telemetry import svg
from asyncrl.telemetry.jsonl import read_jsonl, read_jsonl_dir
from asyncrl.telemetry.svg import Band, Chart, HLine, Series

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
    def __init__(self, data: RunData) -> None:
        self.d = data
        self.sections: list[tuple[str, str, str]] = []  # (id, title, html)
        self.n_charts = 0

    def chart(self, chart_id: str, title: str, svg_text: str, empty: str) -> str:
        if not svg_text:
            return f'<p class="empty">{escape(empty)}</p>'
        self.n_charts += 1
        return f'<figure class="chart" id="{chart_id}"><figcaption>{escape(title)}</figcaption>{svg_text}</figure>'

    def add(self, sid: str, title: str, body: str, intro: str = "") -> None:
        text = (f'<p class="intro">{intro}</p>' if intro else "") + body
        self.sections.append((sid, title, text))

    # 1. headline
    def headline(self) -> None:
        d, s, rec = self.d, self.d.summary, self.d.record
        facts: list[tuple[str, str]] = [
            ("run directory", str(d.dir)),
            ("status", str(rec.get("status") or ("finished" if s else "incomplete"))),
            ("created (UTC)", str(rec.get("created_utc", "-"))),
            ("mode", d.cfg.orchestrator.mode),
            ("environment", f"{d.cfg.env.kind} ({(rec.get('environment') or {}).get('class', '-')})"),
            ("config hash", str(rec.get("config_hash", "-"))),
            ("asyncrl / git", f"{rec.get('asyncrl_version', '-')} / {_git(rec)}"),
            ("seeds", ", ".join(f"{k}={v}" for k, v in (rec.get("seeds") or {}).items()) or "-"),
            ("software", ", ".join(f"{k} {v}" for k, v in (rec.get("software") or {}).items() if v) or "-"),
        ]
        head = [
            ("held-out success", _pct(s.get("initial_success")) + " → " + _pct(s.get("final_success"))),
            ("samples trained", _num(s.get("samples_trained"))),
            ("trainer steps", _num(s.get("trainer_steps"))),
            ("staleness mean / max", f"{_num(s.get('staleness_mean'))} / {_num(s.get('staleness_max'))}"),
            (
                "dropped stale / lost",
                f"{_num(s.get('samples_dropped_stale'))} / {_num(s.get('lost_trajectories'))}",
            ),
            ("trainer busy", _pct(s.get("trainer_busy_fraction"))),
            ("wall time", f"{_num(s.get('wall_seconds'))} s"),
        ]
        if s.get("token_exact_rate") is not None:
            head.append(
                (
                    "token-exact / re-tokenisable",
                    f"{_pct(s.get('token_exact_rate'))} / {_pct(s.get('retokenization_exact_rate'))}",
                )
            )
        if s.get("cost_usd") is not None:
            head.append(("cost / wasted", f"${s['cost_usd']:.4f} / {_pct(s.get('cost_waste_share'))}"))
        cards = "".join(
            f'<div class="card"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div></div>'
            for k, v in head
        )
        self.add(
            "overview", "Overview", f'<div class="cards">{cards}</div>' + _table(["", ""], facts, cls="facts")
        )

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
        body = '<div class="row">' + self.chart(
            "chart-success", "Success rate", success, "no trained batches yet"
        )
        body += self.chart("chart-reward", "Reward", reward, "no trained batches yet") + "</div>"
        self.add(
            "learning",
            "Success and reward",
            body,
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
        limit = d.cfg.orchestrator.max_staleness if d.cfg.orchestrator.mode == "async" else None
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
                hlines=[HLine(float(limit), f"max_staleness {limit}")] if limit is not None else [],
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
        body = '<div class="row">' + self.chart(
            "chart-freshness",
            "Data freshness: version lag of each trained batch",
            fresh,
            "no trained batches yet",
        )
        body += self.chart("chart-loss", "Policy loss", loss, "no loss recorded") + "</div>"
        body += '<div class="row">' + self.chart(
            "chart-kl", "Policy drift: KL between behaviour and current policy", kl, "no KL recorded"
        )
        ages = [float(t["age"]) for t in d.traces] or [
            float(k) for k, n in (d.summary.get("staleness_hist") or {}).items() for _ in range(int(n))
        ]
        hist = svg.histogram("staleness-hist", ages, x_label="age in versions at training", integer=True)
        body += (
            self.chart(
                "chart-staleness-hist", "Staleness histogram (trained samples)", hist, "no trained samples"
            )
            + "</div>"
        )
        self.add(
            "freshness",
            "Data freshness, loss and drift",
            body,
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
            self.chart("chart-queue", "Queue depth and watermark state", chart, "no queue figures recorded"),
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
            self.chart(
                "chart-utilisation",
                "Busy fraction per role (trainer: training steps; rollout: generation)",
                chart,
                "not enough rows for rates",
            ),
        )

    # 6. latency and distributions
    def latency(self) -> None:
        tr = self.d.traces
        if not tr:
            self.add(
                "latency",
                "Trajectory lifecycle",
                '<p class="empty">no lifecycle traces (telemetry.traces off, or nothing trained)</p>',
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
        body = '<div class="row">' + self.chart(
            "chart-latency", "Mean time per lifecycle stage", bars, "no stage timings"
        )
        body += (
            self.chart("chart-e2e", "End-to-end latency (created → trained)", e2e, "no timings") + "</div>"
        )
        body += _table(["stage", "mean s", "p50 s", "p90 s", "max s"], rows)
        rew = svg.histogram("reward-hist", [float(t["reward"]) for t in tr], x_label="final reward", bins=16)
        lens = svg.histogram(
            "length-hist", [float(t["tokens"]) for t in tr], x_label="tokens per trajectory", bins=20
        )
        body += '<div class="row">' + self.chart(
            "chart-reward-hist", "Reward distribution (trained samples)", rew, "no rewards"
        )
        body += (
            self.chart("chart-length-hist", "Length distribution (trained samples)", lens, "no lengths")
            + "</div>"
        )
        self.add(
            "latency",
            "Trajectory lifecycle and data distributions",
            body,
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
                    _num(ver),
                    _num(step),
                    _pct(e.get("success_rate")),
                    _num(e.get("mean_reward")),
                    _pct(e.get("tool_success_rate")),
                    _num(e.get("avg_steps")),
                    _num(e.get("distinct_2")),
                    _num(e.get("episodes")),
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
        body = _table(cols, rows) if rows else '<p class="empty">no evaluations recorded</p>'
        self.add(
            "evaluation",
            "Held-out evaluation",
            body,
            f"Held-out split, every {d.cfg.telemetry.eval_every} published versions (0: start and end only); latency and faults off.",
        )

    # 8. alerts
    def alerts(self) -> None:
        d = self.d
        events = []
        rows = []
        for a in d.alerts:
            t = _when(a.get("time"), d.t0)
            kind = str(a.get("kind", "alert"))
            tip = f"{kind} [{a.get('bucket', '')}] {a.get('evidence', '')} → {a.get('action', '')}"
            if t is not None:
                events.append((t, kind, tip))
            rows.append(
                (
                    _num(t) if t is not None else str(a.get("time")),
                    kind,
                    _s(a.get("bucket")),
                    _s(a.get("evidence")),
                    _s(a.get("action")),
                )
            )
        for e in d.events:  # role restarts, weight fallbacks, ... belong on the same timeline
            t = _when(e.get("time"), d.t0)
            if t is not None:
                events.append((t, f"event: {e['event']}", f"{e['event']} ({e.get('role', '')})"))
        end = max((float(r["time"]) - d.t0 for r in d.rows), default=None)
        chart = svg.timeline("alerts", events, x_label="seconds since start", x_max=end)
        body = self.chart("chart-alerts", "Alerts and role events", chart, "no alerts or events recorded")
        if rows:
            body += _table(["t (s)", "kind", "bucket", "evidence", "action"], rows)
        elif not (d.dir / "alerts.jsonl").is_file():
            body += '<p class="empty">no alerts.jsonl in this run</p>'
        body += self._env_faults()
        self.add("alerts", "Alerts", body)

    def _env_faults(self) -> str:
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
                _pct(f["fault_rate"]),
                f["faults"],
                f["retries"],
                f["timeouts"],
                f["exceptions"],
                f["malformed"],
            )
            for env, f in faults.items()
        ]
        notes = "".join(f"<p class='intro'>{escape(n)}</p>" for n in self.d.summary.get("notes") or [])
        return ("<h3>Environment faults</h3>" + _table(cols, rows) + notes) if rows else ""

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
        body = '<div class="row">' + self.chart(
            "chart-cost",
            f"Cost by component — total ${float(c.get('total_usd', 0)):.6f}",
            a,
            "no cost components",
        )
        body += (
            self.chart(
                "chart-waste",
                f"Waste — {_pct(c.get('waste_total_share'))} of the total",
                w,
                "no waste recorded",
            )
            + "</div>"
        )
        rows = [(k, f"{float(v):.6g}") for k, v in (c.get("efficiency") or {}).items()]
        body += _table(["efficiency", "value"], rows)
        self.add(
            "cost",
            "Cost and waste",
            body,
            f"Device {escape(self.d.cfg.cost.device)}; see docs/cost.md for the accounting model.",
        )

    # 10. credit
    def credit(self) -> None:
        try:
            mod = importlib.import_module("asyncrl.credit.inspect")
        except ImportError:
            return
        fn = getattr(mod, "credit_fragment", None)
        if fn is None:
            return
        try:
            fragment = str(fn(self.d.dir, n=5))
        except Exception as exc:  # shown, not hidden: the rest of the report is still useful
            fragment = (
                f'<p class="empty">credit view failed: {escape(type(exc).__name__)}: {escape(str(exc))}</p>'
            )
        self.add("credit", "Credit view of sample trajectories", f'<div class="credit">{fragment}</div>')

    def build(self) -> str:
        for part in (
            self.headline,
            self.learning,
            self.freshness,
            self.queue,
            self.utilisation,
            self.latency,
            self.evaluation,
            self.alerts,
            self.cost,
            self.credit,
        ):
            part()
        nav = " · ".join(f'<a href="#{sid}">{escape(t)}</a>' for sid, t, _ in self.sections)
        body = "".join(
            f'<section id="{sid}"><h2>{escape(t)}</h2>{html}</section>' for sid, t, html in self.sections
        )
        title = f"asyncrl run report — {self.d.dir.name}"
        made = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        return (
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(title)}</title>"
            f"<style>{CSS}</style><script>{HEAD_JS}</script></head>"
            f"<body data-charts-expected='{self.n_charts}'><header><h1>{escape(title)}</h1>"
            f"<p class='meta'>written {made} by asyncrl report · {self.n_charts} charts</p><nav>{nav}</nav></header>"
            f"<main>{body}</main><script>{CHECK_JS}</script></body></html>"
        )


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the run's report (default ``RUN/report.html``) and return its path."""
    html = Report(RunData(run_dir)).build()
    path = out or run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path


# ---- helpers ------------------------------------------------------------------------------------
def _q(sorted_vals: list[float], q: float) -> float:
    return (
        sorted_vals[min(len(sorted_vals) - 1, int(q * (len(sorted_vals) - 1) + 0.5))] if sorted_vals else 0.0
    )


def _pct(v: Any) -> str:
    return f"{float(v):.1%}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _num(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _s(v: Any) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _git(rec: dict[str, Any]) -> str:
    g = rec.get("git") or {}
    if not g:
        return "-"
    return str(g.get("commit", ""))[:10] + (" (dirty)" if g.get("dirty") else "")


def _when(t: Any, t0: float) -> float | None:
    if isinstance(t, (int, float)):
        return float(t) - t0
    if isinstance(t, str):
        try:
            return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() - t0
        except ValueError:
            return None
    return None


def _table(cols: list[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols) if any(cols) else ""
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in r) + "</tr>" for r in rows)
    return (
        f'<table class="{cls}">'
        + (f"<thead><tr>{head}</tr></thead>" if head else "")
        + f"<tbody>{body}</tbody></table>"
    )


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#111827;background:#f9fafb}
header{background:#111827;color:#f9fafb;padding:16px 24px}header h1{margin:0;font-size:20px}
header .meta{margin:4px 0 8px;color:#9ca3af;font-size:13px}nav a{color:#93c5fd;font-size:13px;text-decoration:none}
main{padding:8px 24px 40px;max-width:1360px}section{margin:20px 0;padding:12px 16px;background:#fff;border:1px solid #e5e7eb;border-radius:8px}
h2{font-size:17px;margin:4px 0 10px}.intro{color:#4b5563;font-size:13px;margin:0 0 8px}
.row{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;flex:1 1 600px;max-width:660px}
figcaption{font-size:13px;font-weight:600;margin-bottom:2px}svg{width:100%;height:auto;font-size:11px}
.plot{fill:#fff;stroke:#d1d5db}.grid{stroke:#eef0f3}.axis{stroke:#9ca3af}.tick{fill:#6b7280;font-size:10px}
.label{fill:#374151;font-size:11px}.legend{fill:#374151;font-size:11px}.band{fill:#fde68a;opacity:.45}
.hline{stroke:#6b7280;stroke-dasharray:3 3}.hlabel{fill:#6b7280;font-size:10px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}table.facts td{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:8px}.card{background:#f3f4f6;border-radius:6px;padding:6px 10px;min-width:130px}
.card .k{font-size:11px;color:#6b7280}.card .v{font-size:15px;font-weight:600}.empty{color:#9ca3af;font-style:italic;font-size:13px}
"""

HEAD_JS = """
window.__asyncrlErrors=[];
window.addEventListener('error',function(e){window.__asyncrlErrors.push(String(e.message||e));if(document.body){document.body.setAttribute('data-js-errors',String(window.__asyncrlErrors.length));}});
(function(){var ce=console.error;console.error=function(){window.__asyncrlErrors.push(Array.prototype.join.call(arguments,' '));ce.apply(console,arguments);};})();
"""

CHECK_JS = """
(function(){
  var figs=document.querySelectorAll('figure.chart'),ok=0,empty=[];
  figs.forEach(function(f){
    var marks=f.querySelectorAll('svg .data'),seen=false;
    marks.forEach(function(m){var b=m.getBBox();if(b.width>0||b.height>0){seen=true;}});
    f.setAttribute('data-rendered',seen?'1':'0');
    if(seen){ok++;}else{empty.push(f.id);}
  });
  var b=document.body;
  b.setAttribute('data-charts-total',String(figs.length));
  b.setAttribute('data-charts-rendered',String(ok));
  b.setAttribute('data-charts-empty',empty.join(','));
  b.setAttribute('data-js-errors',String(window.__asyncrlErrors.length));
  b.setAttribute('data-js-error-messages',window.__asyncrlErrors.join(' | '));
  b.setAttribute('data-report-checked','1');
})();
"""
