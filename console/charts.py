"""Server-side SVG charts for the console: no JavaScript, no network, readable without colour alone.

Pure code (no Django import): callers pass plain numbers and get an SVG string back, which the
templates mark safe. Every text that reaches the SVG goes through ``escape``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from html import escape

# Colour-blind-safe palette (Okabe-Ito); series also differ by dash pattern.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
DASHES = ["", "6 3", "2 2", "8 3 2 3"]


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float | None]]  # (x, y); y None = gap


@dataclass(frozen=True)
class Marker:
    """A vertical mark at x, e.g. an autoscaler decision."""

    x: float
    label: str
    by_operator: bool = False  # an operator's scale or pin, told apart from the autoscaler's own moves


@dataclass
class LineChart:
    title: str
    series: list[Series]
    y_label: str = ""
    threshold: float | None = None
    threshold_label: str = ""
    markers: list[Marker] = field(default_factory=list)
    x_is_time: bool = True
    x_range: tuple[float, float] | None = None  # the window shown, even where it has no data
    width: int = 560
    height: int = 220
    y_min_zero: bool = True


def nice_ceiling(value: float) -> float:
    """Round an axis maximum up to 1, 2, 2.5 or 5 times a power of ten, so tick labels stay short."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exponent = math.floor(math.log10(value))
    base = 10**exponent
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base + 1e-12:
            return step * base
    return 10 * base


def format_number(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e3:
        return f"{value / 1e3:.3g}k"
    if magnitude >= 10:
        return f"{value:.0f}"
    return f"{value:.2g}"


OFF_SCALE = 2.0


def _exact(value: float) -> str:
    """A value as the hover shows it: whole numbers with separators, others to three significant digits."""
    if float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.1f}"


def _format_x(x: float, is_time: bool) -> str:
    if is_time:
        return datetime.fromtimestamp(x).astimezone().strftime("%H:%M") if x > 1e8 else f"{x:g}"
    return format_number(x)


def line_chart(chart: LineChart) -> str:
    """Render time series as SVG lines, with an optional horizontal SLO line and vertical markers."""
    left, right, top, bottom = 52, 22, 28, 40
    plot_w, plot_h = chart.width - left - right, chart.height - top - bottom
    xs = [x for s in chart.series for x, y in s.points if y is not None] + [m.x for m in chart.markers]
    ys = [y for s in chart.series for _, y in s.points if y is not None]
    # The SLO line scales the axis only while it is near the data: a 50–100 ms TTFT under a 2,000 ms SLO would
    # read as a flat line at the bottom. Far above (more than OFF_SCALE × the data's peak) it is drawn at the top
    # edge with its value and an arrow instead.
    off_scale = chart.threshold is not None and bool(ys) and chart.threshold > OFF_SCALE * max(max(ys), 1e-12)
    if chart.threshold is not None and not off_scale:
        ys.append(chart.threshold)
    parts = [_svg_open(chart.width, chart.height, chart.title, natural=not xs or not ys)]
    parts.append(f'<text x="{left}" y="16" class="chart-title">{escape(chart.title)}</text>')
    if not xs or not ys:
        parts.append(
            f'<text x="{chart.width / 2}" y="{chart.height / 2}" text-anchor="middle" class="chart-empty">'
            "no data in this window</text></svg>"
        )
        return "".join(parts)
    x_lo, x_hi = chart.x_range or (min(xs), max(xs))
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    y_lo = 0.0 if chart.y_min_zero else min(ys)
    # Four grid steps of a round size, so tick labels read 0, 25, 50, 75, 100 rather than 0, 0.62, 1.25.
    y_hi = y_lo + 4 * nice_ceiling((max(ys) * 1.05 - y_lo) / 4)
    if y_hi <= y_lo:
        y_hi = y_lo + 1

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts.extend(_axes(left, top, plot_w, plot_h, y_lo, y_hi, chart.y_label))
    for i in range(5):
        x = x_lo + (x_hi - x_lo) * i / 4
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle" class="tick">'
            f"{escape(_format_x(x, chart.x_is_time))}</text>"
        )
    for marker in chart.markers:
        x = sx(marker.x)
        kind, glyph = ("marker operator", "◆") if marker.by_operator else ("marker", "▾")
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" class="{kind}">'
            f"<title>{escape(marker.label)}</title></line>"
            f'<text x="{x:.1f}" y="{top - 2}" text-anchor="middle" class="marker-label">{glyph}</text>'
        )
    if chart.threshold is not None:
        parts.extend(_threshold(chart, top if off_scale else sy(chart.threshold), left, plot_w, off_scale=off_scale))
    for i, series in enumerate(chart.series):
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        for segment in _segments(series.points):
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in segment)
            if len(segment) == 1:
                x, y = segment[0]
                parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>')
            else:
                parts.append(
                    f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash_attr} '
                    f'class="series"><title>{escape(series.label)}</title></polyline>'
                )
        # Exact values on hover: a target per point, with its time and value as the tooltip.
        parts.extend(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" class="hover-point"><title>'
            f"{escape(series.label)} at {escape(_format_x(x, chart.x_is_time))}: {escape(_exact(y))}</title></circle>"
            for x, y in series.points
            if y is not None
        )
    parts.append(_legend([s.label for s in chart.series], left, chart.height - 8))
    parts.append("</svg>")
    return "".join(parts)


