"""Our policies drive the shared engine simulator (``endpoints.runtimes.sim``) through its autoscaler hook."""

import itertools

from capacity.autoscaling.infercap import InfercapPolicy
from capacity.autoscaling.sim_adapter import EngineSimAutoscaler
from endpoints.routing.baselines import LeastRequestRouter
from endpoints.runtimes.sim import workloads
from endpoints.runtimes.sim.des import Simulation, SlotAdmission


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
        admission=SlotAdmission(max_queue=100_000), cold_start_s=20.0,
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
