"""The spike-onset floor on the live path (docs/algorithms.md#spike-onset): the proxies count requests reaching
admission, the beat's sampler turns their cumulative counters into each sample's arrivals (its one writer), and the
horizontal tick reads a climb in them as an onset."""

import json
import time

import pytest

from capacity.autoscaling import services, store, tick_reads, ticks
from capacity.autoscaling.demand import arrivals_since
from endpoints.models import ReplicaState
from tests.autoscaling.test_ticks import RecordingActuator
from tests.factories import EndpointFactory, ReplicaFactory


def test_arrivals_are_the_counters_differences_since_the_last_sample():
    now = 1000.0
    first = {"p1": {"t": now, "arrived": 10, "arrived_mu": 20.0}}
    # A process seen for the first time counts from its next report.
    assert arrivals_since(first, {}, now=now)[:2] == (0.0, 0.0)
    seen = arrivals_since(first, {}, now=now)[2]
    later = {
        "p1": {"t": now + 1, "arrived": 14, "arrived_mu": 28.0},
        "p2": {"t": now + 1, "arrived": 3, "arrived_mu": 6.0},  # new: from its next report
        "dead": {"t": now - 60, "arrived": 500, "arrived_mu": 1.0},  # stale: ignored, and forgotten
        "bad": {"t": now + 1, "arrived": "many"},
    }
    arrivals, arrivals_mu, keep = arrivals_since(later, seen, now=now + 1)
    assert (arrivals, arrivals_mu) == (4.0, 8.0) and set(keep) == {"p1", "p2"}
    restarted = {"p1": {"t": now + 2, "arrived": 2, "arrived_mu": 4.0}, "p2": {"t": now + 2, "arrived": 5}}
    assert arrivals_since(restarted, keep, now=now + 2)[:2] == (2.0 + 2.0, 4.0)


@pytest.mark.django_db(transaction=True)
def test_a_live_climb_in_arrivals_orders_replicas_before_the_queue_shows_it(clean_store, monkeypatch):
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: RecordingActuator())
    endpoint = EndpointFactory(concurrency_limit=10, min_replicas=1, max_replicas=20, desired_replicas=2)
    for _ in range(2):
        ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording")
    key = store.DEMAND_KEY.format(endpoint_id=endpoint.pk)
    now, counts = time.time() - 400, {"p1": 0, "p2": 0}

    def second(rate_each: float, in_flight: float) -> None:
        nonlocal now
        for process in counts:
            counts[process] += rate_each
            report = {"t": now, "in_flight": in_flight / 2, "arrived": counts[process], "arrived_mu": counts[process]}
            clean_store.hset(key, process, json.dumps(report))
        tick_reads.append_samples([endpoint.pk], now=now)
        now += 1

    for _ in range(330):  # five quiet minutes: 2 requests a second, 12 in flight
        second(1.0, 12.0)
    window = ticks.sample_demand(endpoint_id=endpoint.pk, now=now)
    assert sum(s.arrivals for s in window[-300:]) == pytest.approx(600.0, abs=3)
    quiet = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-quiet", now=now)
    assert quiet.inputs["onset"] is None and quiet.desired == 2
    for i in range(20):  # the rate climbs to 5× over 20 s while the fleet's load has not moved yet
        second(1.0 + 4.0 * (i + 1) / 20, 12.0)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-climb", now=now)
    assert decision.inputs["onset"] is not None, decision.reason
    assert decision.inputs["floor_reason"] == "spike_onset" and decision.desired > 2
