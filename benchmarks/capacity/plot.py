"""A small hand-written SVG for ``bench planner --plot``: SLO attainment at N_base − 1 and N_base per workload."""

from __future__ import annotations

from html import escape


def agreement_svg(agreement: list[dict], *, width: int = 720, height: int = 360) -> str:
    left, bottom, top = 60, 60, 40
    plot_h = height - bottom - top
    groups = [a for a in agreement if a.get("n_base")]
    group_w = (width - left - 20) / max(1, len(groups))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<text x="{left}" y="20" font-size="14">SLO attainment in the simulator at the planner\'s N_base − 1 '
        "and N_base</text>",
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h * (1 - tick)
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{tick:.0%}</text>')
    for i, a in enumerate(groups):
        x0 = left + i * group_w + group_w * 0.15
        bar_w = group_w * 0.3
        for j, (key, label, colour) in enumerate(
            (("at_n_base_minus_1", f"N={a['n_base'] - 1}", "#d9534f"), ("at_n_base", f"N={a['n_base']}", "#5cb85c"))
        ):
            value = (a.get(key) or {}).get("attainment") or 0.0
            x = x0 + j * bar_w
            h = plot_h * value
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 4:.1f}" height="{h:.1f}" '
                f'fill="{colour}"><title>{escape(label)}: {value:.1%}</title></rect>'
            )
            parts.append(
                f'<text x="{x + bar_w / 2 - 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{label}</text>'
            )
        parts.append(
            f'<text x="{x0 + bar_w:.1f}" y="{top + plot_h + 32}" text-anchor="middle">{escape(a["workload"])}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def frontier_svg(
    curves: dict[str, list[tuple[float, float]]],
    *,
    title: str,
    width: int = 760,
    height: int = 440,
    x_label: str = "GPU-hours",
) -> str:
    """GPU-hours (x) against SLO attainment (y), one polyline with markers per policy (``bench autoscale --plot``)."""
    left, right, bottom, top = 70, 170, 50, 40
    points = [p for curve in curves.values() for p in curve]
    x_max = max((x for x, _ in points), default=1.0) * 1.05 or 1.0
    y_min = min(0.5, min((y for _, y in points), default=0.5))
    plot_w, plot_h = width - left - right, height - bottom - top
    colours = ["#888", "#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd", "#111"]

    def xy(x: float, y: float) -> tuple[float, float]:
        return left + plot_w * x / x_max, top + plot_h * (1 - (y - y_min) / (1 - y_min))

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>',
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 12}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="16" y="{top + plot_h / 2:.0f}" transform="rotate(-90 16 {top + plot_h / 2:.0f})" '
        'text-anchor="middle">SLO attainment</text>',
    ]
    for i in range(6):
        y = y_min + (1 - y_min) * i / 5
        _, py = xy(0, y)
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py:.1f}" y2="{py:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{y:.0%}</text>')
        x = x_max * i / 5
        px, _ = xy(x, y_min)
        parts.append(f'<text x="{px:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{x:.1f}</text>')
    for i, (name, curve) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        pts = [xy(x, y) for x, y in sorted(curve)]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>'
        )
        for (a, b), (x, y) in zip(pts, sorted(curve), strict=True):
            parts.append(
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"><title>{escape(name)}: {x:.2f} {escape(x_label)}, '
                f"{y:.2%}</title></circle>"
            )
        parts.append(f'<text x="{left + plot_w + 12}" y="{top + 16 * i + 8}" fill="{colour}">{escape(name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
