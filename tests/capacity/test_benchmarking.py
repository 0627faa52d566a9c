"""The benchmark's arithmetic (NNLS, steady window) and its fit against the simulator's engine in virtual time.

The engine is the same performance model the HTTP replica runs; in virtual time there is no clock noise, so the
fit must recover the costs derived from the profile (``engine_true_costs``) within 10 %.
"""

import pytest

from capacity.hardware.profiles import get_profile
from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, SweepConfig, nnls, run_sweep, summarize
from capacity.units import GPU_SECONDS_PER_MU, MU_PER_GPU_MINUTE
from simulator.replica_driver import EngineDriver, engine_true_costs


def test_nnls_recovers_exact_coefficients_and_keeps_them_non_negative():
    truth = [0.002, 0.0, 0.015, 0.1]
    rows = [[u, c, o, 1.0] for u, c, o in [(100, 0, 10), (1000, 0, 20), (50, 400, 200), (700, 100, 5), (10, 10, 300)]]
    targets = [sum(t * x for t, x in zip(truth, row, strict=True)) for row in rows]
    assert nnls(rows, targets) == pytest.approx(truth, abs=1e-9)
    # Data that an unconstrained fit explains with a negative intercept: NNLS clamps it to 0 instead.
    rows = [[1.0, 0, 0, 1.0], [2.0, 0, 0, 1.0], [3.0, 0, 0, 1.0]]
    solution = nnls(rows, [0.5, 1.6, 2.7])
    assert min(solution) >= 0 and solution[3] == 0


def _closed_loop(n: int, c: int, period: float) -> list[Sample]:
    # Every stream finishes a request every `period` seconds, streams offset evenly.
    samples = []
    for i in range(n):
        stream, k = i % c, i // c
        start = k * period + stream * period / c
        samples.append(Sample(start, start + period, start + 0.1, 100, 20, 50))
    return samples


def test_steady_window_excludes_ramp_up_and_drain():
    stats = summarize(Shape(100, 50), 4, _closed_loop(40, 4, 2.0), gpus=2)
    assert stats.window_requests == 40 - 2 * 4
    assert stats.req_per_s == pytest.approx(4 / 2.0)
    assert stats.gpu_s_per_request == pytest.approx(2 * 2.0 / 4)
    assert stats.per_stream_tok_s == pytest.approx(49 / 1.9)
    assert (stats.mean_uncached_in, stats.mean_cached_in, stats.mean_out) == (80, 20, 50)


def test_mostly_failed_runs_are_an_error_not_a_number():
    samples = _closed_loop(12, 2, 1.0)
    for s in samples[:8]:
        s.ok, s.error = False, "HTTP 500"
    with pytest.raises(BenchmarkError, match="HTTP 500"):
        summarize(Shape(100, 50), 2, samples)


@pytest.fixture(scope="module")
def engine_sweep():
    profile = get_profile("llama-13b-a100")
    # 30 tok/s per stream: the roofline-derived 13B profile streams at most 60 tok/s, at batch 1.
    cfg = SweepConfig(tpot_slo_ms=1000 / 30, ttft_slo_ms=2000, requests_per_stream=20)
    return profile, cfg, run_sweep(EngineDriver(profile), cfg)


def test_fit_recovers_the_simulators_costs_within_10_percent(engine_sweep):
    profile, cfg, result = engine_sweep
    fit = result["fit"]
    b_max = result["b_max"]
    reference = cfg.reference_shape
    true = engine_true_costs(
        profile, batch=b_max, context_tokens=reference.input_tokens + reference.output_tokens / 2
    ).in_mu()
    assert fit["alpha"] == pytest.approx(true["alpha"], rel=0.10)
    assert fit["beta"] == pytest.approx(true["beta"], rel=0.10)
    # Cached prompt tokens cost the simulator no prefill time.
    assert fit["alpha_cached"] <= 0.1 * true["alpha"]
    # γ is small next to a request's cost; its error stays under 10 % of the reference request's true cost.
    reference_true_mu = true["alpha"] * reference.input_tokens + true["beta"] * reference.output_tokens + true["gamma"]
    assert abs(fit["gamma"] - true["gamma"]) < 0.1 * reference_true_mu
    assert fit["output_to_input_ratio"] > 3  # decode dominates, as the design expects for self-hosted models
    assert fit["held_out_relative_error"] < 0.05


def test_b_max_is_the_largest_batch_meeting_the_stream_rate(engine_sweep):
    _, cfg, result = engine_sweep
    rows = {row["batch"]: row for row in result["throughput_table"]}
    b_max = result["b_max"]
    assert rows[b_max]["per_stream_tok_s"] >= cfg.min_stream_tok_s
    assert all(row["per_stream_tok_s"] < cfg.min_stream_tok_s for batch, row in rows.items() if batch > b_max)
    # Bisection narrowed it between two sweep levels: the next measured batch above fails.
    above = min(batch for batch in rows if batch > b_max)
    assert above - b_max <= max(1, b_max // 4)


def test_capacity_matches_the_simulators_slo_compliant_capacity(engine_sweep):
    profile, _, result = engine_sweep
    # At its SLO-compliant maximum load the engine never idles, so it delivers all its GPU time: 1,000 MU/min/GPU.
    assert result["mu_per_min"] == pytest.approx(MU_PER_GPU_MINUTE * profile.gpus, rel=0.10)
    # The same capacity in requests: true GPU-seconds per reference request → requests per second.
    true = engine_true_costs(profile, batch=result["b_max"], context_tokens=512 + 64)
    true_req_s = profile.gpus / true.gpu_seconds(512, 0, 128)
    assert result["capacity"]["req_per_s"] == pytest.approx(true_req_s, rel=0.10)
    assert result["capacity"]["mu_per_request"] * GPU_SECONDS_PER_MU == pytest.approx(1 / true_req_s, rel=0.10)


def test_an_slo_no_batch_meets_is_explained():
    profile = get_profile("llama-13b-a100")
    cfg = SweepConfig(tpot_slo_ms=2, ttft_slo_ms=2000, levels=(1, 2), requests_per_stream=3)
    result = run_sweep(EngineDriver(profile), cfg)
    assert result["feasible"] is False
    assert "No concurrency meets the SLO" in result["explanation"]
