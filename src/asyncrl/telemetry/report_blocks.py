"""The blocks a report section is made of (:class:`Figure`, :class:`Row`, :class:`Table`, :class:`Cards`,
:class:`Note`, ...), the page they fill (``templates/report.html.j2``) and the small formatters the
sections share: :mod:`asyncrl.jobs.report`, :mod:`asyncrl.telemetry.report_metrics` and
:mod:`asyncrl.telemetry.report_signal` build with them."""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from asyncrl.telemetry.markup import templates


# ---- what the template renders ------------------------------------------------------------------
@dataclass
class Figure:
    """One chart (inline SVG), or the ``empty`` note in its place when there is nothing to draw."""

    kind: ClassVar[str] = "figure"
    id: str
    title: str
    svg: str
    """Markup from :mod:`asyncrl.telemetry.svg` (which escapes its text); empty: no chart."""
    empty: str


class Row:
    """Figures side by side."""

    kind: ClassVar[str] = "row"

    def __init__(self, *figures: Figure) -> None:
        self.figures = list(figures)


@dataclass
class Table:
    """Columns and rows of text (cells are written with ``str``)."""

    kind: ClassVar[str] = "table"
    cols: list[str]
    rows: Sequence[Sequence[object]]
    cls: str = ""

    def __post_init__(self) -> None:
        self.rows = [[str(v) for v in r] for r in self.rows]


@dataclass
class Cards:
    """Headline figures: (label, value) pairs."""

    kind: ClassVar[str] = "cards"
    items: list[tuple[str, str]]


@dataclass
class Note:
    """A paragraph of text: ``empty`` (nothing to show) or ``intro`` (an explanation)."""

    kind: ClassVar[str] = "note"
    text: str
    cls: str = "empty"


@dataclass
class Heading:
    kind: ClassVar[str] = "heading"
    text: str


@dataclass
class Fragment:
    """Ready-made markup from another module (the credit view), inside ``<div class=cls>``."""

    kind: ClassVar[str] = "fragment"
    html: str
    """Inserted as it is (the module escapes its own text)."""
    cls: str


Block = Figure | Row | Table | Cards | Note | Heading | Fragment


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block]
    intro: str = ""


def render_page(title: str, sections: list[Section]) -> str:
    """The report's HTML: ``templates/report.html.j2`` filled with ``sections``; ``n_charts`` (the
    charts the page's check expects to render) counts the figures that hold a chart."""
    figures = [f for s in sections for b in s.blocks for f in (b.figures if isinstance(b, Row) else [b])]
    n_charts = sum(isinstance(f, Figure) and bool(f.svg) for f in figures)
    made = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    template = templates("asyncrl.telemetry").get_template("report.html.j2")
    return template.render(title=title, made=made, n_charts=n_charts, sections=sections)


# ---- formatters ---------------------------------------------------------------------------------
def pct(v: object) -> str:
    return f"{float(v):.1%}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def num(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def text_of(v: object) -> str:
    return "" if v is None else v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def git(rec: dict[str, Any]) -> str:
    g = rec.get("git") or {}
    if not g:
        return "-"
    return str(g.get("commit", ""))[:10] + (" (dirty)" if g.get("dirty") else "")


def when(t: object, t0: float) -> float | None:
    if isinstance(t, (int, float)):
        return float(t) - t0
    if isinstance(t, str):
        try:
            return datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() - t0
        except ValueError:
            return None
    return None
