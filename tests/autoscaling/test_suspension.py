"""The autoscaler and a suspended tenant's endpoints: every one of them is ticked (autoscaling on or off), decided
at zero replicas whatever the demand, held there by draining what runs and launching nothing (warm pool included);
reactivated, the endpoint is back at its floor."""

import time
from dataclasses import replace

import pytest

from capacity.autoscaling import horizontal, store
from capacity.autoscaling.actuators.local import LocalActuator
from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.services import suspended_hold
from capacity.autoscaling.ticks import horizontal_inputs
from endpoints.models import Endpoint, Replica, ReplicaState
from tenants.services import tenant_update
from tests.factories import EndpointFactory, TenantFactory
from workers.tasks.autoscaling import autoscaled_endpoint_ids

pytestmark = pytest.mark.django_db


@pytest.fixture
def suspended_endpoint(clean_redis):
    tenant = TenantFactory(slug="gone")
    endpoint = EndpointFactory(
        name="gone-model",
        owner_tenant=tenant,
        min_replicas=2,
        max_replicas=4,
        desired_replicas=2,
        warm_pool_size=1,
        launch_options={"actuator": "local", "autoscale": False},
    )
    for name, standby in (("r0", False), ("r1", False), ("standby", True)):
        Replica.objects.create(endpoint=endpoint, name=name, state=ReplicaState.READY, is_standby=standby,
                               actuator="local")  # fmt: skip
    tenant_update(tenant=tenant, is_active=False)
    yield endpoint
    store.client().delete(store.SAMPLES_KEY.format(endpoint_id=endpoint.pk))


def test_every_endpoint_of_a_suspended_tenant_is_ticked(suspended_endpoint):
    assert suspended_endpoint.pk in autoscaled_endpoint_ids()
    tenant_update(tenant=suspended_endpoint.owner_tenant, is_active=True)
    assert suspended_endpoint.pk not in autoscaled_endpoint_ids()  # autoscaling off: left alone again


def _decided(endpoint):
    endpoint = Endpoint.objects.select_related("owner_tenant").get(pk=endpoint.pk)
    inputs = horizontal_inputs(endpoint, now=time.time())
    busy = [DemandSample(t=inputs.now - s, in_flight=30, queued=30, in_flight_mu=900, queued_mu=900) for s in (0, 1)]
    return horizontal.decide(replace(inputs, samples=busy, demand_reported=True))


def test_demand_decides_zero_replicas_and_says_why(suspended_endpoint):
    inputs = horizontal_inputs(suspended_endpoint, now=time.time())
    assert (inputs.max_replicas, inputs.min_replicas) == (0, 0)
    assert _decided(suspended_endpoint).desired == 0


def test_the_hold_drains_everything_and_launches_nothing(suspended_endpoint):
    # Given the actuator that started the replicas (a ready standby included: the warm pool goes too)
    actions = suspended_hold(endpoint=suspended_endpoint, actuator=LocalActuator())
    # Then each ready replica drains (in-flight streams finish before it stops) and no row is added
    states = dict(Replica.objects.filter(endpoint=suspended_endpoint).values_list("name", "state"))
    assert states == {"r0": "draining", "r1": "draining", "standby": "draining"}
    assert len(actions) == 3


def test_reactivation_brings_the_floor_back(suspended_endpoint):
    suspended_hold(endpoint=suspended_endpoint, actuator=LocalActuator())
    tenant_update(tenant=suspended_endpoint.owner_tenant, is_active=True)
    assert _decided(suspended_endpoint).desired >= 2
