"""The horizontal policy's rules on hand-built demand series."""

import pytest

from capacity.autoscaling.demand import DemandSample, sum_process_reports
from capacity.autoscaling.horizontal import HorizontalConfig, HorizontalInputs, decide


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


def test_model_units_scale_when_known():
    # 10 requests but 50 MU in flight against 10 MU per replica at 0.7 → MU decides: ceil(50 / 7) = 8
    samples = [DemandSample(t=281 + i, in_flight=10, in_flight_mu=50) for i in range(20)]
    assert decide(inputs(samples, ready=4, mu_capacity_per_replica=10)).desired == 8


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
