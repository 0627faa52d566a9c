"""The horizontal policy's rules on hand-built demand series."""

import json

import pytest

from capacity.autoscaling.demand import DemandSample, sum_fresh_reports, sum_process_reports
from capacity.autoscaling.horizontal import HorizontalConfig, HorizontalInputs, decide, mu_capacity_per_replica


def series(values, *, end=300.0):
    """One sample per second ending at ``end``, oldest first; values[-1] is the newest."""
    n = len(values)
    return [DemandSample(t=end - (n - 1 - i), in_flight=v) for i, v in enumerate(values)]


def inputs(samples, **kw):
    base = dict(
        now=300.0, samples=samples, ready=1, starting=0, min_replicas=1, max_replicas=20, target_concurrency=10
    )
    base.update(kw)
    return HorizontalInputs(**base)


def test_scale_up_uses_last_20s_and_target_utilization():
    # Given 42 requests in flight for 20 s against 10 per replica at 0.7 utilization (7 per replica)
    decision = decide(inputs(series([42] * 20), ready=4))
    # Then it asks for ceil(42 / 7) = 6 replicas
    assert (decision.current, decision.desired) == (4, 6)
    assert decision.reason.startswith("scale up")


def test_scale_up_step_is_bounded():
    # From 2 replicas a demand for 20 is reached in bounded steps: +max(2×, +4) per decision.
    decision = decide(inputs(series([140] * 20), ready=2))
    assert decision.desired == 6
    assert "step bounded" in decision.reason
    decision = decide(inputs(series([140] * 20), ready=10))
    assert decision.desired == 20


def test_old_spike_outside_up_window_does_not_scale_up():
    samples = series([100] * 10 + [7] * 40)  # the spike ended 40 s ago
    assert decide(inputs(samples, ready=1)).desired == 1


def test_starting_replicas_count_as_capacity():
    # Given demand for 6 replicas and 2 ready + 4 starting, no cascading scale-up while they boot
    decision = decide(inputs(series([42] * 20), ready=2, starting=4))
    assert decision.desired == 6
    assert "starting replicas cover" in decision.reason


def test_tolerance_band_holds():
    # 7.5 per replica of 7: ratio 1.07 is inside the 10% band → hold; 8 per replica (1.14) scales up.
    assert decide(inputs(series([30] * 20), ready=4)).desired == 4
    assert decide(inputs(series([32] * 20), ready=4)).desired == 5
    assert decide(inputs(series([32] * 20), ready=4), HorizontalConfig(tolerance=0.2)).desired == 4


def test_scale_down_on_five_minute_max_one_step_at_a_time():
    # Demand fell 2 minutes ago: the 5-minute max still holds capacity.
    samples = series([70] * 180 + [7] * 120)
    assert decide(inputs(samples, ready=10)).desired == 10
    # Once the 5-minute window holds only the low demand, it steps down by at most 20% (here 2 of 10).
    samples = series([7] * 300)
    decision = decide(inputs(samples, ready=10))
    assert (decision.current, decision.desired) == (10, 8)
    assert decision.reason.startswith("scale down")


def test_no_scale_down_within_delay_of_scale_up_nor_during_cooldown():
    samples = series([7] * 300)
    assert decide(inputs(samples, ready=5, last_scale_up_at=300.0 - 120)).desired == 5
    assert decide(inputs(samples, ready=5, last_scale_up_at=300.0 - 301)).desired == 4
    assert decide(inputs(samples, ready=5, last_scale_down_at=300.0 - 10)).desired == 5


def test_floors_min_replicas_provisioned_concurrency_and_prediction():
    quiet = series([0] * 300)
    assert decide(inputs(quiet, ready=1, min_replicas=3)).desired == 3
    # provisioned concurrency 45 at 10 per replica → 5 replicas even with no traffic
    decision = decide(inputs(quiet, ready=1, provisioned_concurrency=45))
    assert decision.desired == 5 and "provisioned_concurrency" in decision.reason
    decision = decide(inputs(quiet, ready=2, predicted_floor=6))
    assert decision.desired == 6 and "predictive_floor" in decision.reason
    # a scale-down never goes below the floor
    assert decide(inputs(quiet, ready=4, min_replicas=3)).desired == 3


def test_max_replicas_caps_everything():
    assert decide(inputs(series([1000] * 20), ready=18, max_replicas=20)).desired == 20
    assert decide(inputs(series([0] * 300), ready=1, min_replicas=5, max_replicas=3)).desired == 3
    assert decide(inputs(series([0] * 300), ready=25, max_replicas=20)).desired == 20


