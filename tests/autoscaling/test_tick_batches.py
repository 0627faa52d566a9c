"""The horizontal tick in batches (docs/architecture.md#the-horizontal-tick-at-fleet-scale): a fixed number of
queries per batch whatever its size, decisions identical to one endpoint's tick, the actuators called only where
replicas must change, one endpoint's failure kept from the others, and the demand windows each worker process keeps
equal to what Redis holds."""

import json
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from capacity.autoscaling import services, store, tick_reads, ticks
from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.limits import QuotaLeft
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, ReplicaState
from tests.autoscaling.test_ticks import RecordingActuator, report
from tests.factories import EndpointFactory, HardwareProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def actuator(monkeypatch):
    recording = RecordingActuator()
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: recording)
    return recording


def fleet(count: int, *, ready: int = 2, tenant=None) -> list[Endpoint]:
    endpoints = []
    for _ in range(count):
        endpoint = EndpointFactory(
            owner_tenant=tenant, concurrency_limit=10, min_replicas=ready, max_replicas=8, desired_replicas=ready
        )
        for _ in range(ready):
            ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording")
        endpoints.append(endpoint)
    return endpoints


def tick_queries(ids: list[int], tick: str, now: float) -> int:
    with CaptureQueriesContext(connection) as queries:
        decided = ticks.horizontal_ticks(endpoint_ids=ids, tick=tick, now=now)
    assert sorted(k for k, v in decided.items() if v is not None) == sorted(ids)
    return len(queries)


def test_a_batch_costs_the_same_queries_whatever_its_size(clean_store, actuator, tenant_a):
    type(tenant_a.tenant).objects.filter(pk=tenant_a.tenant.pk).update(quota_max_replicas=100, quota_max_gpus=100)
    tenant_a.tenant.refresh_from_db()
    small, large = fleet(3, tenant=tenant_a.tenant), fleet(12, tenant=tenant_a.tenant)
    now = time.time()
    # Steady endpoints (their count held, replicas matching): reads, one insert, no actuator call.
    assert tick_queries([e.pk for e in small], "h-a", now) == tick_queries([e.pk for e in large], "h-a", now)
    assert actuator.launched == [] and actuator.terminated == []
    rows = AutoscalerDecision.objects.filter(tick="h-a")
    assert rows.count() == 15 and all(r.applied and r.inputs["actions"] == [] for r in rows)


def test_a_batch_decides_as_one_endpoints_tick_does(clean_store, actuator):
    alone, batched = fleet(1)[0], fleet(3)
    now = time.time()
    ref = ticks.mu_capacity_for(alone) / 10
    for endpoint in (alone, batched[1]):
        report(clean_store, endpoint, "p", t=now, in_flight=35, in_flight_mu=35 * ref)
    one = ticks.horizontal_tick(endpoint_id=alone.pk, tick="h-1", now=now)
    many = ticks.horizontal_ticks(endpoint_ids=[e.pk for e in batched], tick="h-1", now=now)
    twin = many[batched[1].pk]
    assert (twin.current, twin.desired, twin.reason) == (one.current, one.desired, one.reason) == (2, 5, twin.reason)
    assert twin.inputs["actions"] == ["launched 3"] or twin.inputs["actions"][0].startswith("launched 3")
    # Only the endpoint whose count changed reached the actuator; the other two held, applied with no action.
    assert sorted(actuator.launched) == sorted([(alone.pk, 3, False), (batched[1].pk, 3, False)])
    held = [many[batched[0].pk], many[batched[2].pk]]
    assert all(d.desired == 2 and d.applied and d.inputs["actions"] == [] for d in held)
    assert Endpoint.objects.get(pk=batched[1].pk).desired_replicas == 5


def test_an_endpoint_short_of_replicas_is_reconciled_though_its_count_holds(clean_store, actuator):
    endpoint = fleet(1)[0]
    endpoint.replicas.filter(pk=endpoint.replicas.first().pk).update(state=ReplicaState.FAILED)
    decision = ticks.horizontal_ticks(endpoint_ids=[endpoint.pk], tick="h-1", now=time.time())[endpoint.pk]
    assert decision.desired == 2 and decision.inputs["actions"][0].startswith("launched 1")
    assert actuator.launched == [(endpoint.pk, 1, False)]


def test_one_endpoints_failure_leaves_the_batchs_others_decided(clean_store, actuator, monkeypatch):
    first, second = fleet(2)
    now = time.time()
    ref = ticks.mu_capacity_for(first) / 10
    for endpoint in (first, second):
        report(clean_store, endpoint, "p", t=now, in_flight=35, in_flight_mu=35 * ref)
    real = services.reconcile

    def reconcile(*, endpoint):
        if endpoint.pk == first.pk:
            raise RuntimeError("the cloud API is down")
        return real(endpoint=endpoint)

    monkeypatch.setattr(ticks, "reconcile", reconcile)
    decided = ticks.horizontal_ticks(endpoint_ids=[first.pk, second.pk], tick="h-1", now=now)
    assert decided[second.pk].applied and actuator.launched == [(second.pk, 3, False)]
    assert AutoscalerDecision.objects.get(endpoint=first, tick="h-1").applied is False


def test_an_endpoint_another_worker_holds_is_left_to_it(clean_store, actuator):
    mine, theirs = fleet(2)
    with store.TickLock(axis=ticks.HORIZONTAL, endpoint_id=theirs.pk) as lock:
        assert lock.held
        decided = ticks.horizontal_ticks(endpoint_ids=[mine.pk, theirs.pk], tick="h-1", now=time.time())
    assert set(decided) == {mine.pk}
    # Released: the other worker's batch takes it; the one already decided is not decided twice.
    again = ticks.horizontal_ticks(endpoint_ids=[mine.pk, theirs.pk], tick="h-1", now=time.time())
    assert set(again) == {theirs.pk}


