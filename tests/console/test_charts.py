"""Server-side SVG charts: data reaches the drawing, gaps stay gaps, labels are escaped, axes are round."""

import re
import xml.etree.ElementTree as ET

import pytest

from console import charts

SVG = "{http://www.w3.org/2000/svg}"


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML or this raises


def test_line_chart_draws_series_threshold_and_markers():
    points = [(1000.0 + 60 * i, float(i * 10)) for i in range(10)]
    svg = charts.line_chart(
        charts.LineChart(
            "TTFT p95 (ms)",
            [charts.Series("p95", points)],
            threshold=45,
            threshold_label="SLO 45 ms",
            markers=[charts.Marker(1180.0, "scale 1 → 2")],
            x_is_time=False,
        )
    )
    root = _parse(svg)
    polyline = root.find(f"{SVG}polyline")
    coords = [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]
    assert len(coords) == 10
    assert coords[0][1] > coords[-1][1]  # rising values go up the screen
    assert [c[0] for c in coords] == sorted(c[0] for c in coords)
    threshold = root.find(f"{SVG}line[@class='threshold']")
    y_threshold = float(threshold.get("y1"))
    assert coords[4][1] > y_threshold > coords[5][1]  # 40 below the 45 line, 50 above it
    marker = root.find(f"{SVG}line[@class='marker']")
    assert coords[2][0] < float(marker.get("x1")) < coords[4][0] + 0.01 and "scale 1 → 2" in svg
    assert "SLO 45 ms" in svg and root.get("aria-label") == "TTFT p95 (ms)"


def test_gaps_split_lines_and_empty_data_says_so():
    points = [(0, 1.0), (1, 2.0), (2, None), (3, 1.0), (4, 3.0)]
    root = _parse(charts.line_chart(charts.LineChart("x", [charts.Series("s", points)], x_is_time=False)))
    assert len(root.findall(f"{SVG}polyline")) == 2
    empty = charts.line_chart(charts.LineChart("nothing", [charts.Series("s", [(0, None)])]))
    assert "no data in this window" in empty and "<polyline" not in empty


def test_x_range_keeps_the_whole_window():
    chart = charts.LineChart("x", [charts.Series("s", [(50, 1.0), (100, 2.0)])], x_range=(0, 100), x_is_time=False)
    root = _parse(charts.line_chart(chart))
    first_x = float(root.find(f"{SVG}polyline").get("points").split()[0].split(",")[0])
    assert first_x > 52 + 100  # x=50 sits in the middle of the plot, not at its left edge


def test_labels_are_escaped():
    svg = charts.line_chart(
        charts.LineChart("<script>", [charts.Series("a&b", [(0, 1.0), (1, 2.0)])], x_is_time=False)
    )
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "a&amp;b" in svg
    _parse(svg)
    bars = charts.bar_chart("cap", [charts.Bar('"quoted"', 3.0)])
    assert "&quot;quoted&quot;" in bars
    _parse(bars)


def test_y_axis_ticks_are_round_numbers():
    svg = charts.line_chart(charts.LineChart("x", [charts.Series("s", [(0, 0.0), (1, 1870.0)])], x_is_time=False))
    ticks = re.findall(r'class="tick">([^<]+)</text>', svg)[:5]
    assert ticks == ["0", "500", "1k", "1.5k", "2k"]
    assert charts.nice_ceiling(0.0) == 1.0 and charts.nice_ceiling(3.2) == 5 and charts.nice_ceiling(101) == 200


def test_bar_chart_scales_bars_and_sizes_margins_to_labels():
    root = _parse(
        charts.bar_chart(
            "capacity",
            [charts.Bar("have", 2000), charts.Bar("sold", 1000), charts.Bar("a-very-long-label", 500)],
            unit="MU/min",
        )
    )
    widths = [float(r.get("width")) for r in root.findall(f"{SVG}rect")]
    assert widths[0] == pytest.approx(2 * widths[1], abs=0.2) == pytest.approx(4 * widths[2], abs=0.4)
    assert float(root.find(f"{SVG}rect").get("x")) > 6.6 * len("a-very-long-label")


def _y_axis_top(root) -> float:
    ticks = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "tick" and t.get("text-anchor") == "end"]
    return max(float(t.rstrip("k")) * (1000 if t.endswith("k") else 1) for t in ticks if t)


def test_a_far_slo_is_drawn_at_the_edge_and_does_not_squash_the_data():
    # TTFT 50–100 ms under a 2,000 ms SLO: the axis reads the data, the SLO sits on the edge.
    points = [(float(i), 50.0 + 5 * i) for i in range(11)]
    far = _parse(
        charts.line_chart(
            charts.LineChart(
                "TTFT", [charts.Series("p95", points)], threshold=2000, threshold_label="SLO 2000 ms", x_is_time=False
            )
        )
    )
    assert _y_axis_top(far) <= 200  # not the 2,000+ the SLO line would force
    edge = far.find(f"{SVG}line[@class='threshold off-scale']")
    assert edge is not None
    coords = [tuple(map(float, p.split(","))) for p in far.find(f"{SVG}polyline").get("points").split()]
    assert float(edge.get("y1")) <= min(y for _, y in coords)  # above every point
    assert "SLO 2000 ms ↑ above this axis" in ET.tostring(far, encoding="unicode")
    # Near the data (under 2× its peak) the SLO line scales the axis as before and sits at its value.
    near = _parse(
        charts.line_chart(charts.LineChart("TTFT", [charts.Series("p95", points)], threshold=180, x_is_time=False))
    )
    assert near.find(f"{SVG}line[@class='threshold']") is not None and _y_axis_top(near) >= 180


def test_every_point_carries_its_exact_value_on_hover():
    points = [(0.0, 1234.0), (1.0, None), (2.0, 0.125)]
    root = _parse(charts.line_chart(charts.LineChart("x", [charts.Series("used", points)], x_is_time=False)))
    titles = [c.find(f"{SVG}title").text for c in root.iter(f"{SVG}circle") if c.get("class") == "hover-point"]
    assert titles == ["used at 0: 1,234", "used at 2: 0.125"]  # no target for the gap
