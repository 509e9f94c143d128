"""Small inline-SVG charts for the run report: line charts, bar charts, histograms and a timeline.

Pure string building, no dependencies. Every data mark carries ``class="data"`` (and a ``<title>``
tooltip); the report's script counts them to prove each chart rendered something.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
W, H = 640, 250
ML, MR, MT, MB = 58, 14, 26, 40
MAX_POINTS = 400


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str = ""
    points: bool = False
    """Draw markers (for sparse series such as evaluations) instead of a line."""
    dashed: bool = False


@dataclass
class Band:
    x0: float
    x1: float
    label: str


@dataclass
class HLine:
    y: float
    label: str


def _fmt(v: float, percent: bool = False) -> str:
    if percent:
        return f"{v:.0%}"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e4 or a < 1e-3:
        return f"{v:.1e}"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


def _downsample(xs: Sequence[float], ys: Sequence[float | None]) -> list[tuple[float, float]]:
    pts = [(float(x), float(y)) for x, y in zip(xs, ys, strict=False) if y is not None and math.isfinite(y)]
    if len(pts) <= MAX_POINTS:
        return pts
    k = math.ceil(len(pts) / MAX_POINTS)
    return pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])


def _frame(chart_id: str, title: str, body: list[str]) -> str:
    """The chart's ``<svg>`` with its accessible ``title`` first, then ``body``."""
    return (
        f'<svg viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-labelledby="{chart_id}-t" '
        f'xmlns="http://www.w3.org/2000/svg"><title id="{chart_id}-t">{escape(title)}</title>'
        + "".join(body)
        + "</svg>"
    )


def _axes(
    body: list[str],
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    labels: tuple[str, str],
    percent: bool = False,
    x_ticks: list[float] | None = None,
) -> tuple[Callable[[float], float], Callable[[float], float]]:
    """Draw the plot area, grid, ticks and the (x, y) ``labels``; return the data → pixel maps."""
    pw, ph = W - ML - MR, H - MT - MB

    def sx(x: float) -> float:
        return ML + (x - x0) / ((x1 - x0) or 1.0) * pw

    def sy(y: float) -> float:
        return MT + ph - (y - y0) / ((y1 - y0) or 1.0) * ph

    body.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" class="plot"/>')
    for t in nice_ticks(y0, y1):
        y = sy(t)
        body.append(
            f'<line x1="{ML}" x2="{ML + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{ML - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t, percent)}</text>'
        )
    for t in x_ticks if x_ticks is not None else nice_ticks(x0, x1, 6):
        x = sx(t)
        body.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT + ph}" y2="{MT + ph + 4}" class="axis"/>'
            f'<text x="{x:.1f}" y="{MT + ph + 16}" class="tick" text-anchor="middle">{_fmt(t)}</text>'
        )
    body.append(
        f'<text x="{ML + pw / 2}" y="{H - 6}" class="label" text-anchor="middle">{escape(labels[0])}</text>'
        f'<text x="14" y="{MT + ph / 2}" class="label" text-anchor="middle" '
        f'transform="rotate(-90 14 {MT + ph / 2})">{escape(labels[1])}</text>'
    )
    return sx, sy


def line_chart(
    chart_id: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    *,
    share: bool = False,
    y_min: float | None = None,
    bands: Sequence[Band] = (),
    hlines: Sequence[HLine] = (),
) -> str:
    """A line chart; ``None`` / non-finite values are gaps. Empty string if there is nothing to draw.
    ``share``: the values are shares (rates, fractions), the y axis from 0 to 100 %."""
    y_max = 1.0 if share else None
    y_min = 0.0 if share else y_min
    data = [(s, p) for s in series if (p := _downsample(s.xs, s.ys))]
    if not data:
        return ""
    xs = [x for _, p in data for x, _ in p]
    ys = [y for _, p in data for _, y in p] + [h.y for h in hlines]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0 = y_min if y_min is not None else min(ys)
    y1 = y_max if y_max is not None else max(ys)
    if y_min is None and y0 > 0 and y0 < 0.5 * y1:
        y0 = 0.0
    if y1 <= y0:
        y1 = y0 + (abs(y0) or 1.0)
    else:
        pad = 0.05 * (y1 - y0)
        y0, y1 = (y0 - pad if y_min is None else y0), (y1 + pad if y_max is None else y1)
    body: list[str] = []
    fx, fy = _axes(body, x0, x1, y0, y1, (x_label, y_label), share)
    for b in bands:
        a, z = fx(max(b.x0, x0)), fx(min(b.x1, x1))
        body.append(
            f'<rect x="{a:.1f}" y="{MT}" width="{max(z - a, 1.5):.1f}" height="{H - MT - MB}" class="band">'
            f"<title>{escape(b.label)}</title></rect>"
        )
    for h in hlines:
        y = fy(h.y)
        body.append(
            f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="hline"/>'
            f'<text x="{W - MR - 4}" y="{y - 4:.1f}" class="hlabel" text-anchor="end">{escape(h.label)}</text>'
        )
    legend_x = ML + 6
    for i, (s, pts) in enumerate(data):
        color = s.color or PALETTE[i % len(PALETTE)]
        name = escape(s.name)
        if s.points or len(pts) == 1:
            body += [
                f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="4" fill="{color}" class="data">'
                f"<title>{name}: {_fmt(y, share)} at {_fmt(x)}</title></circle>"
                for x, y in pts
            ]
        else:
            coords = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            body.append(
                f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8"{dash} class="data">'
                f"<title>{name} (last {_fmt(pts[-1][1], share)})</title></polyline>"
            )
        body.append(
            f'<rect x="{legend_x}" y="8" width="10" height="10" fill="{color}"/>'
            f'<text x="{legend_x + 14}" y="17" class="legend">{name}</text>'
        )
        legend_x += 24 + 7 * len(s.name)
    return _frame(chart_id, f"{y_label} over {x_label}", body)


