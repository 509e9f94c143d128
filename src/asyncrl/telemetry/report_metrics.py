"""The run report's sections drawn from the roles' metric rows: a run directory loaded (:class:`RunData`),
success and reward, data freshness next to the loss, queue depth, role utilisation and wall time per step.

Reading metric rows by name is telemetry's part (docs/architecture.md#floors): the report itself
(:mod:`asyncrl.jobs.report`) composes these sections with the ones drawn from the run's other files.
Each function returns one :class:`Section`; ``figure`` makes a chart's block and counts it.
"""

from __future__ import annotations

from dataclasses import asdict, astuple
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.errors import UserError
from asyncrl.telemetry import svg
from asyncrl.telemetry.jsonl import read_json, read_jsonl, read_jsonl_dir
from asyncrl.telemetry.report_blocks import Figure, Note, Row, Section, Table
from asyncrl.telemetry.svg import Band, HLine, Series
from asyncrl.telemetry.walltime import step_walls


class RunData:
    def __init__(self, run_dir: Path) -> None:
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"{str(run_dir)!r}: not a run directory (no config.yaml)")

        self.dir = run_dir
        self.cfg = load_config(run_dir / "config.yaml")
        rows = sorted(read_jsonl_dir(run_dir / "metrics"), key=lambda r: float(r.get("time") or 0.0))
        self.events = [r for r in rows if "event" in r]
        self.rows = [r for r in rows if "event" not in r]
        self.trainer = [r for r in self.rows if r.get("role") == "trainer"]
        self.orch = [r for r in self.rows if r.get("role") == "orchestrator"]
        self.record = read_json(run_dir / "run.json")
        self.summary = read_json(run_dir / "summary.json")
        self.initial = read_json(run_dir / "initial_eval.json")
        self.final = read_json(run_dir / "final_eval.json")
        self.evals = read_jsonl(run_dir / "evals.jsonl")
        self.traces = read_jsonl(run_dir / "traces" / "trained.jsonl")
        self.alerts = read_jsonl(run_dir / "alerts.jsonl")
        self.cost = read_json(run_dir / "cost.json")
        starts = [float(r["time"]) - float(r.get("alive_s") or 0.0) for r in self.rows if "time" in r]
        self.t0 = min(starts, default=float(self.record.get("created") or 0.0))

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float | None]]:
        """The trainer's figure ``key`` over its ``step`` (or ``time``: seconds since the start); a value
        that is not a number is a gap."""
        raw = [
            (float(r["time"]) - self.t0 if x == "time" else r.get(x), r[key])
            for r in self.trainer
            if key in r
        ]
        pts = [(float(a), float(v) if isinstance(v, (int, float)) else None) for a, v in raw if a is not None]
        return [a for a, _ in pts], [v for _, v in pts]


def learning(d: RunData) -> Section:
    success = svg.line_chart(
        "success",
        [
            Series("train batch", *d.series("reward/success_rate"), color="#93c5fd"),
            Series("moving average", *d.series("reward/success_rate_ma"), color="#2563eb"),
            Series("held-out eval", *_eval_points(d, "success_rate"), color="#dc2626", points=True),
        ],
        "trainer step",
        "success rate",
        share=True,
    )
    reward = svg.line_chart(
        "reward",
        [
            Series("batch mean", *d.series("reward/mean")),
            Series("held-out eval", *_eval_points(d, "mean_reward"), points=True, color="#dc2626"),
        ],
        "trainer step",
        "reward",
    )
    row = Row(
        Figure("chart-success", "Success rate", success, "no trained batches yet"),
        Figure("chart-reward", "Reward", reward, "no trained batches yet"),
    )
    return Section(
        "learning",
        "Success and reward",
        [row],
        "Per trained batch (training reward) and on the held-out split (evaluation, independent of training reward).",
    )


def _eval_points(d: RunData, key: str) -> tuple[list[float], list[float | None]]:
    pts: list[tuple[float, float]] = []
    if key in d.initial:
        pts.append((0.0, float(d.initial[key])))
    pts += [(float(e.get("step", 0)), float(e[key])) for e in d.evals if key in e]
    if key in d.final and d.summary.get("trainer_steps") is not None:
        pts.append((float(d.summary["trainer_steps"]), float(d.final[key])))
    return [p[0] for p in pts], [p[1] for p in pts]


def freshness(d: RunData) -> Section:
    limit = d.cfg.staleness_policy().max_staleness  # rule 5: the mode fixes it
    fresh = svg.line_chart(
        "freshness",
        [
            Series("mean version lag", *d.series("staleness/mean")),
            Series("max version lag", *d.series("staleness/max"), dashed=True, color="#ea580c"),
        ],
        "trainer step",
        "versions",
        y_min=0.0,
        hlines=[HLine(float(limit), f"max_staleness {limit}")],
    )
    loss_line = Series("policy loss", *d.series("loss/policy"), color="#9333ea")
    loss = svg.line_chart("loss", [loss_line], "trainer step", "loss")
    kl_line = Series("KL(behaviour ‖ current), k3", *d.series("kl/behaviour_k3"), color="#0891b2")
    kl = svg.line_chart("kl", [kl_line], "trainer step", "KL")
    first = Row(
        Figure(
            "chart-freshness",
            "Data freshness: version lag of each trained batch",
            fresh,
            "no trained batches yet",
        ),
        Figure("chart-loss", "Policy loss", loss, "no loss recorded"),
    )
    ages = [float(t["age"]) for t in d.traces] or [
        float(k) for k, n in (d.summary.get("staleness_hist") or {}).items() for _ in range(int(n))
    ]
    hist = svg.histogram("staleness-hist", ages, x_label="age in versions at training", integer=True)
    second = Row(
        Figure("chart-kl", "Policy drift: KL between behaviour and current policy", kl, "no KL recorded"),
        Figure("chart-staleness-hist", "Staleness histogram (trained samples)", hist, "no trained samples"),
    )
    return Section(
        "freshness",
        "Data freshness, loss and drift",
        [first, second],
        "The version lag of each trained batch (how old its data was) next to the loss it produced.",
    )