def _threshold(chart: LineChart, y: float, left: float, plot_w: float, *, off_scale: bool) -> list[str]:
    """The SLO line at ``y``: at its value, or on the top edge with an arrow when it lies far above the data."""
    label = chart.threshold_label or "SLO"
    if off_scale:
        label = f"{label} ↑ above this axis"
    kind = "threshold off-scale" if off_scale else "threshold"
    return [
        f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="{kind}"/>',
        f'<text x="{left + plot_w - 2}" y="{(y + 12) if off_scale else (y - 4):.1f}" text-anchor="end" '
        f'class="threshold-label">{escape(label)}</text>',
    ]


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    note: str = ""


def bar_chart(title: str, bars: Sequence[Bar], *, unit: str = "", width: int = 360, limit: float | None = None) -> str:
    """Horizontal bars on one scale (e.g. capacity have / sold / used), with the value printed on each bar.

    Drawn at its natural pixel size (not stretched), with margins sized from the longest label and value.
    """
    char_w = 6.6  # average glyph width at 11 px
    row_h, top = 22, 22
    left = 10 + char_w * max([len(b.label) for b in bars] + [4])
    right = 10 + char_w * max([len(_bar_text(b, unit)) for b in bars] + [6])
    width = max(width, int(left + right + 160))
    height = top + row_h * max(len(bars), 1) + 8
    scale_max = nice_ceiling(max([b.value for b in bars] + [limit or 0, 1e-9]))
    plot_w = width - left - right
    parts = [_svg_open(width, height, title, natural=True)]
    parts.append(f'<text x="0" y="14" class="chart-title">{escape(title)}</text>')
    for i, bar in enumerate(bars):
        y = top + i * row_h
        w = max(0.0, bar.value) / scale_max * plot_w
        colour = PALETTE[i % len(PALETTE)]
        parts.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end" class="tick">{escape(bar.label)}</text>')
        parts.append(
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" fill="{colour}">'
            f"<title>{escape(bar.label)}: {escape(format_number(bar.value))} {escape(unit)}</title></rect>"
        )
        text = _bar_text(bar, unit)
        parts.append(f'<text x="{left + w + 4:.1f}" y="{y + 14}" class="bar-value">{escape(text)}</text>')
    if limit is not None:
        x = left + limit / scale_max * plot_w
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - 6}" class="threshold"/>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_area_points(series: list[Series]) -> list[Series]:
    """Cumulative sums of series sharing x values, so stacked lines (queue depth by class) read as totals."""
    totals: dict[float, float] = {}
    stacked = []
    for s in series:
        points = []
        for x, y in s.points:
            totals[x] = totals.get(x, 0.0) + (y or 0.0)
            points.append((x, totals[x]))
        stacked.append(Series(s.label, points))
    return stacked


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    segments: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if segments[-1]:
                segments.append([])
        else:
            segments[-1].append((x, y))
    return [s for s in segments if s]


def _bar_text(bar: Bar, unit: str) -> str:
    return f"{format_number(bar.value)} {unit}".strip() + (f" {bar.note}" if bar.note else "")


def _svg_open(width: int, height: int, title: str, natural: bool = False) -> str:
    size = f'width="{width}" height="{height}"' if natural else 'width="100%"'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" {size} '
        f'role="img" aria-label="{escape(title)}" class="chart" preserveAspectRatio="xMinYMin meet">'
        f"<title>{escape(title)}</title>"
    )


def _axes(left: float, top: float, plot_w: float, plot_h: float, y_lo: float, y_hi: float, y_label: str) -> list[str]:
    parts = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot-bg"/>']
    for i in range(5):
        value = y_lo + (y_hi - y_lo) * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{format_number(value)}</text>'
        )
    if y_label:
        parts.append(
            f'<text x="12" y="{top + plot_h / 2:.1f}" transform="rotate(-90 12 {top + plot_h / 2:.1f})" '
            f'text-anchor="middle" class="axis-label">{escape(y_label)}</text>'
        )
    return parts


def _legend(labels: list[str], left: float, y: float) -> str:
    parts, x = [], left
    for i, label in enumerate(labels):
        colour, dash = PALETTE[i % len(PALETTE)], DASHES[i % len(DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(
            f'<line x1="{x}" y1="{y - 4}" x2="{x + 18}" y2="{y - 4}" stroke="{colour}" stroke-width="2"{dash_attr}/>'
        )
        parts.append(f'<text x="{x + 22}" y="{y}" class="legend">{escape(label)}</text>')
        x += 30 + 7 * len(label)
    return "".join(parts)
