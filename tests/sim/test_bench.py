"""``bench sim`` returns the issue's figures (a reduced run)."""

from endpoints.benchmarks import sim as bench


def test_bench_sim_reports_the_figures(tmp_path):
    svg = tmp_path / "fit.svg"
    figures = bench.run(quick=True, plot=str(svg), progress=lambda msg: None, requests="300")
    assert set(figures["profile_fit"]) == {16, 64, 128} and figures["profile_fit_within_5pct"]
    assert 0 < figures["prefix_ttft_ratio"] < 0.2
    assert figures["des_requests_per_s"] > 0 and figures["des_summary"]["completed"] == 300
    assert figures["deterministic"] is True
    assert svg.read_text().startswith("<svg") and "polyline" in svg.read_text()
