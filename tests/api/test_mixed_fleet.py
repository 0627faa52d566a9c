"""A mixed fleet through the API: an endpoint's spot pool (``spot_hardware_profile``: spot capacity of the GPU type
it runs on, or a field error; the autoscaler's split over it: tests/autoscaling/test_ticks.py; its costs:
billing.cost_rows) and its routing plan (``routing_plan``, what the cost_aware policy routes by)."""

import pytest
from django.urls import reverse

from billing.cost_rows import replica_profile_seconds
from capacity.models import HardwareProfile
from endpoints.models import ReplicaState
from tests.factories import HardwareProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db

SPOT = HardwareProfile.CapacityType.SPOT


def patch(world, endpoint, **body):
    return world.client("operator").patch(reverse("endpoint-detail", args=[endpoint.pk]), body, format="json")


def test_a_spot_pool_of_the_endpoint_s_gpu_type_is_set_and_shown(world):
    endpoint = world.a.endpoint
    pool = HardwareProfileFactory(name="a100-spot", capacity_type=SPOT, usd_per_gpu_hour=0.9)
    response = patch(world, endpoint, spot_hardware_profile=pool.pk)
    assert response.status_code == 200, response.content
    assert response.json()["spot_hardware_profile"] == pool.pk and response.json()["desired_spot_replicas"] == 0
    assert patch(world, endpoint, spot_hardware_profile=None).json()["spot_hardware_profile"] is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"capacity_type": "on_demand"}, "not spot"),
        ({"capacity_type": SPOT, "gpu_type": "H100"}, "has H100 GPUs; the endpoint runs on A100-80GB"),
        ({"capacity_type": SPOT, "usd_per_gpu_hour": None}, "no price"),
    ],
)
def test_a_pool_that_is_not_spot_of_the_same_gpu_is_a_field_error(world, fields, says):
    pool = HardwareProfileFactory(name="other", **fields)
    response = patch(world, world.a.endpoint, spot_hardware_profile=pool.pk)
    assert response.status_code == 400, response.content
    assert says in " ".join(response.json()["spot_hardware_profile"])


def test_a_spot_replica_s_gpu_time_is_costed_on_its_pool(world):
    from datetime import timedelta

    from django.utils import timezone

    endpoint = world.a.endpoint
    pool = HardwareProfileFactory(name="a100-spot", capacity_type=SPOT, usd_per_gpu_hour=0.9)
    start = timezone.now() - timedelta(hours=1)
    for profile in (None, pool):
        ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, state_changed_at=start, hardware_profile=profile)
    rows = replica_profile_seconds(endpoint_ids=[endpoint.pk], start=start, end=start + timedelta(hours=1))
    assert {r.profile_id: round(r.billed_s) for r in rows} == {endpoint.hardware_profile_id: 3600, pool.pk: 3600}


PLAN = {
    "buckets": [{"name": "chat", "prompt_tokens": 256, "output_tokens": 128}],
    "types": {"a100-80g": {"usd_per_hour": 2.5, "batch": {"chat": 32}, "rate_rps": {"chat": 4.0}}},
}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"routing_policy": "cost_aware"}, "needs a plan"),
        ({"routing_policy": "cost_aware", "routing_plan": {"buckets": []}}, "buckets"),
        ({"routing_plan": {**PLAN, "types": {"a100-80g": {"usd_per_hour": -1}}}}, "types.a100-80g"),
        ({"routing_plan": {**PLAN, "shares": {"nope": {"a100-80g": 1}}}}, "shares"),
        ({"routing_policy": "cost_aware", "routing_plan": {**PLAN, "types": {"h100": PLAN["types"]["a100-80g"]}}},
         "no figures for the endpoint's hardware profile a100-80g"),
    ],
)  # fmt: skip
def test_a_routing_plan_that_is_not_the_planner_s_shape_is_a_field_error(world, body, says):
    response = patch(world, world.a.endpoint, **body)
    assert response.status_code == 400 and says in " ".join(response.json()["routing_plan"]), response.content


def test_the_cost_aware_policy_with_its_plan_is_set_and_hidden_from_reserving_tenants(world):
    from tests.factories import EndpointFactory, ReservationFactory

    response = patch(world, world.a.endpoint, routing_policy="cost_aware", routing_plan=PLAN)
    assert response.status_code == 200 and response.json()["routing_plan"] == PLAN, response.content
    shared = EndpointFactory(routing_policy="cost_aware", routing_plan=PLAN)
    ReservationFactory(tenant=world.b.tenant, endpoint=shared)
    seen = world.client("b_admin").get(reverse("endpoint-detail", args=[shared.pk])).json()
    assert seen["routing_plan"] == {} and seen["spot_hardware_profile"] is None