def queue(d: RunData) -> Section:
    cap = d.cfg.transport.capacity
    leased = d.series("queue/leased", x="time")
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
        [
            Series("ready", *d.series("queue/ready", x="time")),
            Series("leased by trainer", *leased, dashed=True, color="#16a34a"),
        ],
        "seconds since start",
        "entries",
        y_min=0.0,
        bands=bands,
        hlines=[
            HLine(oc.high_watermark * cap, "high watermark"),
            HLine(oc.low_watermark * cap, "low watermark"),
        ],
    )
    paused = sum(b.x1 - b.x0 for b in bands)
    return Section(
        "queue",
        "Queue depth",
        [Figure("chart-queue", "Queue depth and watermark state", chart, "no queue figures recorded")],
        f"Capacity {cap}; shaded: admission paused ({paused:.0f} s in all).",
    )


def utilisation(d: RunData) -> Section:
    per: dict[str, list[tuple[float, float]]] = {}
    prev: dict[tuple[str, int], tuple[float, float]] = {}
    times = [float(r["time"]) for r in d.rows]
    window = max(2.0, (max(times) - min(times)) / 120) if times else 2.0  # ~120 points per role
    for r in d.rows:
        role = str(r.get("role", ""))
        key = "trainer/busy_seconds" if role == "trainer" else "rollout/gen_busy_seconds"
        if not role.startswith(("trainer", "rollout")) or r.get(key) is None:
            continue
        ident = (role, int(r.get("pid") or 0))
        t, b = float(r["time"]), float(r[key])
        pt, pb = prev.setdefault(ident, (t, b))
        if t - pt >= window:  # a rate over at least one window since the process's previous point
            per.setdefault(role, []).append((t - d.t0, max(0.0, min(1.0, (b - pb) / (t - pt)))))
            prev[ident] = (t, b)
    series = [Series(role, [p[0] for p in pts], [p[1] for p in pts]) for role, pts in sorted(per.items())]
    chart = svg.line_chart("utilisation", series, "seconds since start", "busy fraction", share=True)
    title = "Busy fraction per role (trainer: training steps; rollout: generation)"
    figure = Figure("chart-utilisation", title, chart, "not enough rows for rates")
    return Section("utilisation", "Role utilisation", [figure])


def step_wall(d: RunData) -> Section:
    """Where each step's wall time went (:func:`asyncrl.telemetry.walltime.step_walls`)."""
    walls = step_walls(d.rows)
    if not walls:
        return Section("step-wall", "Wall time per step", [Note("no trainer steps recorded")])
    xs = [float(w.step) for w in walls]
    values = [asdict(w) for w in walls]
    parts = [
        ("step wall", "wall", "#111827"),
        ("train", "train", "#2563eb"),
        ("publish", "publish", "#7c3aed"),
        ("trainer idle", "idle", "#9ca3af"),
        ("rollout generating", "generate", "#16a34a"),
        ("prefill", "prefill", "#f59e0b"),
        ("decode", "decode", "#dc2626"),
    ]
    series = [Series(label, xs, [float(v[f]) for v in values], color=c, points=True) for label, f, c in parts]
    chart = svg.line_chart("step-wall", series, "trainer step", "seconds", y_min=0.0)
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
    seconds = [astuple(w)[1:] for w in walls]  # the fields after ``step``, in the columns' order
    rows = [[str(w.step), *(f"{v:.1f}" for v in s)] for w, s in zip(walls, seconds, strict=True)]
    rows.append(["all", *(f"{sum(col):.1f}" for col in zip(*seconds, strict=True))])
    return Section(
        "step-wall",
        "Wall time per step",
        [
            Figure("chart-step-wall", "Seconds per training step, by role and phase", chart, "no steps"),
            Table(cols, rows),
        ],
        "Each step's interval (trainer row to trainer row): the trainer's learning, publishing, other work "
        "and idle time; the rollout workers' generation (prefill + decode, summed over workers), which "
        "overlaps training in async mode; thread-seconds lent between roles (core lending).",
    )


CONSTANT_REPLY_SHARE = 0.8
"""A final evaluation where this share of held-out episodes end with one same reply is flagged: a policy
that learned the tasks answers them differently unless most of them share one answer."""


def constant_reply_note(prior: dict[str, Any], final: dict[str, Any]) -> str | None:
    """The summary's note when the policy after RL gives one reply to most held-out tasks (its success is
    then that reply's base rate, not learning: docs/when-a-run-does-not-learn.md); ``None`` otherwise."""
    share, before = final.get("top_reply_share"), prior.get("top_reply_share")
    if share is None or share < CONSTANT_REPLY_SHARE:
        return None
    was = "" if before is None else f" (before RL: {before:.0%})"
    return (
        f"{share:.0%} of held-out episodes end with the same reply after RL{was}: held-out success "
        f"{final['success_rate']:.1%} may be how often that one answer is right, not learning "
        "(docs/when-a-run-does-not-learn.md#one-answer-for-every-task)"
    )
