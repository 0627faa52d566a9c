"""A rollout's surge replicas count against the owner's quota like the autoscaler's launches: the surge is capped to
what the replica and GPU quota leave, and a rollout with no room for even one surge replica is refused with a field
error (also when a tenant's own endpoint change would start it). Shared endpoints have no quota."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from rest_framework.test import APIClient

from capacity.autoscaling.limits import QuotaLeft, rollout_surge_allowance
from endpoints.models import EndpointVersion, ReplicaState, Rollout
from endpoints.rollouts import services
from tests.factories import EndpointFactory, HardwareProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db


def _quota(tenant, **values) -> None:
    for name, value in values.items():
        setattr(tenant, f"quota_{name}", value)
    tenant.save()


def _ready(endpoint, n: int, **extra) -> None:
    ReplicaFactory.create_batch(n, endpoint=endpoint, state=ReplicaState.READY, **extra)


# -- the pure limit ---------------------------------------------------------------------------------------------
def test_surge_allowance_counts_replicas_and_the_peak_gpus_of_first_and_last_batch():
    assert rollout_surge_allowance(
        wanted=2, baseline=4, left=QuotaLeft(), old_gpus_per_replica=1, new_gpus_per_replica=1
    ) == (2, "")
    allowed, why = rollout_surge_allowance(
        wanted=2, baseline=4, left=QuotaLeft(serving=1, gpus=100), old_gpus_per_replica=1, new_gpus_per_replica=1
    )
    assert (allowed, "replica quota has 1" in why) == (1, True)
    # 2 replicas moving from 1 to 8 GPUs: with a surge of 1 the last batch holds 2x8 new + 1 old, 15 GPUs more than
    # the 2 held now; 14 left allow no surge at all.
    allowed, why = rollout_surge_allowance(
        wanted=2, baseline=2, left=QuotaLeft(serving=10, gpus=14), old_gpus_per_replica=1, new_gpus_per_replica=8
    )
    assert allowed == 0 and "GPU quota has 14" in why
    # One 1-GPU replica to 8 GPUs: a surge of one needs 8 more at the peak.
    assert rollout_surge_allowance(
        wanted=1, baseline=1, left=QuotaLeft(serving=10, gpus=8), old_gpus_per_replica=1, new_gpus_per_replica=8
    ) == (1, "")
    assert (
        rollout_surge_allowance(
            wanted=3, baseline=3, left=QuotaLeft(serving=0), old_gpus_per_replica=1, new_gpus_per_replica=1
        )[0]
        == 0
    )


# -- start_rollout ----------------------------------------------------------------------------------------------
def test_the_surge_is_capped_to_the_replicas_the_quota_leaves(tenant_a):
    endpoint = tenant_a.endpoint
    _quota(tenant_a.tenant, max_replicas=3)
    _ready(endpoint, 2)
    v2 = services.create_version(endpoint=endpoint, launch_options={"speed": 2.0})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=2)
    assert rollout.baseline_ready == 2 and rollout.max_surge == 1
    created = rollout.events.get(kind="created")
    assert "surge capped at 1 of 2: the tenant's replica quota has 1 replica(s) left" in created.message


def test_a_rollout_with_no_room_for_a_surge_replica_is_refused(tenant_a):
    endpoint = tenant_a.endpoint
    _quota(tenant_a.tenant, max_replicas=2)
    _ready(endpoint, 2)
    v2 = services.create_version(endpoint=endpoint, launch_options={"speed": 2.0})
    with pytest.raises(ValidationError) as refused:
        services.start_rollout(endpoint=endpoint, to_version=v2)
    message = refused.value.message_dict["max_surge"][0]
    assert "no surge replica fits the tenant's quota" in message and "raise the quota" in message
    assert not Rollout.objects.filter(endpoint=endpoint).exists()


def test_a_move_to_bigger_gpus_counts_the_new_versions_gpus(tenant_a):
    endpoint = tenant_a.endpoint
    endpoint.max_replicas = 2  # 2 x 8 GPUs: the new version's own ceiling fits the quota, only the surge does not
    endpoint.save()
    eight = HardwareProfileFactory(name="h100x8", gpus_per_replica=8)
    _quota(tenant_a.tenant, max_gpus=16)
    _ready(endpoint, 2)
    v2 = services.create_version(endpoint=endpoint, hardware_profile=eight.pk)
    with pytest.raises(ValidationError) as refused:
        services.start_rollout(endpoint=endpoint, to_version=v2)
    assert "GPU quota has 14 GPU(s) left" in refused.value.message_dict["max_surge"][0]
    # With one replica to replace it fits: 1 old + 1 new at 8 GPUs peaks at 9 of 16.
    other = EndpointFactory(owner_tenant=tenant_a.tenant, max_replicas=1)
    _ready(other, 1)
    fits = services.start_rollout(
        endpoint=other, to_version=services.create_version(endpoint=other, hardware_profile=eight.pk)
    )
    assert fits.max_surge == 2 and fits.baseline_ready == 1  # the machine's surge is min(B, max_surge) = 1 anyway


def test_shared_endpoints_have_no_quota(tenant_a):
    _quota(tenant_a.tenant, max_replicas=0, max_gpus=0)
    shared = EndpointFactory()
    _ready(shared, 20)
    v2 = services.create_version(endpoint=shared, launch_options={"speed": 2.0})
    assert services.start_rollout(endpoint=shared, to_version=v2, max_surge=4).max_surge == 4


def test_a_tenants_launch_option_change_at_a_full_quota_answers_a_field_error(tenant_a):
    """The tenant's own PATCH starts the rollout (replicas to replace): refused as a 400, nothing left behind."""
    endpoint = tenant_a.endpoint
    endpoint.launch_options = {"actuator": "local"}
    endpoint.save()
    _quota(tenant_a.tenant, max_replicas=1)
    _ready(endpoint, 1, actuator="local")
    versions = EndpointVersion.objects.filter(endpoint=endpoint).count()
    client = APIClient()
    client.force_authenticate(user=tenant_a.admin)
    response = client.patch(
        reverse("endpoint-detail", args=[endpoint.pk]),
        {"launch_options": {"actuator": "local", "speed": 3.0}},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "no surge replica fits the tenant's quota" in response.json()["max_surge"][0]
    assert not Rollout.objects.filter(endpoint=endpoint).exists()
    assert EndpointVersion.objects.filter(endpoint=endpoint).count() == versions
