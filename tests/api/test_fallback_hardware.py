"""An endpoint's fallback hardware profile through the API (``fallback_hardware_profile``, docs/placement.md "Falling
back to another hardware profile"): another profile that holds the model with its own GPUs per replica, or a field
error; what the autoscaler does with it: tests/autoscaling/test_placement_fallback.py."""

import pytest
from django.urls import reverse

from tests.factories import HardwareProfileFactory

pytestmark = pytest.mark.django_db


def patch(world, endpoint, **body):
    return world.client("operator").patch(reverse("endpoint-detail", args=[endpoint.pk]), body, format="json")


def test_a_fallback_profile_is_set_by_name_shown_and_cleared(world):
    endpoint = world.a.endpoint
    HardwareProfileFactory(name="l40s-x2", gpu_type="L40S", gpus_per_replica=2, gpu_memory_gb=48)
    response = patch(world, endpoint, fallback_hardware_profile="l40s-x2")
    assert response.status_code == 200, response.content
    endpoint.refresh_from_db()
    assert endpoint.fallback_hardware_profile.name == "l40s-x2"
    assert response.json()["fallback_hardware_profile"] == endpoint.fallback_hardware_profile_id
    response = patch(world, endpoint, fallback_hardware_profile=None)
    assert response.json()["fallback_hardware_profile"] is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (None, "is the endpoint's own hardware profile"),
        ({"gpu_memory_gb": 24}, "cannot hold llama-13b: 1 × 24 GB − weights 26 GB − overhead 10 GB"),
        ({"gpus_per_replica": 16}, "tiny:"),
    ],
)
def test_a_fallback_that_cannot_serve_the_model_is_a_field_error(world, fields, says):
    endpoint = world.a.endpoint
    profile = endpoint.hardware_profile if fields is None else HardwareProfileFactory(name="tiny", **fields)
    response = patch(world, endpoint, fallback_hardware_profile=profile.pk)
    assert response.status_code == 400, response.content
    assert says in " ".join(response.json()["fallback_hardware_profile"])
    endpoint.refresh_from_db()
    assert endpoint.fallback_hardware_profile_id is None


def test_a_tenant_does_not_see_a_shared_endpoint_s_fallback_hardware(world):
    shared = world.a.endpoint
    shared.owner_tenant = None
    shared.fallback_hardware_profile = HardwareProfileFactory(name="l40s-x2", gpus_per_replica=2)
    shared.save()
    response = world.client("a_admin").get(reverse("endpoint-detail", args=[shared.pk]))
    assert response.status_code == 200, response.content
    assert response.json()["fallback_hardware_profile"] is None
