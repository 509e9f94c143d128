"""``asyncrl cost report RUN``: actual cost by component, waste, efficiency, and estimate vs actual."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import RunConfig, load_config
from asyncrl.cost.estimate import estimate, measured_assumptions
from asyncrl.errors import UserError

if TYPE_CHECKING:
    from rich.table import Table

EARLY_FRACTION = 0.1


def cost_report(run_dir: Path) -> dict[str, Any]:
    """The run's cost figures plus an estimate made from its first 10% (the estimator's accuracy check).

    The estimate is unavailable (``available: false`` with the ``reason``, no error figure) when the
    first 10% of the run measured no generated trajectory: a short run whose roles first report
    after the cut would otherwise be "estimated" at about $0, an error of -100%.
    """
    path = run_dir / "cost.json"
    if not path.is_file():
        raise UserError(f"{run_dir}: no cost.json (the run did not finish, or cost.enabled was false)")
    cfg: RunConfig = load_config(run_dir / "config.yaml")
    actual = json.loads(path.read_text())
    return {**actual, "estimate_from_first_10pct": _early_estimate(run_dir, cfg, actual)}


def _early_estimate(run_dir: Path, cfg: RunConfig, actual: dict[str, Any]) -> dict[str, Any]:
    usage = actual["usage"]
    try:
        early = measured_assumptions(run_dir, EARLY_FRACTION)
    except ValueError:
        early = None
    if early is None or early.trajectories <= 0:
        reason = (
            f"no trajectory was generated in the first {EARLY_FRACTION:.0%} of the run (too short to measure)"
        )
        return {
            "available": False,
            "reason": reason,
            "components_usd": {},
            "total_usd": None,
            "relative_error": None,
        }
    early.trajectories = usage["samples_generated"]  # the plan: the same number of trajectories
    early.wall_seconds = usage["wall_seconds"]
    early.stored_bytes = usage["stored_bytes"]
    predicted = estimate(early, cfg.cost)
    total_pred = sum(predicted.values())
    total = actual["total_usd"]
    return {
        "available": True,
        "components_usd": predicted,
        "total_usd": total_pred,
        "relative_error": (total_pred - total) / total if total else 0.0,
    }


def _table(title: str, cols: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> Table:
    """A rich table whose first column names each row and whose other columns (figures) align right."""
    from rich.table import Table

    t = Table(title=title)
    for i, col in enumerate(cols):
        t.add_column(col, justify="right" if i else "left")
    for row in rows:
        t.add_row(*row)
    return t


def render_report(report: dict[str, Any], run_dir: Path) -> None:
    from rich.console import Console

    console = Console()
    total, early = report["total_usd"], report["estimate_from_first_10pct"]
    est = early["components_usd"]
    share = report["components_share"]
    rows = [
        (k, f"{v:.6f}", f"{share[k]:.1%}", f"{est[k]:.6f}" if k in est else "-")
        for k, v in report["components_usd"].items()
    ]
    if "startup_device" in est:
        rows.append(("(start-up, in devices)", "", "", f"{est['startup_device']:.6f}"))
    cols = ("component", "USD", "share", "estimate (first 10%)")
    t = _table(f"cost of {run_dir} — total ${total:.6f}", cols, rows)
    est_total = early["total_usd"]
    t.add_row("total", f"{total:.6f}", "100%", "-" if est_total is None else f"{est_total:.6f}", style="bold")
    console.print(t)
    waste = [(k, f"{v:.6f}", f"{report['waste_share'][k]:.1%}") for k, v in report["waste_usd"].items()]
    title = f"waste — {report['waste_total_share']:.1%} of the total"
    console.print(_table(title, ("cause", "USD", "share of total"), waste))
    e = _table("efficiency", ("figure", "value"), [(k, f"{v:.6g}") for k, v in report["efficiency"].items()])
    rec = report.get("reconciliation", {})
    if rec:
        e.add_row("device-seconds / (wall × devices)", f"{rec['ratio']:.3f}")
    error = early["relative_error"]
    e.add_row(
        "estimate error (first 10%)",
        f"{error:+.1%}" if early.get("available", True) else f"unavailable: {early['reason']}",
    )
    console.print(e)


def render_estimate(components: dict[str, float], assumptions: dict[str, float], device: str) -> None:
    from rich.console import Console

    console = Console()
    rows = [(k, f"{v:,.6g}") for k, v in assumptions.items()] + [("device", device)]
    console.print(_table("assumptions", ("assumption", "value"), rows))
    total = sum(components.values())
    shares = [(k, f"{v:,.6f}", f"{(v / total if total else 0):.1%}") for k, v in components.items()]
    console.print(_table(f"estimated cost — total ${total:,.4f}", ("component", "USD", "share"), shares))
