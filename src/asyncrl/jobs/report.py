"""``asyncrl report RUN``: one self-contained HTML file about a run (no external scripts, styles or fonts).

Each section (docs/observe.md lists them; shown when its data exists) is a function of the loaded run
(:class:`RunData`) returning blocks of :mod:`asyncrl.telemetry.report_blocks`; the ones drawn from the
roles' metric rows are :mod:`asyncrl.telemetry.report_metrics`, since only telemetry reads metric rows by
name. The markup is the Jinja2 template ``telemetry/templates/report.html.j2`` (autoescaped), whose
inline script checks on load that every chart holds at least one visible data mark and records the
result on ``<body>`` (``data-charts-total``, ``data-charts-rendered``, ``data-js-errors``), so a
headless browser's DOM dump proves the page rendered.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.telemetry import svg
from asyncrl.telemetry.lifecycle import quantile
from asyncrl.telemetry.report_blocks import (
    Block,
    Cards,
    Figure,
    Fragment,
    Heading,
    Note,
    Row,
    Section,
    Table,
    git,
    num,
    pct,
    render_page,
    text_of,
    when,
)
from asyncrl.telemetry.report_envs import env_blocks
from asyncrl.telemetry.report_metrics import (
    RunData,
    constant_reply_note,
    freshness,
    learning,
    queue,
    step_wall,
    utilisation,
)
from asyncrl.telemetry.report_signal import signal_blocks, signal_series
from asyncrl.telemetry.reports import decode_rows
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
EVAL_COLUMNS = {
    "success": ("success_rate", pct),
    "mean reward": ("mean_reward", num),
    "tool success": ("tool_success_rate", pct),
    "avg steps": ("avg_steps", num),
    "distinct-2": ("distinct_2", num),
    "same reply": ("top_reply_share", pct),
    "episodes": ("episodes", num),
}
"""Held-out evaluation table: column → (evaluation field, formatter)."""
FAULT_KEYS = ("calls", "fault_rate", "faults", "retries", "timeouts", "exceptions", "malformed")


# ---- sections -----------------------------------------------------------------------------------
def headline(d: RunData) -> Section:
    s, rec = d.summary, d.record
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
    return Section("overview", "Overview", [Cards(head), Table(["", ""], facts, cls="facts")])


def latency(d: RunData) -> Section:
    tr = d.traces
    if not tr:
        note = Note("no lifecycle traces (telemetry.traces off, or nothing trained)")
        return Section("latency", "Trajectory lifecycle", [note])
    stages = {label: sorted(float(t[k]) for t in tr) for k, label in STAGE_LABELS.items()}
    means = [sum(float(t[k]) for t in tr) / len(tr) for k in STAGE_LABELS]
    bars = svg.bar_chart(
        "latency-bars", list(stages), means, y_label="mean seconds", x_label="stage", fmt="{:.3f} s"
    )
    e2e = svg.histogram(
        "e2e-hist", [float(t["end_to_end_s"]) for t in tr], x_label="seconds from creation to training"
    )
    rows = [
        (label, *(f"{v:.3f}" for v in (mean, quantile(vals, 0.5), quantile(vals, 0.9), vals[-1])))
        for (label, vals), mean in zip(stages.items(), means, strict=True)
    ]
    rew = svg.histogram("reward-hist", [float(t["reward"]) for t in tr], x_label="final reward", bins=16)
    lens = svg.histogram(
        "length-hist", [float(t["tokens"]) for t in tr], x_label="tokens per trajectory", bins=20
    )
    blocks: list[Block] = [
        Row(
            Figure("chart-latency", "Mean time per lifecycle stage", bars, "no stage timings"),
            Figure("chart-e2e", "End-to-end latency (created → trained)", e2e, "no timings"),
        ),
        Table(["stage", "mean s", "p50 s", "p90 s", "max s"], rows),
        Row(
            Figure("chart-reward-hist", "Reward distribution (trained samples)", rew, "no rewards"),
            Figure("chart-length-hist", "Length distribution (trained samples)", lens, "no lengths"),
        ),
    ]
    intro = f"{len(tr)} trained trajectories traced."
    return Section("latency", "Trajectory lifecycle and data distributions", blocks, intro)


def evaluation(d: RunData) -> Section:
    pts: list[tuple[str, Any, Any, dict[str, Any]]] = (
        [("initial (warm start)", 0, 0, d.initial)] if d.initial else []
    )
    pts += [(f"periodic #{i + 1}", e.get("version"), e.get("step"), e) for i, e in enumerate(d.evals)]
    if d.final:
        pts.append(("final", d.summary.get("last_version"), d.summary.get("trainer_steps"), d.final))
    rows = [
        (name, num(ver), num(step), *(f(e.get(k)) for k, f in EVAL_COLUMNS.values()))
        for name, ver, step, e in pts
    ]
    cols = ["evaluation", "version", "step", *EVAL_COLUMNS]
    body = Table(cols, rows) if rows else Note("no evaluations recorded")
    done = [(float(v), e) for _, v, _, e in pts if v is not None and "success_rate" in e]
    xs, ys = [v for v, _ in done], [float(e["success_rate"]) for _, e in done]
    heldout = Series("held-out success", xs, ys, color="#dc2626", points=True)
    chart = svg.line_chart("heldout", [heldout], "weight version", "success rate", share=True)
    title = "Held-out success over weight versions"
    figure = Figure("chart-heldout", title, chart, "no evaluations recorded")
    note = constant_reply_note(d.initial or {}, d.final) if d.final else None
    return Section(
        "evaluation",
        "Held-out evaluation",
        [figure, body, *([Note(note, cls="intro")] if note else [])],
        f"Held-out split, every {d.cfg.telemetry.eval_every} published versions (0: start and end only); latency and faults off.",
    )


def alerts(d: RunData) -> Section:
    events, rows = [], []
    for a in d.alerts:
        t = when(a.get("time"), d.t0)
        kind = str(a.get("kind", "alert"))
        tip = f"{kind} [{a.get('bucket', '')}] {a.get('evidence', '')} → {a.get('action', '')}"
        if t is not None:
            events.append((t, kind, tip))
        cells = (text_of(a.get(k)) for k in ("bucket", "evidence", "action"))
        rows.append((num(t) if t is not None else str(a.get("time")), kind, *cells))
    for e in d.events:  # role restarts, weight fallbacks, ... belong on the same timeline
        t = when(e.get("time"), d.t0)
        if t is not None:
            events.append((t, f"event: {e['event']}", f"{e['event']} ({e.get('role', '')})"))
    end = max((float(r["time"]) - d.t0 for r in d.rows), default=None)
    chart = svg.timeline("alerts", events, x_label="seconds since start", x_max=end)
    figure = Figure("chart-alerts", "Alerts and role events", chart, "no alerts or events recorded")
    body: list[Block] = [figure]
    if rows:
        body.append(Table(["t (s)", "kind", "bucket", "evidence", "action"], rows))
    elif not (d.dir / "alerts.jsonl").is_file():
        body.append(Note("no alerts.jsonl in this run"))
    return Section("alerts", "Alerts", body + _env_faults(d.summary))


def _env_faults(summary: dict[str, Any]) -> list[Block]:
    """Fault, retry and timeout counts per environment (``summary.json``'s ``env_faults``), and with
    ``env.kind: mix`` each environment's own row (:mod:`asyncrl.telemetry.report_envs`)."""
    faults = summary.get("env_faults") or {}
    if not faults:
        return []
    rows = [
        (env, *(pct(f[k]) if k == "fault_rate" else f[k] for k in FAULT_KEYS)) for env, f in faults.items()
    ]
    notes: list[Block] = [Note(str(f["note"]), cls="intro") for f in faults.values() if f.get("note")]
    cols = ["environment", *(k.replace("_", " ") for k in FAULT_KEYS)]
    return [Heading("Environment faults"), Table(cols, rows), *notes, *env_blocks(summary)]


def signal(d: RunData) -> Section:
    series = signal_series(decode_rows(d.events), d.cfg.signal_window())
    alerts = sum(a.get("kind") == "no_signal" for a in d.alerts)
    blocks = signal_blocks(series, d.t0, d.cost, alerts, d.cfg.orchestrator.signal.no_signal_share)
    return Section(
        "signal",
        "Learning signal",
        blocks,
        f"Training groups per bucket in windows of {d.cfg.signal_window()} groups: the share whose rewards "
        "differ (only those carry a GRPO gradient) and the success of their episodes; "
        "a no_signal alert fires when the share stays under the line (orchestrator.signal).",
    )


def cost(d: RunData) -> Section | None:
    c = d.cost
    if not c:
        return None

    def usd_bars(chart_id: str, usd: dict[str, float], x_label: str, color: str = svg.PALETTE[0]) -> str:
        values = [float(v) for v in usd.values()]
        return svg.bar_chart(
            chart_id, list(usd), values, y_label="USD", x_label=x_label, fmt="${:.6f}", color=color
        )

    a = usd_bars("cost-components", c.get("components_usd") or {}, "component")
    w = usd_bars("cost-waste", c.get("waste_usd") or {}, "cause", "#dc2626")
    total = f"Cost by component — total ${float(c.get('total_usd', 0)):.6f}"
    waste = f"Waste — {pct(c.get('waste_total_share'))} of the total"
    charts = Row(
        Figure("chart-cost", total, a, "no cost components"),
        Figure("chart-waste", waste, w, "no waste recorded"),
    )
    rows = [(k, f"{float(v):.6g}") for k, v in (c.get("efficiency") or {}).items()]
    intro = f"Device {d.cfg.cost.device}; see docs/cost.md for the accounting model."
    return Section("cost", "Cost and waste", [charts, Table(["efficiency", "value"], rows)], intro)


def credit(d: RunData, credit_view: CreditView) -> Section:
    try:
        block: Block = Fragment(str(credit_view(d.dir, 5)), cls="credit")
    except Exception as exc:  # shown, not hidden: the rest of the report is still useful
        block = Note(f"credit view failed: {type(exc).__name__}: {exc}")
    return Section("credit", "Credit view of sample trajectories", [block])


SECTIONS: tuple[Callable[[RunData], Section | None], ...] = (
    headline,
    *(learning, freshness, queue, utilisation, step_wall),  # drawn from the metric rows
    *(latency, evaluation, alerts, signal, cost),
)


def write_report(run_dir: Path, out: Path | None = None, *, credit_view: CreditView | None = None) -> Path:
    """Write the run's report (default ``RUN/report.html``) and return its path. ``credit_view`` makes the
    credit section (the CLI passes :func:`asyncrl.jobs.credit_inspect.credit_fragment`)."""
    d = RunData(run_dir)
    sections = [s for part in SECTIONS if (s := part(d)) is not None]
    if credit_view is not None:
        sections.append(credit(d, credit_view))
    path = out or run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(f"asyncrl run report — {d.dir.name}", sections), encoding="utf-8")
    return path
