"""``asyncrl runs list`` and ``asyncrl runs compare``: the experiment records of finished runs side by side.

Reads what a run left in its directory (``run.json``, written by :mod:`asyncrl.telemetry.experiment`;
``summary.json``; ``evals.jsonl``; ``config.yaml``); writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.errors import UserError
from asyncrl.telemetry.jsonl import read_json, read_jsonl


def run_info(run_dir: Path) -> dict[str, Any]:
    """What ``runs list`` / ``runs compare`` show of one run directory."""
    rec, summary = read_json(run_dir / "run.json"), read_json(run_dir / "summary.json")
    evals = read_jsonl(run_dir / "evals.jsonl")
    status = rec.get("status") or ("finished" if summary else "incomplete")
    return {
        "run": run_dir.name,
        "path": str(run_dir),
        "created": rec.get("created_utc", ""),
        "status": status,
        "config_hash": rec.get("config_hash", ""),
        "commit": ((rec.get("git") or {}).get("commit") or "")[:10],
        "summary": summary,
        "best_periodic_eval": max((float(e["success_rate"]) for e in evals), default=None),
        "periodic_evals": len(evals),
    }


def list_runs(root: Path) -> list[dict[str, Any]]:
    if not root.is_dir():
        raise UserError(
            f"--root {str(root)!r}: no such folder (runs are written under run_root, default 'runs')"
        )
    dirs = sorted(p for p in root.iterdir() if (p / "config.yaml").is_file())
    return [run_info(p) for p in dirs]


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


KEY_METRICS = (
    "initial_success",
    "final_success",
    "samples_trained",
    "trainer_steps",
    "staleness_mean",
    "staleness_max",
    "samples_dropped_stale",
    "lost_trajectories",
    "trainer_busy_fraction",
    "wall_seconds",
    "cost_usd",
    "cost_waste_share",
)


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """Key metrics side by side, and every config field that differs."""
    import yaml

    for p in (a, b):
        if not (p / "config.yaml").is_file():
            raise UserError(f"{str(p)!r}: not a run directory (no config.yaml)")
    ia, ib = run_info(a), run_info(b)
    metrics = [(k, ia["summary"].get(k), ib["summary"].get(k)) for k in KEY_METRICS]
    metrics.append(("best_periodic_eval", ia["best_periodic_eval"], ib["best_periodic_eval"]))
    ca = _flatten(yaml.safe_load((a / "config.yaml").read_text()) or {})
    cb = _flatten(yaml.safe_load((b / "config.yaml").read_text()) or {})
    diff = [(k, ca.get(k), cb.get(k)) for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    ra, rb = read_json(a / "run.json"), read_json(b / "run.json")
    record = [
        (k, ra.get(k), rb.get(k)) for k in ("config_hash", "asyncrl_version", "git") if ra.get(k) != rb.get(k)
    ]
    return {"a": ia, "b": ib, "metrics": metrics, "config_diff": diff, "record_diff": record}


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_list(runs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{len(runs)} runs")
    left = ("run", "created (UTC)", "status", "mode")
    for col in (*left, "steps", "success before → after", "best eval", "wall s", "cost $"):
        t.add_column(col, justify="left" if col in left else "right")
    t.add_column("commit")
    for r in runs:
        s = r["summary"]
        t.add_row(
            r["run"],
            r["created"],
            r["status"],
            _fmt(s.get("mode")),
            _fmt(s.get("trainer_steps")),
            f"{s['initial_success']:.1%} → {s['final_success']:.1%}" if "final_success" in s else "-",
            f"{r['best_periodic_eval']:.1%}" if r["best_periodic_eval"] is not None else "-",
            f"{s['wall_seconds']:.0f}" if "wall_seconds" in s else "-",
            f"{s['cost_usd']:.4f}" if s.get("cost_usd") is not None else "-",
            r["commit"] or "-",
        )
    Console(width=max(140, Console().width)).print(t)


def render_compare(c: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    m = Table(title="key metrics")
    for col in ("metric", c["a"]["run"], c["b"]["run"], "B - A"):
        m.add_column(col, justify="left" if col == "metric" else "right")
    for k, va, vb in c["metrics"]:
        num = isinstance(va, (int, float)) and isinstance(vb, (int, float))
        m.add_row(k, _fmt(va), _fmt(vb), _fmt(vb - va) if num else "")
    console.print(m)
    d = Table(title=f"config differences ({len(c['config_diff'])})")
    for col in ("field", c["a"]["run"], c["b"]["run"]):
        d.add_column(col)
    for k, va, vb in c["config_diff"]:
        d.add_row(k, _fmt(va), _fmt(vb))
    for k, va, vb in c["record_diff"]:
        d.add_row(f"(run.json) {k}", _fmt(va), _fmt(vb))
    console.print(d)
