"""Fitting a simulator profile to a replica's benchmark runs (``bench fidelity``'s calibration), proved on the
simulator itself: when the "engine" is a known profile, the fit finds its step times and predicts held-out load
points of that engine."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.serving import fidelity
from benchmarks.serving.fidelity import CALIBRATION, POINTS
from benchmarks.serving.fidelity.load import (
    METRICS,
    ApiServerCost,
    LoadPoint,
    Recorder,
    grain_hashes,
    group_pids,
    pin_engine,
    point_stats,
    prompt_ids,
    simulate_point,
)
from capacity.hardware.profiles import get_profile
from capacity.replica_benchmark.sweep import BenchmarkError, Sample, Shape, SweepConfig, run_sweep
from simulator.calibration import (
    PREFILL_FIELDS,
    MeasuredLevel,
    prefill_fit,
    refine_profile,
    step_cost_fit,
    with_probed_overhead,
)

TRUTH = get_profile("tiny-cpu")
GAP_S = 0.002
# The "engine"'s API server: 2 ms a request, 4 µs a prompt token, 0.3 ms a streamed token, on one CPU.
API = ApiServerCost(per_request_s=0.002, per_prompt_token_s=4e-6, per_token_s=3e-4)


class SimulatedEngine:
    """A LoadDriver whose engine is the simulator at a known profile."""

    name = "sim"

    def run(self, shape, concurrency, requests, run_id, prefix_groups=1):
        point = LoadPoint(shape, concurrency, requests, prefix_groups)
        return simulate_point(TRUTH, point, run_id=run_id, client_gap_s=GAP_S, api=API)


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


@pytest.mark.slow
def test_refined_in_the_simulator_it_predicts_held_out_points_within_10_percent(sweep_runs):
    """The bench's own calibration (``fidelity.calibrate``: closed form, then the search over step times and the
    API server's costs) on runs of a known engine: its runs replay, the API server's per-token cost is found, and
    held-out points (other concurrencies, lengths, a prefix mix) come out within 10 % (each figure's mean over the
    points)."""
    fitted, refined, api, rms = fidelity.calibrate(
        TRUTH, sweep_runs, client_gap_s=GAP_S, evaluations=300, progress=lambda _m: None, api_model="fifo"
    )
    assert rms < 0.05  # the sweep's own runs replay almost exactly
    assert api.per_token_s > 0.1 * API.per_token_s  # found, if traded against the step time it adds to
    errors: dict[str, list[float]] = {}
    for point in POINTS["quick"]:
        truth = point_stats(point, simulate_point(TRUTH, point, run_id="held-out", client_gap_s=GAP_S, api=API))
        predicted = point_stats(point, simulate_point(refined, point, run_id="held-out", client_gap_s=GAP_S, api=api))
        for metric in METRICS:  # the figures the bench judges
            if truth[metric]:
                errors.setdefault(metric, []).append(abs(predicted[metric] / truth[metric] - 1))
                # A p90 over 24 requests is one request: whether two of three long prompts collide moves it by a
                # prefill step (1,664/40 on 3 streams: +25 %), so each point's bound is looser than the mean's.
                assert predicted[metric] == pytest.approx(truth[metric], rel=0.30), (point.label, metric)
        assert predicted["frontend_p50_s"] == pytest.approx(truth["frontend_p50_s"], rel=0.2), point.label
    # As the bench judges: each figure's mean |error| over the points.
    assert all(sum(e) / len(e) <= 0.10 for e in errors.values()), errors


def test_prefill_probes_measure_the_prefill_rate_and_attention_term_that_the_refinement_then_holds(sweep_runs):
    """Requests one at a time on an idle engine (``fidelity.probe_prefill``): cold prompts of several lengths and
    prompts behind a cached prefix pin prefill's rate and attention's u·(c + u/2) term apart, which the sweep alone
    trades against the API server's per-prompt-token cost; ``calibrate`` then holds them while it refines."""
    truth = TRUTH.with_options(prefill_tokens_per_s=60_000.0, prefill_per_ctx_token_s=3e-8)

    class Engine(SimulatedEngine):
        def run(self, shape, concurrency, requests, run_id, prefix_groups=1):
            point = LoadPoint(shape, concurrency, requests, prefix_groups)
            return simulate_point(truth, point, run_id=run_id, client_gap_s=GAP_S, api=API)

    probes = fidelity.probe_prefill(Engine(), "quick", "probe")
    assert len(probes) == sum(n for _, n in fidelity.PROBES["quick"])
    assert any(cached >= 1024 for _, cached, _ in probes)  # a probe run's later requests hit its prefix
    measured = prefill_fit(probes, token_budget=truth.max_num_batched_tokens)
    assert measured["prefill_tokens_per_s"] == pytest.approx(60_000.0, rel=0.05)
    assert measured["prefill_per_ctx_token_s"] == pytest.approx(3e-8, rel=0.05)
    # The fixed part: the step's overhead, the decode step it rides on and the first token's way to the client.
    fixed = truth.prefill_overhead_s + truth.decode_t0_s + API.per_token_s
    assert measured["fixed_s"] == pytest.approx(fixed, rel=0.05)
    for api_model in fidelity.API_MODELS:
        _, refined, api, _ = fidelity.calibrate(
            TRUTH, sweep_runs, client_gap_s=GAP_S, evaluations=20, progress=lambda _m: None, probes=probes,
            api_model=api_model,
        )  # fmt: skip
        assert all(getattr(refined, f) == pytest.approx(measured[f]) for f in PREFILL_FIELDS)
        # The prefill overhead is what the fixed part leaves once the refined t0 and API server are known: the
        # refined simulator prefills a lone prompt in the time the probes measured (its first token processed and,
        # merging, its event sent).
        through = api.per_token_s + api.per_event_s
        assert refined.prefill_overhead_s + refined.decode_t0_s + through == pytest.approx(measured["fixed_s"])
        assert (api.per_event_s > 0) == (api_model == "merging")
    assert refined.prefill_overhead_s == pytest.approx(truth.prefill_overhead_s, rel=0.3)
    with pytest.raises(BenchmarkError, match="three shapes"):
        prefill_fit([(256, 0, 0.01), (256, 0, 0.011), (512, 0, 0.02)], token_budget=2048)
    with pytest.raises(ValueError, match="held"):
        refine_profile(TRUTH, [], lambda *a: {}, held=("decode_t1_s",))