def test_scale_to_zero_only_when_enabled_and_idle():
    idle = series([0] * 300)
    assert decide(inputs(idle, ready=1, min_replicas=0)).desired == 1
    assert decide(inputs(idle, ready=1, min_replicas=0, scale_to_zero=True)).desired == 0
    # any demand in the 5-minute window keeps one replica
    assert decide(inputs(series([0] * 299 + [1]), ready=1, min_replicas=0, scale_to_zero=True)).desired == 1
    # from zero, a queued request brings the first replica at once
    woke = decide(
        inputs(
            series([0] * 299, end=299) + [DemandSample(t=300, queued=1)], ready=0, min_replicas=0, scale_to_zero=True
        )
    )
    assert woke.desired == 1


def mu_series(requests, mu, *, seconds=20, end=300.0):
    return [DemandSample(t=end - (seconds - 1 - i), in_flight=requests, in_flight_mu=mu) for i in range(seconds)]


def test_model_units_are_the_signal_when_known():
    # 10 requests but 50 MU in flight against 10 MU per replica at 0.7 → MU decides: ceil(50 / 7) = 8
    decision = decide(inputs(mu_series(10, 50), ready=4, mu_capacity_per_replica=10))
    assert decision.desired == 8
    assert decision.inputs["signal"] == "mu"
    # the request count is recorded alongside: 10 / (10 · 0.7) ≈ 1.43 replicas
    assert decision.inputs["up_need_requests"] == pytest.approx(10 / 7, abs=1e-3)
    assert decision.inputs["up_need_mu"] == pytest.approx(50 / 7, abs=1e-3)


def test_many_light_requests_need_fewer_replicas_in_mu_than_in_requests():
    # 60 short requests (1 MU each) against 10 per replica = 35 MU per replica (3.5-MU reference request):
    # by count they would need ceil(60 / 7) = 9 replicas, by cost ceil(60 / 24.5) = 3.
    decision = decide(inputs(mu_series(60, 60), ready=3, mu_capacity_per_replica=35))
    assert decision.desired == 3 and decision.inputs["signal"] == "mu"
    assert decide(inputs(mu_series(60, 60), ready=3)).desired == 7  # requests only: 3 + max(2×, +4) step bound


def test_requests_decide_when_the_demand_carries_no_mu():
    # A proxy that reports no MU (or an endpoint without coefficients): the request count still scales.
    decision = decide(inputs(mu_series(42, 0), ready=4, mu_capacity_per_replica=35))
    assert decision.desired == 6 and decision.inputs["signal"] == "requests"


def test_scale_down_window_is_in_mu_too():
    # 5 minutes of 70 MU then quiet: the 5-minute MU peak (70 / (35 · 0.7) → 3) holds 3 of 3 replicas.
    samples = [DemandSample(t=1 + i, in_flight=20, in_flight_mu=70 if i < 200 else 3.5) for i in range(300)]
    assert decide(inputs(samples, ready=3, mu_capacity_per_replica=35)).desired == 3
    later = [DemandSample(t=1 + i, in_flight=20, in_flight_mu=3.5) for i in range(300)]
    # 20 requests would hold ceil(20 / 7) = 3, but 3.5 MU needs one: a bounded step down (20% of 3 → 1)
    assert decide(inputs(later, ready=3, mu_capacity_per_replica=35)).desired == 2


def test_mu_capacity_is_target_concurrency_in_reference_requests():
    assert mu_capacity_per_replica(64, 3.55) == pytest.approx(227.2)
    with pytest.raises(ValueError):
        mu_capacity_per_replica(0, 3.55)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError):
        HorizontalConfig(target_utilization=0)
    with pytest.raises(ValueError):
        decide(inputs(series([1]), target_concurrency=0))


def test_demand_reports_sum_only_fresh_processes():
    reports = [
        {"t": 100.0, "in_flight": 3, "queued": 1, "in_flight_mu": 2.5, "queued_mu": 0.5},
        {"t": 99.5, "in_flight": 2, "queued": 0},
        {"t": 80.0, "in_flight": 50},  # a dead proxy process
        {"t": "garbage", "in_flight": 9},
        {"t": 100.0, "in_flight": "x", "queued": 4},
    ]
    sample = sum_process_reports(reports, now=100.0, fresh_s=5.0)
    assert (sample.in_flight, sample.queued, sample.mu) == (5, 5, 3.0)