def stored_window(endpoint_id: int) -> list:
    return tick_reads.parse_window(store.client().lrange(store.SAMPLES_KEY.format(endpoint_id=endpoint_id), 0, -1))


def test_the_kept_windows_equal_what_redis_holds(clean_store, actuator, monkeypatch):
    endpoint = fleet(1)[0]
    seen = []
    real = ticks.horizontal.decide
    monkeypatch.setattr(
        ticks.horizontal, "decide", lambda inputs, *a: seen.append(list(inputs.samples)) or real(inputs)
    )
    now = time.time()
    key = store.SAMPLES_KEY.format(endpoint_id=endpoint.pk)
    for step in range(6):
        # The sampler's seconds between ticks: a few, then (step 3) more than a tail read allows for.
        for second in range(40 if step == 3 else 4):
            report(clean_store, endpoint, "p", t=now, in_flight=step * 10 + second % 3)
            tick_reads.append_samples([endpoint.pk], now=now)
            now += 1
        if step == 4:
            clean_store.delete(key)  # an operator's reset (or a Redis restart): the window starts again
        ticks.horizontal_ticks(endpoint_ids=[endpoint.pk], tick=f"h-{step}", now=now)
        assert seen[-1] == stored_window(endpoint.pk)
    assert len(seen[4]) == 1 and len(seen[2]) == 3 * 5  # four sampler seconds and a tick's own sample per step
    # A full window, parsed once and then kept: still equal after the list is trimmed at its head.
    clean_store.rpush(key, *[json.dumps({"t": now + i, "in_flight": i % 5}) for i in range(store.SAMPLES_KEPT)])
    for step in range(3):
        tick_reads.append_samples([endpoint.pk], now=now + store.SAMPLES_KEPT + step)
        ticks.horizontal_ticks(endpoint_ids=[endpoint.pk], tick=f"h-full-{step}", now=now + store.SAMPLES_KEPT + step)
        assert len(seen[-1]) == store.SAMPLES_KEPT and seen[-1] == stored_window(endpoint.pk)


def test_a_corrupt_stored_sample_is_skipped():
    raws = [b'{"t": "x"}', b"nope", b'{"t": 1.0, "in_flight": "3"}', b'{"t": NaN}', b"[1]", b'{"t": 2, "extra": 1}']
    window = tick_reads.parse_window(raws)
    assert [(s.t, s.in_flight) for s in window] == [(1.0, 3.0), (2.0, 0.0)]


def test_kept_samples_share_their_whole_number_counts_and_store_as_they_parse():
    """A worker keeps minutes of samples per endpoint: equal counts are one float object, not one each, and a sample
    stored with ``as_dict`` parses back equal."""
    stored = [
        DemandSample(t=1.0 + i, in_flight=float(i % 3), queued=1.0, in_flight_mu=0.5 * i, arrivals=2.0).as_dict()
        for i in range(9)
    ]
    window = tick_reads.parse_window([json.dumps(s).encode() for s in stored])
    assert [s.as_dict() for s in window] == stored
    assert len({id(s.in_flight) for s in window}) == 3 and len({id(s.queued) for s in window}) == 1
    assert len({id(s.t) for s in window}) == 9  # timestamps and MU are not whole numbers: their own
    assert not hasattr(window[0], "__dict__")


def test_a_batchs_quota_reads_agree_with_one_endpoints(clean_store, tenant_a, tenant_b):
    """What each owner may still start, read for the batch at once, equals ``services.quota_left`` per endpoint:
    standbys, draining replicas and a replica on another profile than its endpoint's (a spot or fallback one holds
    its own profile's GPUs) included."""
    four = HardwareProfileFactory(name="tp4", gpus_per_replica=4)
    two = HardwareProfileFactory(name="tp2", gpus_per_replica=2)
    endpoints = [EndpointFactory(owner_tenant=t.tenant, hardware_profile=four) for t in (tenant_a, tenant_a, tenant_b)]
    endpoints.append(EndpointFactory(owner_tenant=None))  # shared: no quota
    first, second, other, _ = endpoints
    ReplicaFactory(endpoint=first, state=ReplicaState.READY)
    ReplicaFactory(endpoint=first, state=ReplicaState.DRAINING)
    ReplicaFactory(endpoint=first, state=ReplicaState.READY, is_standby=True)
    ReplicaFactory(endpoint=second, state=ReplicaState.STARTING, hardware_profile=two)
    ReplicaFactory(endpoint=second, state=ReplicaState.STOPPED)
    ReplicaFactory(endpoint=other, state=ReplicaState.READY)
    reads = tick_reads.TickReads(
        list(Endpoint.objects.filter(pk__in=[e.pk for e in endpoints]).select_related("owner_tenant")), now=time.time()
    )
    for endpoint in Endpoint.objects.filter(pk__in=[e.pk for e in endpoints]).select_related("owner_tenant"):
        one = services.quota_left(endpoint, exclude_own_serving=True)
        assert reads.quota_left.get(endpoint.pk, QuotaLeft()) == one, endpoint.name
    # first's own ready replica left out: 4 draining + 4 standby + 2 (second's, on its 2-GPU profile) held;
    # second's own left out: 4 + 4 + 4 held.
    quota = tenant_a.tenant.quota_max_gpus or services.quota_for(tenant_a.tenant).max_gpus
    assert (reads.quota_left[first.pk].gpus, reads.quota_left[second.pk].gpus) == (quota - 10, quota - 12)