def test_the_probed_overhead_is_the_fixed_part_less_the_decode_step_and_the_first_token_s_way_out():
    """``with_probed_overhead`` inverts what the simulator makes of a probe: a lone prompt's time from its headers to
    its first token is the overhead, the t0 step it rides on and the API server's work for that token."""
    truth = TRUTH.with_options(prefill_overhead_s=0.005, decode_t0_s=0.002)
    api = ApiServerCost(per_token_s=3e-4)
    probes = []
    for shape in (Shape(256, 2), Shape(768, 2), Shape(1280, 2)):
        for s in simulate_point(truth, LoadPoint(shape, 1, 2), run_id=f"probe-{shape.label}", api=api):
            probes.append((s.prompt_tokens - s.cached_tokens, s.cached_tokens, s.first_token_s - s.accepted_s))
    fixed = prefill_fit(probes, token_budget=truth.max_num_batched_tokens)["fixed_s"]
    found = with_probed_overhead(truth.with_options(prefill_overhead_s=0.0), fixed, per_token_s=api.per_token_s)
    assert found.prefill_overhead_s == pytest.approx(0.005, rel=0.01)
    # A fixed part shorter than the step and the token's way out: no overhead, never a negative one.
    assert with_probed_overhead(truth, 0.001, per_token_s=api.per_token_s).prefill_overhead_s == 0.0


def test_a_request_reaches_a_busy_engine_s_scheduler_later():
    """``busy_admit_s``: the engine takes new input between steps; alone on an idle engine a request is not
    delayed, among others it is."""
    lone, busy = LoadPoint(Shape(256, 16), 1, 6), LoadPoint(Shape(256, 16), 6, 36)
    delay = ApiServerCost(busy_admit_s=0.01)
    for point, extra in ((lone, 0.0), (busy, 0.01)):
        plain = point_stats(point, simulate_point(TRUTH, point, run_id="admit"))
        delayed = point_stats(point, simulate_point(TRUTH, point, run_id="admit", api=delay))
        assert delayed["frontend_p50_s"] == pytest.approx(plain["frontend_p50_s"])  # the headers are not late
        if extra:
            assert delayed["engine_ttft_p50_s"] > plain["engine_ttft_p50_s"] + 0.5 * extra
        else:
            assert delayed["ttft_p50_s"] == pytest.approx(plain["ttft_p50_s"])


