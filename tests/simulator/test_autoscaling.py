"""Our policies drive the shared engine simulator (``simulator``) through its autoscaler hook."""

import itertools
import math

import pytest

from benchmarks.capacity.two_axis import InfercapPolicy
from capacity.hardware.profiles import get_profile
from gateway.admission import CLASSES
from gateway.routing.baselines import LeastRequestRouter
from simulator import workloads
from simulator.autoscaling import EngineSimAutoscaler, engine_seconds_per_request
from simulator.des import ProxyAdmission, Simulation


def step_times():
    """2 req/s for a minute, a 10× spike for a minute, then 2 req/s for 15 minutes."""
    phases = [(0.0, 60.0, 2.0), (60.0, 120.0, 20.0), (120.0, 1020.0, 2.0)]
    return itertools.chain.from_iterable(
        workloads.constant_times(rate, count=int((end - start) * rate), start_s=start) for start, end, rate in phases
    )


def test_spike_scales_up_then_down_without_flapping_or_losing_requests():
    policy = InfercapPolicy(
        min_replicas=1, max_replicas=6, concurrency_limit=8, concurrency_min=2, concurrency_max=8,
        ttft_slo_ms=2000, tpot_slo_ms=100, predictive_period_s=None,
    )  # fmt: skip
    scaler = EngineSimAutoscaler(policy, cold_start_s=20.0)
    sim = Simulation(
        router=LeastRequestRouter(), replicas=1, profile="tiny", autoscaler=scaler, concurrency_limit=8,
        # No age limit here: this test is about scaling, and every request must wait for it rather than be shed
        admission=ProxyAdmission(max_queue=100_000, max_age_s=dict.fromkeys(CLASSES, math.inf)), cold_start_s=20.0,
    )  # fmt: skip
    result = sim.run(workloads.uniform(times=step_times(), prompt_tokens=64, output_tokens=100))

    peak = max(sample["ready"] + sample["starting"] for sample in result.timeline)
    assert peak >= 3  # the spike needs ~12 in flight at 5.6 per replica
    # every request was served: scale-in drained replicas instead of aborting their requests
    assert {r.status for r in result.requests} == {"ok"}
    # no scale-down within 5 minutes of a scale-up
    ups = [t for t, current, desired in scaler.decisions if desired > current]
    downs = [t for t, current, desired in scaler.decisions if desired < current]
    assert ups and downs
    assert all(down - max(u for u in ups if u <= down) >= 300 for down in downs)
    # back to one replica once the spike is 5 minutes behind
    assert result.timeline[-1]["ready"] == 1


def test_replicas_cold_start_within_the_range_and_take_the_current_limit():
    class Up:
        interval_s, vertical_interval_s, concurrency_limit = 5.0, 30.0, 8

        def observe(self, sample):
            pass

        def desired(self, *, now, ready, starting):
            return 4

        def adjust_concurrency(self, **signals):
            return 5

    scaler = EngineSimAutoscaler(Up(), cold_start_s=(60.0, 120.0), seed=3)
    scaler.limits.append((0.0, 5))  # the vertical axis already moved the limit
    sim = Simulation(router=LeastRequestRouter(), replicas=1, profile="tiny", autoscaler=scaler, concurrency_limit=8)
    sim.run(workloads.uniform(times=workloads.constant_times(1.0, count=200), prompt_tokens=32, output_tokens=8))
    added = [rep for rep in sim._all_replicas if rep.record.added_s > 0]
    assert len(added) == 3
    boots = [rep.record.ready_s - rep.record.added_s for rep in added]
    assert all(60.0 <= b <= 120.0 for b in boots) and len(set(boots)) == 3
    assert {rep.concurrency_limit for rep in added} == {5}


def test_demand_samples_carry_requests_and_mu():
    seen = []

    class Spy:
        interval_s = 5.0

        def observe(self, sample):
            seen.append(sample)

        def desired(self, *, now, ready, starting):
            return 1

    sim = Simulation(
        router=LeastRequestRouter(), replicas=1, profile="tiny", autoscaler=EngineSimAutoscaler(Spy()),
        cost_fn=lambda request, prompt_tokens: 2.5,
    )  # fmt: skip
    sim.run(workloads.uniform(times=workloads.constant_times(20.0, count=200), prompt_tokens=64, output_tokens=200))
    busy = [s for s in seen if s.requests]
    assert busy and all(s.mu == pytest.approx(2.5 * s.requests) for s in busy)
    assert sum(s.arrivals for s in seen) == 200


def test_in_flight_time_accounts_for_prefill_stalls():
    # Poisson load on one A100 13B replica: the closed form's W (Little: B = λ·W) against the simulated mean e2e
    rate = 5.0
    sim = Simulation(router=LeastRequestRouter(), replicas=1, profile="llama-13b-a100", concurrency_limit=256)
    result = sim.run(
        workloads.uniform(
            times=workloads.poisson_times(rate, duration_s=600.0, seed=2), prompt_tokens=500, output_tokens=300
        )
    )
    measured = [r.e2e_s for r in result.requests if r.arrival_s > 120.0]
    mean_w = sum(measured) / len(measured)
    profile = get_profile("llama-13b-a100")
    assert engine_seconds_per_request(profile, rate * mean_w) == pytest.approx(mean_w, rel=0.15)
    # without the stall term (decode only) W is far too short: the replica looks ~1.5× faster than it is
    decode_only = profile.prefill_s(500) + 299 * profile.decode_step_s(round(rate * mean_w), 0)
    assert decode_only < 0.75 * mean_w