@pytest.mark.parametrize("capacity", [float("nan"), float("inf"), 0.0, -5.0])
def test_unusable_mu_capacity_falls_back_to_requests(capacity):
    # 30 requests (and some MU) in flight on 2 replicas, but the MU capacity is NaN, infinite, 0 or negative: NaN
    # crashed math.ceil, an infinite one read the demand as zero and scaled down; requests decide instead
    samples = [DemandSample(t=300.0 - i, in_flight=30, in_flight_mu=900.0) for i in range(20)]
    decision = decide(inputs(samples, ready=2, mu_capacity_per_replica=capacity))
    assert decision.inputs["signal"] == "requests" and decision.desired == 5  # ceil(30 / 7)
    assert decision.inputs["mu_capacity_per_replica"] is None
    json.dumps(decision.inputs, allow_nan=False)  # storable in a JSON column


def test_non_finite_samples_are_ignored():
    # A corrupt window entry (inf MU, NaN requests) must neither crash the decision nor be stored
    samples = series([14] * 20)
    samples[-1] = DemandSample(t=300.0, in_flight=float("nan"), in_flight_mu=float("inf"))
    decision = decide(inputs(samples, ready=1, mu_capacity_per_replica=100.0))
    assert decision.desired == 2 and decision.inputs["signal"] == "requests"  # ceil(14 / 7); no MU anywhere
    json.dumps(decision.inputs, allow_nan=False)


@pytest.mark.parametrize("reference", [float("nan"), float("inf")])
def test_mu_capacity_refuses_non_finite_reference(reference):
    with pytest.raises(ValueError):
        mu_capacity_per_replica(10, reference)


def test_no_fresh_demand_report_holds_scale_down_but_not_scale_up():
    # Five idle minutes on 4 replicas would scale down; but no proxy vouched for this tick's sample (proxies cut
    # off from Redis read as zero demand), so nothing is removed; to zero neither
    idle = series([0] * 330)
    held = decide(inputs(idle, ready=4, demand_reported=False))
    assert (held.current, held.desired) == (4, 4) and held.reason.startswith("hold: no fresh demand report")
    to_zero = decide(inputs(idle, ready=1, min_replicas=0, scale_to_zero=True, demand_reported=False))
    assert to_zero.desired == 1
    assert decide(inputs(idle, ready=4)).desired == 3  # with a report of the same idle demand it scales down
    # Demand still known (the activator's queued request) scales up
    assert decide(inputs(series([30] * 20), ready=1, demand_reported=False)).desired == 5


def test_demand_reports_with_bad_stamps_or_figures():
    now = 1000.0
    sample, fresh = sum_fresh_reports(
        [
            {"t": float("nan"), "in_flight": 7},  # NaN stamp: compared fresh forever before
            {"t": now + 3600, "in_flight": 9},  # a clock an hour ahead: also fresh forever
            {"t": now, "in_flight": "1e999", "queued": 2, "in_flight_mu": "nan", "queued_mu": -4},
            "not a dict",
        ],
        now=now,
    )
    assert fresh == 1
    assert (sample.in_flight, sample.queued, sample.in_flight_mu, sample.queued_mu) == (0.0, 2.0, 0.0, 0.0)


def test_demand_beyond_max_replicas_holds_with_that_reason():
    decision = decide(inputs(series([70] * 20), ready=4, max_replicas=4))
    assert (decision.current, decision.desired) == (4, 4)
    assert decision.reason == "hold: at max replicas (demand needs 10.00)"


def test_a_scale_down_leaves_room_for_the_batch_to_grow_on_fewer_replicas():
    # The 5-min peak needs 2.9 replicas of 4 (20.3 in flight at 7 a replica). Down to 3, each runs a larger batch,
    # requests stay in flight longer and the demand rises past 3 × 1.1: a replica would be ordered back within
    # minutes. With the default margin (15 %) it holds at 4...
    decision = decide(inputs(series([20.3] * 300), ready=4))
    assert decision.desired == 4 and decision.inputs["down_need"] == pytest.approx(2.9)
    assert decide(inputs(series([20.3] * 300), ready=4), HorizontalConfig(scale_down_margin=0.0)).desired == 3
    # ...and goes down to 3 once the peak needs 2.5 (2.5 × 1.15 = 2.875 fits 3)
    assert decide(inputs(series([17.5] * 300), ready=4)).desired == 3
    with pytest.raises(ValueError):
        HorizontalConfig(scale_down_margin=1.0)