def test_the_api_server_holds_requests_behind_the_tokens_it_streams():
    """One CPU's FIFO: with a cost per streamed token, a request waits behind the others' tokens before the engine
    sees it (the headers come later), and every token reaches the client later; with no costs the client sees the
    engine's own times."""
    point = LoadPoint(Shape(256, 48), 8, 40)
    plain = point_stats(point, simulate_point(TRUTH, point, run_id="api"))
    loaded = point_stats(point, simulate_point(TRUTH, point, run_id="api", api=ApiServerCost(per_token_s=5e-3)))
    assert plain["frontend_p50_s"] == 0.0 and plain["ttft_p50_s"] == pytest.approx(plain["engine_ttft_p50_s"])
    assert loaded["frontend_p50_s"] > 0.0
    assert loaded["ttft_p50_s"] > plain["ttft_p50_s"] and loaded["tpot_p50_s"] > plain["tpot_p50_s"]
    assert loaded["throughput_tok_s"] < plain["throughput_tok_s"]
    # A cost per prompt token makes long prompts wait longer before the engine.
    long = LoadPoint(Shape(2048, 48), 1, 6)
    slow_parse = ApiServerCost(per_prompt_token_s=1e-5)
    assert point_stats(long, simulate_point(TRUTH, long, run_id="p", api=slow_parse))["frontend_p50_s"] == (
        pytest.approx(2048 * 1e-5)
    )


def test_a_request_sent_during_a_long_step_is_not_queued_behind_that_step_s_tokens():
    """The API server's FIFO takes work in the order it comes: a request sent while the engine runs a 2,048-token
    prefill (a quarter of a second at ``tiny-cpu``'s rate) gets its headers after its own parsing, not after the
    tokens that step streams when it ends. Fed out of order, the long prompts' API-server delay came out 100 ms
    long on the 2026-12-06 capture, and the fit made the engine faster to pay for it."""
    point = LoadPoint(Shape(2048, 4), 2, 10)
    samples = simulate_point(TRUTH, point, run_id="fifo", client_gap_s=GAP_S, api=ApiServerCost(per_request_s=1e-3))
    delays = sorted(s.accepted_s - s.start_s for s in samples)
    # Every request alone at the API server but the two sent together at the start (the second waits 1 ms).
    assert delays[:-1] == pytest.approx([1e-3] * (len(delays) - 1)) and delays[-1] == pytest.approx(2e-3)


def test_the_refinement_can_ignore_a_distorted_run():
    """Least trimmed squares: one figure off by 10× (a run a neighbour disturbed) drags the plain fit and not the
    trimmed one."""
    truth = 0.004
    scales = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    targets = [{"x": truth * k} for k in scales]
    targets[3] = {"x": truth * scales[3] * 10}

    def simulate(profile, extras, i):
        return {"x": profile.decode_t0_s * scales[i]}

    start = TRUTH.with_options(decode_t0_s=0.002)
    plain, _, _ = refine_profile(start, targets, simulate, max_evaluations=200)
    trimmed, _, rms = refine_profile(start, targets, simulate, max_evaluations=200, trim=0.1)
    assert trimmed.decode_t0_s == pytest.approx(truth, rel=0.02) and rms < 0.01
    assert plain.decode_t0_s > 1.15 * truth
    with pytest.raises(ValueError, match="trim"):
        refine_profile(start, targets, simulate, trim=1.0)


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
    samples = [Sample(i * 1.0, i * 1.0 + 0.6, i * 1.0 + 0.1, 64, 32, 11, accepted_s=i * 1.0 + 0.03) for i in range(3)]
    stats = point_stats(point, samples)
    assert stats["ttft_p50_s"] == pytest.approx(0.1) and stats["tpot_p50_s"] == pytest.approx(0.05)
    # The TTFT split at the response's headers: the API server's 30 ms, the engine's 70 ms.
    assert stats["frontend_p50_s"] == pytest.approx(0.03) and stats["engine_ttft_p50_s"] == pytest.approx(0.07)
    assert stats["prefix_hit_rate"] == pytest.approx(0.5)
    with pytest.raises(BenchmarkError, match="at least 6 runs"):
        step_cost_fit([MeasuredLevel.from_samples(1, samples)])


