"""``bench sim`` returns the figures its module docstring lists (a reduced run)."""

from benchmarks.serving import sim as bench


def test_bench_sim_reports_the_figures(tmp_path):
    svg = tmp_path / "fit.svg"
    figures = bench.run(quick=True, plot=str(svg), progress=lambda msg: None, requests="300")
    assert set(figures["profile_fit"]) == {16, 64, 128} and figures["profile_within_roofline"] is True
    assert all(figures["profile_fit"][b] < figures["profile_roofline_tok_s"][b] for b in (16, 64, 128))
    assert 0 < figures["prefix_ttft_ratio"] < 0.2
    assert figures["des_requests_per_s"] > 0 and figures["des_summary"]["completed"] == 300
    assert figures["deterministic"] is True
    assert svg.read_text().startswith("<svg") and svg.read_text().count("polyline") == 2  # profile, roofline
