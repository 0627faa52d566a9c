"""``bench fidelity --plot``: predicted against measured, one panel per figure, with the ±15 % band (hand-written SVG)."""

from __future__ import annotations

from html import escape

PANELS = (
    ("throughput_tok_s", "throughput (tok/s)"),
    ("ttft_p50_s", "TTFT p50 (s)"),
    ("ttft_p90_s", "TTFT p90 (s)"),
    ("tpot_p50_s", "TPOT p50 (s)"),
    ("prefix_hit_rate", "prefix hit rate"),
)


def fidelity_svg(points: list[dict], *, panel: int = 220, goal: float = 0.15) -> str:
    pad, top = 44, 40
    width = pad + len(PANELS) * (panel + pad)
    height = top + panel + 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        f'<text x="{pad}" y="18" font-size="13">bench fidelity: simulator (y) against real vLLM (x) at held-out '
        f"points; the band is ±{goal:.0%}</text>",
    ]
    for i, (metric, title) in enumerate(PANELS):
        x0 = pad + i * (panel + pad)
        pairs = [
            (p["measured"][metric], p["predicted"][metric], p["point"]) for p in points if metric in p["measured"]
        ]
        parts.append(f'<text x="{x0}" y="{top - 6}">{title}</text>')
        parts.append(f'<rect x="{x0}" y="{top}" width="{panel}" height="{panel}" fill="none" stroke="black"/>')
        if not pairs:
            parts.append(f'<text x="{x0 + 8}" y="{top + 20}">no point</text>')
            continue
        high = max(max(m, p) for m, p, _ in pairs) * 1.15 or 1.0

        def xy(measured: float, predicted: float, x0=x0, high=high) -> tuple[float, float]:
            return x0 + panel * measured / high, top + panel - panel * predicted / high

        band = [xy(0, 0), xy(high, high * (1 + goal)), xy(high, high * (1 - goal))]
        parts.append('<polygon fill="#e8f0e8" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in band) + '"/>')
        (ax, ay), (bx, by) = xy(0, 0), xy(high, high)
        parts.append(f'<line x1="{ax:.1f}" y1="{ay:.1f}" x2="{bx:.1f}" y2="{by:.1f}" stroke="gray"/>')
        for measured, predicted, label in pairs:
            x, y = xy(measured, predicted)
            error = (predicted - measured) / measured if measured else 0.0
            colour = "#2a7" if abs(error) <= goal else "#c33"
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{colour}"><title>{escape(label)}: measured '
                f"{measured:.4g}, simulated {predicted:.4g} ({error:+.0%})</title></circle>"
            )
        parts.append(f'<text x="{x0 + panel}" y="{top + panel + 14}" text-anchor="end">{high:.3g}</text>')
        parts.append(f'<text x="{x0 + panel / 2}" y="{top + panel + 28}" text-anchor="middle">measured</text>')
    parts.append("</svg>")
    return "\n".join(parts)
