"""The held-out evaluation's parts (docs/algorithms.md#autoscaling-evaluation): the day generator, the new baseline
knobs, the cron schedule, the oracle's schedule and our policy's MU forecast and decision record. All pure and fast;
the bench itself is in test_autoscale.py."""

import math

import pytest
from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.capacity import autoscale
from benchmarks.capacity.autoscale_runs import cost_at_attainment, frontier_hull
from benchmarks.capacity.baselines import HpaLikePolicy, KpaLikePolicy, ScheduledPolicy, fit_schedule
from benchmarks.capacity.oracle import OraclePolicy, in_flight_series, spike_excess
from benchmarks.capacity.traces import AZURE_CONVERSATION, DayGenerator
from benchmarks.capacity.two_axis import InfercapPolicy
from capacity.autoscaling.demand import DemandSample

PERIOD = 1800.0


def gen(**kw):
    return DayGenerator(seed=kw.pop("seed", 1), period_s=PERIOD, peak_rps=4.0, **kw)


# -- the generator ----------------------------------------------------------------------------------------------
def test_days_are_seeded_and_spikes_move_from_day_to_day():
    a, b = gen().day(3), gen().day(3)
    assert a == b and a.arrivals(seed=1) == b.arrivals(seed=1)
    assert gen(seed=2).day(3) != a
    days = [gen().day(i) for i in range(6)]
    starts = [tuple(round(s.start_s) for s in d.spikes) for d in days]
    assert len(set(starts)) == len(starts)  # no two days have their spikes at the same times
    for d in days:
        assert 1 <= len(d.spikes) <= 3
        for s in d.spikes:
            assert 2.0 <= s.height <= 20.0 and 3.0 <= s.ramp_s <= 180.0 and 30.0 <= s.duration_s <= 240.0
            assert s.ramp_s <= s.duration_s / 2


def test_a_spike_multiplies_the_rate_after_its_ramp():
    day = gen().day(0)
    spike = max(day.spikes, key=lambda s: s.height)
    top = spike.start_s + spike.ramp_s + 1
    expected = min(day.base_rps(top) * spike.height, day.spike_cap * day.level)
    assert day.rate(top) == pytest.approx(max(expected, day.base_rps(top)), rel=0.02)
    assert max(day.rate(s) for s in range(int(PERIOD))) <= day.spike_cap * day.level + 1e-9
    assert day.rate(spike.start_s - 1) < day.rate(top)


def test_held_out_days_differ_from_history_and_the_holiday_differs_in_shape():
    history = [gen().day(i) for i in range(3)]
    weekday, holiday = gen().day(3), gen().day(4, kind="holiday")
    hist_rates = [d.base_rps(PERIOD * 0.55) for d in history]
    assert weekday.base_rps(PERIOD * 0.55) != pytest.approx(hist_rates[0])  # noise and level differ
    # History's busiest hour is quiet on the holiday, and its own peak comes early.
    assert holiday.base_rps(PERIOD * 0.55) < 0.5 * min(hist_rates)
    assert holiday.base_rps(PERIOD * 0.3) > 3 * holiday.base_rps(PERIOD * 0.55)


