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