def test_bench_fidelity_refuses_what_it_cannot_measure_with_a_clear_error():
    from django.core.management.base import CommandError

    from benchmarks.serving import fidelity
    from simulator.process import free_port

    quiet = {"quick": True, "progress": lambda _m: None}
    with pytest.raises(CommandError, match="size= takes smoke, quick, full"):
        fidelity.run(**quiet, size="huge")
    with pytest.raises(CommandError, match="repeats="):
        fidelity.run(**quiet, repeats="three")
    with pytest.raises(CommandError, match="is not a vLLM server to measure: cannot reach"):
        fidelity.run(**quiet, url=f"http://127.0.0.1:{free_port()}")


def test_the_engine_processes_get_their_own_cores_and_the_api_server_and_client_the_rest():
    """``bench fidelity``'s layout on a process group shaped like vLLM's: the API server leads it, the engine core
    names itself ``VLLM::EngineCore``."""
    child = "import time; open('/proc/self/comm', 'w').write('VLLM::EngineCore'); time.sleep(60)"
    code = (
        "import subprocess, sys, time; open('/proc/self/comm', 'w').write('api_server'); "
        f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    )
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    own = os.sched_getaffinity(0)
    cpus = sorted(own)
    try:
        deadline, engine = time.monotonic() + 10, None
        while engine is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
            names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in group_pids(leader.pid)}
            engine = next((pid for pid, name in names.items() if name.startswith("VLLM::")), None)
        if len(cpus) < 2:  # no core would be left for the API server: nothing changes
            assert pin_engine(leader.pid, 1) is None and os.sched_getaffinity(engine) == own
            return
        assert pin_engine(leader.pid, 1) == {"engine": cpus[:1], "api_server_and_client": cpus[1:]}
        assert os.sched_getaffinity(engine) == {cpus[0]}
        assert os.sched_getaffinity(leader.pid) == set(cpus[1:]) == os.sched_getaffinity(0)
        assert pin_engine(leader.pid, len(cpus)) is None  # no core left for the API server: nothing changes
        assert os.sched_getaffinity(engine) == {cpus[0]}
    finally:
        os.sched_setaffinity(0, own)
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_a_saved_run_replays_to_the_same_figures_and_a_bad_capture_is_refused(tmp_path):
    """``--opt save=`` keeps one repeat's measurements (here the simulator at a known profile stands in for the
    engine); ``--opt replay=`` fits and predicts from them again, without an engine, to the very same figures."""
    from django.core.management.base import CommandError

    from benchmarks.serving.fidelity import capture

    quiet = lambda _m: None  # noqa: E731
    rep = fidelity._measure(SimulatedEngine(), size="smoke", repeat=0, opts={}, pgid=None, progress=quiet)
    assert len(rep.points) == len(POINTS["smoke"]) and all(p.again for p in rep.points) and rep.probes
    live_runs = {p: [] for p in POINTS["smoke"]}
    base = get_profile(fidelity.BASE_PROFILE)
    live = fidelity._evaluate(base, rep, live_runs, size="smoke", client_gap_s=GAP_S, opts={}, progress=quiet)
    saved = tmp_path / "run.json"
    meta = {"real_vllm_version": "sim", "size": "smoke", "model": TRUTH.model_name, "model_path": ""}
    saved.write_text(capture.dump([rep], meta=meta))

    replayed = fidelity.run(quick=True, progress=quiet, replay=str(saved), client_gap_s=str(GAP_S))
    assert replayed["replayed_from"] == str(saved) and replayed["real_vllm_version"] == "sim"
    assert replayed["calibration"]["profile"] == live["profile"]
    expected = [fidelity._point_row(p, r) for p, r in live_runs.items()]
    assert [row["predicted"] for row in replayed["points"]] == [row["predicted"] for row in expected]
    assert [row["measured"] for row in replayed["points"]] == [row["measured"] for row in expected]
    assert replayed["engine_again_err"] and replayed["contract_divergences"] is None
    # Beside each mean, the 90th percentile of the points' |errors| (nearest rank), and every point's own error.
    for metric, key in fidelity._KEYS.items():
        errors = [abs(e) for e in replayed["point_errors"][metric].values()]
        assert replayed[f"{key}_p90"] == (round(sorted(errors)[-1], 4) if errors else None)  # two points: the worst
        assert replayed[key] is None or replayed[key] <= replayed[f"{key}_p90"]
    # Measured on a known profile, the replayed fit predicts it closely (the engine's own noise is absent).
    assert replayed["fidelity.throughput_err"] < 0.1 and replayed["fidelity.tpot_p50_err"] < 0.1
    assert (replayed["evaluation_points"], replayed["api_model"]) == ("training", fidelity.DEFAULT_API)
    # Without the sweep's runs at 1 stream: calibrated on the others only; without those at 4, too few are left.
    dropped = fidelity.run(quick=True, progress=quiet, replay=str(saved), client_gap_s=str(GAP_S), drop_level="1")
    assert dropped["calibration"]["runs"] == sum(1 for point, _, _ in rep.runs if point.concurrency != 1) > 0
    assert dropped["calibration"]["runs"] < replayed["calibration"]["runs"]
    with pytest.raises(CommandError, match="drop_level=4 leaves too little to calibrate"):
        fidelity.run(quick=True, progress=quiet, replay=str(saved), drop_level="4")

    doc = json.loads(saved.read_text())
    doc["repeats"][0]["points"][0]["samples"][0][0] = "soon"  # a start time that is not a number
    bad = {
        "missing.json": None,
        "text.json": "not json",
        "other.json": json.dumps({"format": "something-else"}),
        "sample.json": json.dumps(doc),
        "empty.json": json.dumps({**json.loads(saved.read_text()), "repeats": []}),
        "short.json": saved.read_text().replace('"requests": ', '"requests": 1', 1),  # 6 → 16 requests
    }
    for name, text in bad.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    for name, message in {
        "missing.json": "cannot read",
        "text.json": "not JSON",
        "other.json": "not a bench fidelity capture",
        "sample.json": "must be numbers",
        "empty.json": "no repeat",
        "short.json": "samples for a load point of",
    }.items():
        with pytest.raises(CommandError, match=message):
            fidelity.run(quick=True, progress=quiet, replay=str(tmp_path / name))


