"""Fitting a simulator profile to a replica's benchmark runs (``bench fidelity``'s calibration), proved on the
simulator itself: when the "engine" is a known profile, the fit finds its step times and predicts held-out load
points of that engine."""

import pytest

from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, SweepConfig, run_sweep
from endpoints.benchmarks.fidelity import CALIBRATION, POINTS
from endpoints.benchmarks.fidelity.load import (
    LoadPoint,
    Recorder,
    grain_hashes,
    point_stats,
    prompt_ids,
    simulate_point,
)
from endpoints.runtimes.sim.calibration import MeasuredLevel, profile_from_levels, refine_profile, step_cost_fit
from endpoints.runtimes.sim.profiles import get_profile

TRUTH = get_profile("tiny-cpu")
GAP_S = 0.002
FRONTEND_S = 0.010  # the "engine"'s API server: 10 ms from the send to the scheduler


class SimulatedEngine:
    """A LoadDriver whose engine is the simulator at a known profile."""

    name = "sim"

    def run(self, shape, concurrency, requests, run_id, prefix_groups=1):
        point = LoadPoint(shape, concurrency, requests, prefix_groups)
        return simulate_point(TRUTH, point, run_id=run_id, client_gap_s=GAP_S, frontend_s=FRONTEND_S)


@pytest.fixture(scope="module")
def sweep_runs():
    recorder = Recorder(SimulatedEngine())
    run_sweep(recorder, SweepConfig(tpot_slo_ms=60_000, ttft_slo_ms=600_000, **CALIBRATION["quick"]))
    return recorder.runs


def test_the_closed_form_fit_lands_near_the_true_step_times(sweep_runs):
    levels = [MeasuredLevel.from_samples(point.concurrency, samples) for point, _, samples in sweep_runs]
    assert all(1 <= lv.decode_batch <= lv.concurrency for lv in levels)
    fit = step_cost_fit(levels)
    assert fit["t0_s"] == pytest.approx(TRUTH.decode_t0_s, rel=0.15)
    assert 1 / fit["prefill_s_per_token"] == pytest.approx(TRUTH.prefill_tokens_per_s, rel=0.15)
    assert fit["cached_s_per_token"] < 0.2 * fit["prefill_s_per_token"]  # the simulator charges no hit


def test_refined_in_the_simulator_it_predicts_held_out_points_within_10_percent(sweep_runs):
    levels = [MeasuredLevel.from_samples(point.concurrency, samples) for point, _, samples in sweep_runs]
    fitted = profile_from_levels(TRUTH, levels)
    targets = [point_stats(point, samples) for point, _, samples in sweep_runs]

    def simulate(profile, extras, i):
        point, run_id, _ = sweep_runs[i]
        return point_stats(point, simulate_point(profile, point, run_id=run_id, client_gap_s=GAP_S, **extras))

    extras = {"frontend_s": (fitted.decode_t0_s, fitted.decode_t0_s)}
    refined, found, rms = refine_profile(fitted, targets, simulate, extras=extras, max_evaluations=150)
    assert rms < 0.05  # the sweep's own runs replay almost exactly
    assert found["frontend_s"] == pytest.approx(FRONTEND_S, rel=0.3)
    for point in POINTS["quick"]:
        truth = point_stats(
            point, simulate_point(TRUTH, point, run_id="held-out", client_gap_s=GAP_S, frontend_s=FRONTEND_S)
        )
        predicted = point_stats(point, simulate_point(refined, point, run_id="held-out", client_gap_s=GAP_S, **found))
        for metric, value in truth.items():
            if value:
                assert predicted[metric] == pytest.approx(value, rel=0.10), (point.label, metric)


def test_token_id_prompts_share_exactly_their_prefix():
    shape = Shape(300, 8, shared_prefix_tokens=130)
    a, b = (prompt_ids(shape, run_id="r", index=i, vocab_size=4096) for i in (0, 1))
    assert len(a) == len(b) == 300 and a[:130] == b[:130] and a[130:] != b[130:]
    assert min(a) >= 3 and max(a) < 4096  # no BOS, EOS or padding id
    other_group = prompt_ids(shape, run_id="r", index=1, vocab_size=4096, prefix_groups=2)
    assert other_group[:130] != a[:130]
    # 16-token grains, chained: the first 8 (128 tokens) agree, the 9th holds a token of each own part.
    ha, hb = grain_hashes(a), grain_hashes(b)
    assert len(ha) == 300 // 16 and ha[:8] == hb[:8] and ha[8] != hb[8]


def test_stats_of_a_closed_loop_and_the_fit_s_refusal_of_too_few_runs():
    point = LoadPoint(Shape(64, 11), 1, 3)
    samples = [Sample(i * 1.0, i * 1.0 + 0.6, i * 1.0 + 0.1, 64, 32, 11) for i in range(3)]
    stats = point_stats(point, samples)
    assert stats["ttft_p50_s"] == pytest.approx(0.1) and stats["tpot_p50_s"] == pytest.approx(0.05)
    assert stats["prefix_hit_rate"] == pytest.approx(0.5)
    with pytest.raises(BenchmarkError, match="at least 6 runs"):
        step_cost_fit([MeasuredLevel.from_samples(1, samples)])


def test_bench_fidelity_refuses_what_it_cannot_measure_with_a_clear_error():
    from django.core.management.base import CommandError

    from endpoints.benchmarks import fidelity
    from endpoints.runtimes.sim.process import free_port

    quiet = {"quick": True, "progress": lambda _m: None}
    with pytest.raises(CommandError, match="size= takes smoke, quick, full"):
        fidelity.run(**quiet, size="huge")
    with pytest.raises(CommandError, match="repeats="):
        fidelity.run(**quiet, repeats="three")
    with pytest.raises(CommandError, match="is not a vLLM server to measure: cannot reach"):
        fidelity.run(**quiet, url=f"http://127.0.0.1:{free_port()}")