def test_lengths_are_drawn_and_outputs_stop_before_max_tokens():
    requests = gen().day(0).arrivals(seed=1)
    outputs = sorted(o for _, _, o in requests)
    assert len(set(outputs)) > 100 and outputs[-1] <= 4096
    assert sum(o == 4096 for o in outputs) / len(outputs) < 0.01  # EOS ends nearly all of them first
    azure = gen().day(1, kind="azure").arrivals(seed=1)
    prompts = sorted(p for _, p, _ in azure)
    assert prompts[len(prompts) // 2] == pytest.approx(AZURE_CONVERSATION["prompt_median"], rel=0.1)
    azure_out = sorted(o for _, _, o in azure)
    assert azure_out[len(azure_out) // 2] == pytest.approx(AZURE_CONVERSATION["output_median"], rel=0.15)


def test_the_azure_day_is_burstier_than_poisson():
    def cv_of_counts(day):
        counts = {}
        for t, _, _ in day.arrivals(seed=1):
            counts[int(t)] = counts.get(int(t), 0) + 1
        # a flat-ish stretch: the second half-hour's busiest quarter, per-second counts over the local mean
        window = [counts.get(s, 0) / max(day.rate(s), 1e-9) for s in range(int(0.5 * PERIOD), int(0.6 * PERIOD))]
        mean = sum(window) / len(window)
        return math.sqrt(sum((w - mean) ** 2 for w in window) / len(window)) / mean

    g = DayGenerator(seed=1, period_s=PERIOD, peak_rps=40.0, spikes_per_day=(1, 1), spike_height=(2.0, 2.0))
    assert cv_of_counts(g.day(0, kind="azure")) > 1.3 * cv_of_counts(g.day(0))


# -- baselines --------------------------------------------------------------------------------------------------
def feed(policy, values, start=0.0, queued=0.0):
    for i, v in enumerate(values):
        policy.observe(DemandSample(t=start + i, in_flight=v, queued=queued))
    return start + len(values) - 1


def test_metric_without_the_queue_ignores_the_proxy_backlog():
    with_queue = KpaLikePolicy(target_concurrency=10, target_utilization=1.0, min_replicas=1, max_replicas=50)
    without = KpaLikePolicy(
        target_concurrency=10, target_utilization=1.0, min_replicas=1, max_replicas=50, metric="in_flight"
    )
    for p in (with_queue, without):
        feed(p, [20.0] * 70, queued=100.0)
    assert with_queue.desired(now=69, ready=2, starting=0) == 12
    assert without.desired(now=69, ready=2, starting=0) == 2
    with pytest.raises(ValueError):
        HpaLikePolicy(target_per_replica=1, min_replicas=1, max_replicas=2, metric="cpu")


def test_hpa_scale_down_policy_removes_at_most_its_percent_per_period():
    hpa = HpaLikePolicy(
        target_per_replica=10, min_replicas=1, max_replicas=50, stabilization_s=0.0,
        scale_down_percent=20.0, scale_down_period_s=60.0,
    )  # fmt: skip
    now = feed(hpa, [100.0] * 30)
    assert hpa.desired(now=now, ready=10, starting=0) == 10
    now = feed(hpa, [10.0] * 30, start=now + 1)
    assert hpa.desired(now=now, ready=10, starting=0) == 8  # 20% of 10, not straight to 1
    assert hpa.desired(now=now + 15, ready=8, starting=0) == 8  # the period still remembers 10 replicas


def test_the_cron_schedule_takes_the_median_day_so_a_spike_seen_once_is_not_scheduled():
    quiet = [float(t) for t in range(0, 3600, 2)]  # 0.5 req/s all day
    spiky = quiet + [1800.0 + i / 20 for i in range(1200)]  # + 20 req/s for a minute at 1800 s
    kw = {"period_s": 3600.0, "slots": 4, "seconds_per_request": 10.0, "per_replica": 5.0}
    assert fit_schedule([quiet, spiky, quiet], **kw) == [1, 1, 1, 1]
    assert fit_schedule([quiet, spiky, quiet], statistic="max", **kw)[2] == math.ceil(20.5 * 10 / 5)
    cron = ScheduledPolicy(schedule=[1, 1, 5, 1], period_s=3600.0, lead_s=120.0, max_replicas=60)
    assert cron.desired(now=1600.0, ready=1, starting=0) == 1
    assert cron.desired(now=1790.0, ready=1, starting=0) == 5  # raised one lead before its slot


# -- the oracle -------------------------------------------------------------------------------------------------
def test_the_oracle_provisions_one_cold_start_before_the_load_arrives():
    requests = [(1000.0 + i * 0.01, 500, 300) for i in range(4000)]  # 100 req/s for 40 s
    in_flight = in_flight_series(requests, seconds_in_flight=lambda p, o: 10.0, end_s=2000.0)
    assert max(in_flight) == pytest.approx(1000, abs=2)
    oracle = OraclePolicy(in_flight=in_flight, concurrency=100, utilization=1.0, lookahead_s=120.0, max_replicas=60)
    assert oracle.desired(now=860.0, ready=1, starting=0) == 1
    assert oracle.desired(now=890.0, ready=1, starting=0) == 10  # ready by 1000 s even after a 120 s boot
    assert oracle.desired(now=1100.0, ready=10, starting=0) == 1  # nothing ahead: let them go


def test_the_spike_blind_oracle_foresees_the_day_but_only_sees_a_spike_when_it_comes():
    day = DayGenerator(seed=3, period_s=3600.0, peak_rps=4.0, spikes_per_day=(1, 1)).day(0)
    spike = day.spikes[0]
    requests = day.arrivals(seed=1)
    share = lambda t: day.base_rps(t) / day.rate(t)  # noqa: E731
    base, excess = spike_excess(requests, base_share=share, seed="d")
    assert sorted(base + excess) == sorted(requests)  # a split, nothing lost or doubled
    assert spike_excess(requests, base_share=share, seed="d") == (base, excess)  # seeded
    assert excess and all(spike.start_s - 1 <= t < spike.start_s + spike.duration_s + 1 for t, _, _ in excess)
    in_spike = [r for r in requests if spike.start_s <= r[0] < spike.start_s + spike.duration_s]
    expected = sum(1 - share(t) for t, _, _ in in_spike) / len(in_spike)
    assert sum(r in excess for r in in_spike) / len(in_spike) == pytest.approx(expected, abs=0.05)
    assert expected > 0.3  # the spike is most of its window's load

    foreseen = [100] * 2000
    present = foreseen[:1000] + [1000] * 1000  # a spike at 1000 s that nothing foresaw
    blind = OraclePolicy(
        in_flight=foreseen, present=present, spare=2, concurrency=100, utilization=1.0, lookahead_s=120.0,
        max_replicas=60,
    )  # fmt: skip
    assert blind.desired(now=990.0, ready=3, starting=0) == 1 + 2  # the day's need and its spare, nothing ahead
    assert blind.desired(now=1000.0, ready=3, starting=0) == 10 + 2  # the spike from the moment it is there


# -- our policy: MU forecast, missing and misleading history, the decision record ------------------------------
def ours(**kw):
    args = {
        "min_replicas": 1, "max_replicas": 60, "concurrency_limit": 64, "concurrency_min": 8, "concurrency_max": 256,
        "ttft_slo_ms": 2000, "tpot_slo_ms": 100, "predictive_period_s": PERIOD, "predictive_lead_s": 120.0,
        "seconds_per_request": lambda c: 10.0, "reference_request_mu": 3.0,
    }  # fmt: skip
    return InfercapPolicy(**{**args, **kw})


def remember_days(policy, days, rate_mu_at):
    for d in range(days, 0, -1):
        for s in range(int(PERIOD)):
            policy.remember(t=s - d * PERIOD, mu=rate_mu_at(s))


def run_today(policy, rate_mu_at, until):
    for s in range(int(until) + 1):
        mu = rate_mu_at(s)
        policy.observe(DemandSample(t=s, in_flight_mu=mu * 10.0, arrivals_mu=mu, arrivals=mu / 3.0))


def busy_at_noon(s):
    return 60.0 if 900 <= s < 1200 else 3.0  # MU per second: a busy stretch every day


def test_the_mu_floor_gets_ahead_of_a_peak_history_repeats_and_says_why():
    policy = ours()
    remember_days(policy, 3, busy_at_noon)
    run_today(policy, lambda s: 3.0, 820)
    desired = policy.desired(now=820.0, ready=1, starting=0)
    # 60 MU/s × 10 s in flight / (64 × 3 MU × 0.7) = 4.5 → 5 replicas, before today's demand shows anything
    assert desired == 5
    decision = policy.decisions[-1]
    assert "predictive floor 5" in decision.reason and "median of 3 history day" in decision.reason
    assert decision.inputs["predictive"]["source"] == "seasonal_mu_s"


def test_a_spike_on_one_history_day_is_not_forecast():
    policy = ours()
    for d, spiky in ((3, False), (2, True), (1, False)):
        for s in range(int(PERIOD)):
            policy.remember(t=s - d * PERIOD, mu=60.0 if spiky and 900 <= s < 1000 else 3.0)
    run_today(policy, lambda s: 3.0, 820)
    assert policy.desired(now=820.0, ready=1, starting=0) == 1


def test_a_new_endpoint_without_history_scales_reactively_and_says_so():
    policy = ours()
    run_today(policy, lambda s: 3.0 if s < 600 else 60.0, 640)
    desired = policy.desired(now=640.0, ready=1, starting=0)
    assert desired > 1
    decision = policy.decisions[-1]
    assert decision.inputs["predictive"]["days"] == 0
    assert "no history (new endpoint)" in decision.reason


def test_a_holiday_unlike_history_lowers_the_floor_with_todays_level():
    usual, holiday = ours(), ours()
    remember_days(usual, 3, busy_at_noon)
    remember_days(holiday, 3, lambda s: 4 * busy_at_noon(s))  # history ran at four times today's level
    run_today(usual, lambda s: 3.0, 820)
    run_today(holiday, lambda s: 3.0, 820)
    usual.desired(now=820.0, ready=1, starting=0)
    holiday.desired(now=820.0, ready=1, starting=0)
    details = holiday.decisions[-1].inputs["predictive"]
    assert details["level_ratio"] == pytest.approx(0.25)
    assert "today differs from history" in details["why"]
    # history alone would ask for 4× the usual day's floor; today's level brings it back to the usual one
    assert details["floor"] == usual.decisions[-1].inputs["predictive"]["floor"] == 5


def test_the_rate_signal_ignores_a_queue_the_fleet_will_have_drained():
    by_rate, by_queue = ours(predictive_period_s=None), ours(predictive_period_s=None, demand_signal="queue")
    for p in (by_rate, by_queue):
        for s in range(120):
            p.observe(DemandSample(t=s, in_flight_mu=30.0, queued_mu=900.0, arrivals_mu=3.0, arrivals=1.0))
    assert by_queue.desired(now=119.0, ready=1, starting=0) > by_rate.desired(now=119.0, ready=1, starting=0) == 1


def test_the_rate_signal_sizes_a_rising_rate_at_the_time_in_flight_of_the_batch_it_brings():
    """Measured in a quiet hour, a request's time in flight is the small batch's; a spike brings the target batch,
    where decode steps are slower: the demand is sized at that batch's time in flight, not the quiet hour's."""
    latency = lambda c: 10.0 + 0.5 * c  # noqa: E731  seconds in flight at c sequences a replica
    policy = ours(predictive_period_s=None, seconds_per_request=latency, concurrency_limit=64)
    quiet = {"in_flight": 10.0, "in_flight_mu": 30.0, "arrivals": 1.0, "arrivals_mu": 3.0}  # 10 s in flight
    for s in range(300):
        policy.observe(DemandSample(t=s, **quiet))
        if s % 5 == 4:
            policy.desired(now=s, ready=2, starting=0)  # two replicas ready throughout
    assert policy.in_flight_s == pytest.approx(10.0)  # 5 a replica: no batch is coming that did not run
    for s in range(300, 310):  # ten times the rate
        policy.observe(DemandSample(t=s, in_flight=10.0, in_flight_mu=30.0, arrivals=10.0, arrivals_mu=30.0))
    # Little's law over the 5-min window (301 samples, both ends in; the new arrivals are not in flight yet).
    measured = (301 * 30.0) / (291 * 3.0 + 10 * 30.0)
    # The rate would put 10 × measured / 2 sequences on each ready replica (under the target 64 × 0.7 = 44.8), where
    # a request stays latency(that) / latency(5) times as long as it did at the 5 a replica it was measured at.
    coming = 10 * measured / 2
    assert 5 < coming < 44.8
    assert policy.in_flight_s == pytest.approx(measured * latency(coming) / latency(5), rel=1e-6)
    assert policy.in_flight_s > 2 * measured
    # so the two replicas become five (180 in flight), where the quiet hour's time in flight (77) would have kept two
    assert math.ceil(10 * measured / 44.8) == 2
    assert policy.desired(now=310.0, ready=2, starting=0) == math.ceil(10 * policy.in_flight_s / 44.8) == 5


# -- the time scale, the protocol, equal attainment --------------------------------------------------------------
def test_a_compressed_day_is_the_real_day_with_everything_in_it_shorter():
    real = DayGenerator(seed=4, period_s=86_400.0, peak_rps=4.0).day(2)
    short = DayGenerator(seed=4, period_s=10_800.0, peak_rps=4.0, time_scale=8.0).day(2)
    assert len(real.spikes) == len(short.spikes) and real.spikes
    for a, b in zip(real.spikes, short.spikes, strict=True):
        assert b.height == a.height
        assert b.duration_s == pytest.approx(a.duration_s / 8) and b.ramp_s == pytest.approx(a.ramp_s / 8)
        # the same place in the day, so a spike keeps its share of it
        assert (b.start_s + b.duration_s / 2) / 10_800 == pytest.approx((a.start_s + a.duration_s / 2) / 86_400)
    assert short.noise_bucket_s == pytest.approx(real.noise_bucket_s / 8) and short.noise == real.noise


def test_the_bench_takes_its_seeds_from_the_protocol_only():
    seeds = protocol.SEEDS["autoscale"]
    o = autoscale.options(True, {})
    assert o["period_s"] == 86_400.0 / o["time_scale"] and o["time_scale"] == 8.0
    assert autoscale.trace_seeds(True, o, held_out=False) == seeds.training[:1]
    assert autoscale.trace_seeds(False, autoscale.options(False, {}), held_out=False) == seeds.training
    assert autoscale.trace_seeds(True, o, held_out=True) == seeds.held_out
    with pytest.raises(CommandError):
        autoscale.trace_seeds(True, autoscale.options(True, {"seeds": str(seeds.held_out[0])}), held_out=False)
    with pytest.raises(CommandError):
        autoscale.trace_seeds(True, autoscale.options(True, {"seeds": "1"}), held_out=True)
    for back_door in ({"trace_seed": str(seeds.held_out[0])}, {"period_s": "3600"}):
        with pytest.raises(CommandError):
            autoscale.run(quick=True, progress=lambda _: None, **back_door)
    # bench economics' spot days shorten the day alone when they give its length without a time scale
    assert autoscale.options(True, {"period_s": "7200"})["time_scale"] == 1.0


def point(gpu_hours, attainment, knobs=""):
    return {"gpu_hours": gpu_hours, "slo_attainment": attainment, "knobs": knobs or f"{gpu_hours}"}


def test_equal_attainment_interpolates_the_policys_own_frontier():
    frontier = [point(10, 0.80), point(16, 0.90), point(30, 0.999), point(12, 0.70), point(20, 0.86)]
    # dominated (12 at 0.70) and under the chord of its neighbours (20 at 0.86) are off the hull
    assert [p["gpu_hours"] for p in frontier_hull(frontier)] == [10, 16, 30]
    at = cost_at_attainment(frontier, 0.86)
    assert at["reached"] and at["gpu_hours"] == pytest.approx(10 + 0.6 * 6) and not at["cheapest_point_above"]
    assert [p["gpu_hours"] for p in at["between"]] == [10, 16]
    # not reached: no extrapolation
    missed = cost_at_attainment(frontier, 0.9995)
    assert not missed["reached"] and missed["gpu_hours"] is None and missed["best_point"]["gpu_hours"] == 30
    # below the cheapest point: that point, flagged
    below = cost_at_attainment(frontier, 0.5)
    assert below["reached"] and below["gpu_hours"] == 10 and below["cheapest_point_above"]


def test_one_day_mode_runs_infercap_and_the_oracle_on_one_training_day_and_says_where_it_missed():
    lines = []
    small = {"time_scale": "72", "peak_rps": "1", "history_days": "2", "test_days": "weekday", "jobs": "1"}
    figures = autoscale.run(quick=False, progress=lines.append, day="weekday-2", seeds="2", **small)
    day = figures["one_day"]
    assert (day["seed"], day["day"], day["day_length_s"]) == (2, "weekday-2", 1200.0)
    ours, oracle = day["policies"]["infercap"], day["policies"]["oracle"]
    assert ours["spec"] == "infercap(target_utilization=0.75)" and oracle["spec"].startswith("oracle(")
    assert day["gpu_hours_vs_oracle"] == pytest.approx(ours["gpu_hours"] / oracle["gpu_hours"], abs=1e-3)
    hours = ours["misses_by_hour"]
    assert len(hours) == 24 and sum(h["requests"] for h in hours) == day["requests"]
    missed = sum(h["miss"] for h in hours)
    assert missed == round((1 - ours["slo_attainment"]) * day["requests"])
    assert all(h["ttft"] + h["tpot"] + h["rejected"] >= h["miss"] >= h["proxy_wait"] for h in hours)
    assert any("simulating" in line for line in lines)
    with pytest.raises(CommandError):  # training seeds only, one at a time, a day the seed has
        autoscale.run(quick=False, progress=lines.append, day="weekday-2", seeds="2001", **small)
    with pytest.raises(CommandError):
        autoscale.run(quick=False, progress=lines.append, day="weekday-9", seeds="2", **small)
    with pytest.raises(CommandError):  # held out: every held-out seed, knobs fixed beforehand
        autoscale.run(quick=False, progress=lines.append, day="weekday-2", held_out=True, seeds="2", **small)
    # The onset floor can be turned off for a comparison; its label says so
    off = autoscale.run(quick=False, progress=lines.append, day="weekday-2", seeds="2", onset="off",
                        policies="infercap", **small)["one_day"]  # fmt: skip
    assert list(off["policies"]) == ["infercap"] and "onset=False" in off["policies"]["infercap"]["spec"]


def test_one_day_held_out_mode_runs_each_held_out_seeds_day_and_compares_at_equal_attainment(monkeypatch):
    # Stand-in held-out seeds (training ones), so the test looks at no held-out day
    monkeypatch.setitem(protocol.SEEDS, "autoscale", protocol.Seeds(training=(1, 2, 3, 4, 5, 6), held_out=(4, 5)))
    lines = []
    small = {"time_scale": "72", "peak_rps": "1", "history_days": "2", "test_days": "weekday", "jobs": "1"}
    figures = autoscale.run(
        quick=False, progress=lines.append, day="weekday-2", held_out=True, frontier="1",
        policies="infercap,oracle,static,hpa_tuned", **small,
    )  # fmt: skip
    block = figures["held_out"]
    assert block["seeds"] == [4, 5] and block["days"] == ["4:weekday-2", "5:weekday-2"]
    assert block["day_length_s"] == 1200.0 and "interpolated" in block["equal_attainment_method"]
    ours, oracle, static = (block["policies"][n] for n in ("infercap", "oracle", "static"))
    # Summed over the seeds' days: each row's requests are both days', and per seed rows add up to it
    assert ours["requests"] == sum(r["requests"] for r in (block["per_seed"]["infercap"][s] for s in ("4", "5")))
    assert block["infercap_vs_oracle"] == pytest.approx(ours["gpu_hours"] / oracle["gpu_hours"], abs=1e-3)
    # Static is sized on history days and its frontier sweeps the size; the baselines not asked for are said
    assert static["knobs"] == f"static(replicas={block['static_replicas']})"
    assert static["knobs"] in [p["knobs"] for p in block["frontier"]["static"]]
    # The baseline's target moved both ways (0.4-0.7 around its tuned 0.5), ours once
    assert len(block["frontier"]["hpa_tuned"]) == 4 and len(block["frontier"]["infercap"]) == 2
    assert set(block["not_run"]) == {"kpa_tuned", "scheduled", "infercap_reactive"}
    assert set(block["at_equal_slo"]) == {"hpa_tuned", "static"}
    assert set(block["goals"]) >= {"slo_ge_99pct", "le_1_5x_oracle", "no_flaps"}
    assert block["frontier_skipped"] == []
    # A wall budget spent: the rows still run, the frontier points beyond them are left out and named
    cut = autoscale.run(
        quick=False, progress=lines.append, day="weekday-2", held_out=True, frontier="1", budget_s="1e-9",
        policies="infercap,static", **small,
    )["held_out"]  # fmt: skip
    assert set(cut["policies"]) == {"infercap", "static"} and cut["frontier_skipped"]
    assert all(len(points) == 1 for points in cut["frontier"].values())
    with pytest.raises(CommandError):
        autoscale.run(quick=False, progress=lines.append, day="weekday-2", held_out=True, policies="nope", **small)
