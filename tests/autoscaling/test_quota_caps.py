"""The autoscaler never starts more than the owner's quota allows, nor more than the per-tick launch caps, and says
so in the decision's reason when a cap binds."""

import json
import time

import pytest

from capacity.autoscaling import services, store, ticks
from capacity.autoscaling.limits import QuotaLeft, launch_allowance, quota_ceiling
from endpoints.models import Endpoint, Replica, ReplicaState
from tests.autoscaling.test_ticks import RecordingActuator
from tests.factories import EndpointFactory, HardwareProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def actuator(monkeypatch):
    recording = RecordingActuator()
    monkeypatch.setattr(services, "get_actuator", lambda endpoint: recording)
    return recording


def _demand(client, endpoint, in_flight: int) -> None:
    client.hset(
        store.DEMAND_KEY.format(endpoint_id=endpoint.pk),
        "proxy-1",
        json.dumps({"t": time.time(), "in_flight": in_flight, "queued": 0}),
    )


def _flat(endpoint: Endpoint, **fields) -> Endpoint:
    """Write fields past the services' quota checks, as a row edited in SQL or created before quotas would be."""
    Endpoint.objects.filter(pk=endpoint.pk).update(**fields)
    endpoint.refresh_from_db()
    return endpoint


# -- pure limits ------------------------------------------------------------------------------------------------
def test_quota_ceiling_is_the_smallest_of_max_replicas_replica_quota_and_gpu_quota():
    assert quota_ceiling(max_replicas=10, left=QuotaLeft(), gpus_per_replica=8) == (10, "")
    assert quota_ceiling(max_replicas=10, left=QuotaLeft(serving=3, gpus=100), gpus_per_replica=1)[0] == 3
    ceiling, why = quota_ceiling(max_replicas=10, left=QuotaLeft(serving=9, gpus=17), gpus_per_replica=8)
    assert (ceiling, "GPU" in why) == (2, True)
    assert quota_ceiling(max_replicas=10, left=QuotaLeft(serving=-2, gpus=-8), gpus_per_replica=1)[0] == 0


def test_launch_allowance_names_each_binding_limit():
    allowed, notes = launch_allowance(
        wanted=20, standby=False, left=QuotaLeft(serving=12, gpus=40), gpus_per_replica=4, per_tick_left=8
    )
    assert allowed == 8
    assert notes == [
        "tenant replica quota allows 12",
        "tenant GPU quota allows 10",
        "launches per endpoint per tick allows 8",
    ]
    assert launch_allowance(
        wanted=3, standby=True, left=QuotaLeft(standby=1), gpus_per_replica=1, per_tick_left=8
    ) == (
        1,
        ["tenant warm pool quota allows 1"],
    )


# -- ticks ------------------------------------------------------------------------------------------------------
def test_min_replicas_in_the_thousands_launches_only_the_tenants_quota(clean_store, actuator, tenant_a, settings):
    """A row with min_replicas 5000 (written before quotas, or in SQL) starts the quota's 16, not 5000."""
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_MAX_LAUNCHES_PER_TICK": 100}
    endpoint = _flat(tenant_a.endpoint, min_replicas=5000, max_replicas=5000, desired_replicas=5000)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-q1", now=time.time())
    launched = sum(count for _, count, standby in actuator.launched if not standby)
    assert launched == 16
    assert decision.desired == 16
    assert "tenant replica quota caps replicas at 16" in decision.reason
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 16
    # The next tick starts nothing more: the quota is used up.
    actuator.launched.clear()
    ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-q2", now=time.time() + 5)
    assert sum(count for _, count, _ in actuator.launched) == 0


def test_gpu_quota_counts_gpus_per_replica_and_other_endpoints(clean_store, actuator, tenant_a):
    eight = HardwareProfileFactory(name="h100x8", gpus_per_replica=8)
    tenant_a.tenant.quota_max_gpus = 20
    tenant_a.tenant.save()
    # Another endpoint of the tenant already holds 4 GPUs: 16 left, two 8-GPU replicas.
    other = EndpointFactory(owner_tenant=tenant_a.tenant)
    ReplicaFactory.create_batch(4, endpoint=other, state=ReplicaState.READY)
    endpoint = _flat(
        EndpointFactory(owner_tenant=tenant_a.tenant, hardware_profile=eight),
        min_replicas=6,
        max_replicas=6,
        desired_replicas=6,
    )
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-g1", now=time.time())
    assert sum(count for _, count, _ in actuator.launched) == 2
    assert decision.desired == 2 and "tenant GPU quota caps replicas at 2" in decision.reason


def test_demand_scale_up_stops_at_the_quota(clean_store, actuator, tenant_a):
    tenant_a.tenant.quota_max_replicas = 3
    tenant_a.tenant.save()
    endpoint = _flat(tenant_a.endpoint, concurrency_limit=10, min_replicas=1, max_replicas=8, desired_replicas=1)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording")
    _demand(clean_store, endpoint, in_flight=200)
    decision = ticks.horizontal_tick(endpoint_id=endpoint.pk, tick="h-d1", now=time.time())
    assert decision.desired == 3
    assert "tenant replica quota caps replicas at 3" in decision.reason
    assert sum(count for _, count, _ in actuator.launched) == 2


def test_launches_per_endpoint_per_tick_are_capped_and_recorded(clean_store, actuator, operator):
    shared = _flat(EndpointFactory(), min_replicas=50, max_replicas=50, desired_replicas=50)  # no quota: shared
    decision = ticks.horizontal_tick(endpoint_id=shared.pk, tick="h-c1", now=time.time())
    assert sum(count for _, count, _ in actuator.launched) == 8
    assert "launch capped at 8 of 50" in decision.reason and "launches per endpoint per tick" in decision.reason


def test_fleet_wide_launch_cap_spans_endpoints(clean_store, actuator, settings):
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_MAX_FLEET_LAUNCHES_PER_TICK": 10}
    first = _flat(EndpointFactory(), min_replicas=8, max_replicas=8, desired_replicas=8)
    second = _flat(EndpointFactory(), min_replicas=8, max_replicas=8, desired_replicas=8)
    services.reconcile(endpoint=first)
    actions = services.reconcile(endpoint=second)
    launched = {pk: sum(c for e, c, _ in actuator.launched if e == pk) for pk in (first.pk, second.pk)}
    # Both in the same 5 s window unless the slot turned between the two calls; then the second gets a fresh budget.
    assert launched[first.pk] == 8
    assert launched[second.pk] in (2, 8)
    if launched[second.pk] == 2:
        assert any("fleet launches per tick allow 2" in a for a in actions)


def test_warm_pool_stays_within_the_warm_pool_quota(clean_store, actuator, tenant_a):
    tenant_a.tenant.quota_max_warm_pool = 2
    tenant_a.tenant.save()
    endpoint = _flat(tenant_a.endpoint, warm_pool_size=500, min_replicas=1, max_replicas=1, desired_replicas=1)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="recording")
    actions = services.reconcile(endpoint=endpoint)
    assert Replica.objects.filter(endpoint=endpoint, is_standby=True).count() == 2
    assert any("warm pool: launch capped at 2 of 500" in a for a in actions)
