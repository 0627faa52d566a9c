"""Baseline policies follow their published rules."""

from benchmarks.capacity.baselines import HpaLikePolicy, KpaLikePolicy
from capacity.autoscaling.demand import DemandSample


def feed(policy, values, start=0.0):
    for i, v in enumerate(values):
        policy.observe(DemandSample(t=start + i, in_flight=v))
    return start + len(values) - 1


def test_hpa_tolerance_and_scale_down_stabilization():
    hpa = HpaLikePolicy(target_per_replica=10, min_replicas=1, max_replicas=50)
    now = feed(hpa, [40.0] * 60)
    assert hpa.desired(now=now, ready=4, starting=0) == 4
    now = feed(hpa, [43.0] * 60, start=now + 1)  # ratio 1.075: inside tolerance
    assert hpa.desired(now=now, ready=4, starting=0) == 4
    now = feed(hpa, [80.0] * 60, start=now + 1)
    assert hpa.desired(now=now, ready=4, starting=0) == 8
    now = feed(hpa, [10.0] * 60, start=now + 1)
    # the demand fell, but the highest recommendation of the last 300 s wins
    assert hpa.desired(now=now, ready=8, starting=0) == 8
    now = feed(hpa, [10.0] * 310, start=now + 1)
    assert hpa.desired(now=now, ready=8, starting=0) == 1


def test_kpa_panics_on_a_spike_and_does_not_scale_down_while_panicking():
    kpa = KpaLikePolicy(target_concurrency=10, min_replicas=1, max_replicas=50)
    now = feed(kpa, [7.0] * 120)
    assert kpa.desired(now=now, ready=1, starting=0) == 1
    now = feed(kpa, [70.0] * 6, start=now + 1)  # 10× in 6 s: panic window sees it at once
    assert kpa.desired(now=now, ready=1, starting=0) == 10
    now = feed(kpa, [7.0] * 30, start=now + 1)
    assert kpa.desired(now=now, ready=10, starting=0) == 10  # still in panic: no scale-down
    now = feed(kpa, [7.0] * 60, start=now + 1)
    assert kpa.desired(now=now, ready=10, starting=0) == 5  # panic over: at most halve per decision