def bar_chart(
    chart_id: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    y_label: str = "",
    x_label: str = "",
    fmt: str = "{:.3g}",
    color: str = PALETTE[0],
    label_bars: bool = True,
) -> str:
    """Vertical bars, one per label. Empty string if every value is zero or there are none."""
    if not any(values):
        return ""
    y0, y1 = min(min(values), 0.0), max(max(values), 0.0)
    y1 = y1 + 0.08 * ((y1 - y0) or 1.0)
    body: list[str] = []
    n = len(values)
    fx, fy = _axes(body, 0, n, y0, y1, (x_label, y_label), x_ticks=[])
    slot = (W - ML - MR) / n
    for i, (lab, v) in enumerate(zip(labels, values, strict=True)):
        x = fx(i) + slot * 0.12
        top, base = fy(max(v, 0.0)), fy(min(v, 0.0))
        body.append(
            f'<rect x="{x:.1f}" y="{top:.1f}" width="{slot * 0.76:.1f}" height="{max(base - top, 0.8):.1f}" '
            f'fill="{color}" class="data"><title>{escape(lab)}: {escape(fmt.format(v))}</title></rect>'
        )
        if label_bars and n <= 24:
            body.append(
                f'<text x="{x + slot * 0.38:.1f}" y="{H - MB + 14}" class="tick" text-anchor="middle">'
                f"{escape(lab[:14])}</text>"
            )
    return _frame(chart_id, f"{y_label} by {x_label}", body)


def histogram(
    chart_id: str, values: Sequence[float], *, x_label: str, bins: int = 20, integer: bool = False
) -> str:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    if integer:
        edges = list(range(int(lo), int(hi) + 1))
        counts = [float(sum(int(v) == e for v in vals)) for e in edges]
        labels = [str(e) for e in edges]
    else:
        width = (hi - lo) / bins or 1.0
        counts = [0.0] * bins
        for v in vals:
            counts[min(bins - 1, int((v - lo) / width))] += 1
        labels = [f"{_fmt(lo + i * width)}–{_fmt(lo + (i + 1) * width)}" for i in range(bins)]
    svg = bar_chart(
        chart_id, labels, counts, y_label="count", x_label=x_label, fmt="{:.0f}", label_bars=integer
    )
    if not integer and svg:  # bins are too many to label each: label both ends
        svg = svg.replace(
            "</svg>",
            f'<text x="{ML}" y="{H - MB + 14}" class="tick">{_fmt(lo)}</text>'
            f'<text x="{W - MR}" y="{H - MB + 14}" class="tick" text-anchor="end">{_fmt(hi)}</text></svg>',
        )
    return svg


def timeline(
    chart_id: str, events: Sequence[tuple[float, str, str]], *, x_label: str, x_max: float | None = None
) -> str:
    """Markers on lanes: ``(x, lane, tooltip)``; one lane per distinct ``lane`` value."""
    if not events:
        return ""
    lanes = sorted({lane for _, lane, _ in events})
    xs = [x for x, _, _ in events]
    x0, x1 = min(0.0, *xs), max(x_max or 0.0, *xs)
    if x1 <= x0:
        x1 = x0 + 1.0
    body: list[str] = []
    sx, _ = _axes(body, x0, x1, 0, len(lanes), (x_label, ""))
    lane_h = (H - MT - MB) / len(lanes)
    for i, lane in enumerate(lanes):
        y = MT + lane_h * (i + 0.5)
        body.append(
            f'<text x="{ML + 4}" y="{y - 8:.1f}" class="legend">{escape(lane)}</text>'
            f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
    for x, lane, tip in events:
        i = lanes.index(lane)
        body.append(
            f'<circle cx="{sx(x):.1f}" cy="{MT + lane_h * (i + 0.5):.1f}" r="5" '
            f'fill="{PALETTE[i % len(PALETTE)]}" class="data"><title>{escape(tip)}</title></circle>'
        )
    return _frame(chart_id, f"events over {x_label}", body)