@pytest.mark.parametrize("size", list(CALIBRATION))
def test_the_held_out_points_are_off_the_calibration_grid(size):
    """No held-out point repeats a prompt, answer or prefix length the sweep or the probes ran, nor a sweep level's
    concurrency: the fit never saw a near-duplicate of what it is judged on."""
    assert fidelity.off_grid_problems(size) == []
    touching = LoadPoint(CALIBRATION[size]["fit_shapes"][0], CALIBRATION[size]["levels"][-1], 8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(POINTS, size, (touching,))
        problems = fidelity.off_grid_problems(size)
    assert any("prompt length" in p for p in problems) and any("calibration level" in p for p in problems)


@pytest.mark.parametrize("size", list(CALIBRATION))
def test_held_out_points_are_drawn_off_the_grid_per_seed_inside_the_training_envelope(size):
    """``--held-out`` measures points drawn from the protocol's held-out seeds: none is a training point or touches
    the calibration grid, each seed's draw is its own (dropping a seed leaves the others' points as they were), and
    every point stays where the sweep's KV held its runs."""
    seeds = protocol.seeds_for("fidelity", held_out=True)
    points = fidelity.held_out_points(size, seeds)
    assert len(points) == len(set(points)) >= 1 and fidelity.off_grid_problems(size, points) == []
    assert not set(points) & set(POINTS[size])
    assert fidelity.held_out_points(size, seeds) == points  # the same seeds, the same points
    used = fidelity.held_out_seeds_used(size, seeds)
    per_seed = len(points) // len(used)
    for i, seed in enumerate(used):  # each seed's points alone, as when it is drawn with no other
        assert fidelity.held_out_points(size, (seed,))[:per_seed] == points[i * per_seed : (i + 1) * per_seed]
    for p in points:
        own = p.shape.input_tokens - p.shape.shared_prefix_tokens
        assert 3 <= p.concurrency <= 24 and 24 <= p.shape.output_tokens <= 224
        assert 64 <= p.shape.input_tokens <= 2048 if not p.shape.shared_prefix_tokens else 128 <= own <= 640
        assert p.concurrency * (p.shape.input_tokens + p.shape.output_tokens) <= 32_768 and p.requests >= 36


def test_a_capture_of_held_out_points_replays_only_as_a_logged_look(tmp_path):
    """A held-out run's saved measurements are held-out data: a plain replay (a diagnosis nobody logs) is refused,
    and ``--held-out`` replays no training capture."""
    from benchmarks.serving.fidelity import capture

    point = fidelity.held_out_points("smoke", protocol.seeds_for("fidelity", held_out=True))[0]
    samples = [Sample(0.0, 1.0, 0.1, point.shape.input_tokens, 0, point.shape.output_tokens)] * point.requests
    rep = capture.RepeatCapture([(point, "r0", samples)], None, sweep_fit={}, cpu={})
    rep.points.append(capture.PointCapture(point, "r", samples, None, {}))
    for kind in ("held_out", "training"):
        (tmp_path / f"{kind}.json").write_text(capture.dump([rep], meta={"size": "smoke", "evaluation_points": kind}))
    with pytest.raises(CommandError, match="holds held-out points: replay it with --held-out"):
        fidelity.run(quick=True, progress=lambda *a: None, replay=str(tmp_path / "held_out.json"))
    with pytest.raises(CommandError, match="replays a capture of held-out points only"):
        fidelity.run(quick=True, progress=lambda *a: None, held_out=True, replay=str(tmp_path / "training.json"))


def test_the_merging_api_server_sends_fewer_larger_events_when_busy():
    """``load._simulate_merging``: with a stream's cost split into processing a step's output and sending its event,
    an idle API server streams as the FIFO with the same total cost does, while one with more streams than it can
    serve a step merges their tokens into fewer events and keeps up with the engine, where the FIFO falls behind by
    a token a stream a step (vLLM's RequestOutputCollector)."""
    fifo = ApiServerCost(per_request_s=0.002, per_prompt_token_s=4e-6, per_token_s=3e-4)
    merging = ApiServerCost(per_request_s=0.002, per_prompt_token_s=4e-6, per_token_s=5e-5, per_event_s=2.5e-4)
    # A step (2.5 ms at 24 streams) shorter than 24 streams' events; prefill quick enough not to be the limit.
    fast = TRUTH.with_options(
        decode_t0_s=0.002, decode_per_seq_s=2e-5, prefill_overhead_s=0.001, prefill_tokens_per_s=200_000.0
    )
    figures = {}
    for name, api in (("fifo", fifo), ("merging", merging)):
        for streams in (1, 24):
            point = LoadPoint(Shape(96, 128), streams, 4 * streams)
            samples = simulate_point(fast, point, run_id="merge", client_gap_s=GAP_S, api=api)
            assert len(samples) == point.requests
            assert all(s.start_s < s.accepted_s < s.first_token_s <= s.end_s for s in samples)
            figures[name, streams] = point_stats(point, samples)
    one_fifo, one_merging = figures["fifo", 1], figures["merging", 1]
    assert one_merging["tpot_p50_s"] == pytest.approx(one_fifo["tpot_p50_s"], rel=0.05)
    busy_fifo, busy_merging = figures["fifo", 24], figures["merging", 24]
    # 24 streams × 0.3 ms = 7.2 ms a step of tokens against a 2.5 ms step: the FIFO is the bottleneck, while the
    # merging server's streams see about one step a token (their events carry several)
    step_s = 0.002 + 24 * 2e-5
    assert busy_fifo["tpot_p50_s"] > 2.5 * step_s and busy_merging["tpot_p50_s"] < 1.5 * step_s
    assert busy_merging["throughput_tok_s"] > 1.5 * busy_fifo["throughput_tok_s"]
