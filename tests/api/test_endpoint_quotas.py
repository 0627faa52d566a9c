"""Tenant quotas on endpoint create and update (API, console, services), the quota resource (tenants read theirs,
operators change it, audited), and an operator's raise as the approval of capacity beyond the default."""

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from endpoints.models import Endpoint
from endpoints.services import endpoint_create, endpoint_update
from tenants.models import AuditEntry
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory, ModelProfileFactory

pytestmark = pytest.mark.django_db


def _payload(**extra) -> dict:
    return {
        "name": extra.pop("name", "quota-probe"),
        "model_profile": ModelProfileFactory().pk,
        "hardware_profile": extra.pop("hardware_profile", HardwareProfileFactory().pk),
        "runtime": "sim",
        **extra,
    }


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"min_replicas": 3000, "max_replicas": 3000}, "max_replicas"),
        ({"min_replicas": 17, "max_replicas": 16}, "min_replicas"),
        ({"warm_pool_size": 1000}, "warm_pool_size"),
    ],
)
def test_tenant_create_beyond_quota_is_a_field_error(world, fields, field):
    for who in ("a_admin", "a_write_key"):
        response = world.client(who).post(reverse("endpoint-list"), _payload(**fields), format="json")
        assert response.status_code == 400, (who, response.content)
        assert field in response.json(), response.json()
        assert "quota" in str(response.json()[field])
    assert not Endpoint.objects.filter(name="quota-probe").exists()


def test_gpus_are_replicas_times_the_hardware_profiles_gpus(world):
    eight = HardwareProfileFactory(name="h100x8", gpus_per_replica=8)
    # 3 replicas of 8 GPUs = 24 > 16 GPUs, though 3 replicas fit the replica quota.
    response = world.client("a_admin").post(
        reverse("endpoint-list"), _payload(hardware_profile=eight.pk, min_replicas=1, max_replicas=3), format="json"
    )
    assert response.status_code == 400
    assert "GPUs" in str(response.json()["max_replicas"])
    ok = world.client("a_admin").post(
        reverse("endpoint-list"), _payload(hardware_profile=eight.pk, min_replicas=1, max_replicas=2), format="json"
    )
    assert ok.status_code == 201, ok.content


def test_endpoint_count_quota(world):
    world.a.tenant.quota_max_endpoints = 2  # the fixture's endpoint is one
    world.a.tenant.save()
    first = world.client("a_admin").post(reverse("endpoint-list"), _payload(name="second"), format="json")
    assert first.status_code == 201, first.content
    third = world.client("a_admin").post(reverse("endpoint-list"), _payload(name="third"), format="json")
    assert third.status_code == 400
    assert "2 endpoint(s)" in str(third.json()["owner_tenant"])


def test_update_beyond_quota_is_refused_and_floors_add_up_across_endpoints(world):
    world.a.tenant.quota_max_replicas = 6
    world.a.tenant.save()
    Endpoint.objects.filter(pk=world.a.endpoint.pk).update(min_replicas=4, max_replicas=4, desired_replicas=4)
    other = EndpointFactory(owner_tenant=world.a.tenant, min_replicas=1, max_replicas=2)
    url = reverse("endpoint-detail", args=[other.pk])
    response = world.client("a_admin").patch(url, {"min_replicas": 3, "max_replicas": 6}, format="json")
    assert response.status_code == 400
    assert "7 replicas" in str(response.json()["min_replicas"])
    too_wide = world.client("a_admin").patch(url, {"max_replicas": 7}, format="json")
    assert too_wide.status_code == 400 and "max_replicas" in too_wide.json()
    assert world.client("a_admin").patch(url, {"max_replicas": 6}, format="json").status_code == 200
    # The console's scale page goes through the same services.
    console = client_for(world.operator)
    console.force_login(world.operator)
    page = console.post(
        reverse("console:endpoint-scale", args=[other.pk]),
        {"min_replicas": 5, "max_replicas": 6, "desired_replicas": 5, "confirmed": "yes"},
    )
    assert page.status_code == 400 and b"quota" in page.content
    other.refresh_from_db()
    assert other.min_replicas == 1


def test_an_unrelated_change_passes_when_the_quota_was_lowered_below_what_exists(world):
    Endpoint.objects.filter(pk=world.a.endpoint.pk).update(min_replicas=3, max_replicas=10)
    world.a.tenant.quota_max_replicas = 2
    world.a.tenant.save()
    url = reverse("endpoint-detail", args=[world.a.endpoint.pk])
    assert world.client("a_admin").patch(url, {"ttft_slo_ms": 1500}, format="json").status_code == 200
    assert world.client("a_admin").patch(url, {"min_replicas": 4}, format="json").status_code == 400


def test_services_refuse_too(world):
    with pytest.raises(ValidationError) as refused:
        endpoint_create(
            owner_tenant=world.b.tenant,
            name="via-services",
            model_profile=ModelProfileFactory(),
            hardware_profile=HardwareProfileFactory(),
            min_replicas=2000,
            max_replicas=2000,
        )
    assert "max_replicas" in refused.value.message_dict
    with pytest.raises(ValidationError):
        endpoint_update(endpoint=world.b.endpoint, warm_pool_size=100)
    # A shared endpoint counts against no tenant.
    shared = endpoint_create(
        name="shared-big", model_profile=ModelProfileFactory(), hardware_profile=HardwareProfileFactory(),
        min_replicas=0, max_replicas=100,
    )  # fmt: skip
    assert shared.pk


def test_operator_moving_an_endpoint_to_a_tenant_is_checked_against_its_quota(world):
    shared = EndpointFactory(min_replicas=1, max_replicas=40)
    response = world.client("operator").patch(
        reverse("endpoint-detail", args=[shared.pk]), {"owner_tenant": world.a.tenant.pk}, format="json"
    )
    assert response.status_code == 400 and "max_replicas" in response.json()


# -- the quota resource -----------------------------------------------------------------------------------------
def test_tenant_reads_its_own_quota_only(world):
    own = world.client("a_member").get(reverse("tenant-quota-detail", args=[world.a.tenant.pk]))
    assert own.status_code == 200
    body = own.json()
    assert body["effective"] == {"max_endpoints": 10, "max_replicas": 16, "max_gpus": 16, "max_warm_pool": 4}
    assert body["committed"]["endpoints"] == 1
    assert world.client("a_admin").get(reverse("tenant-quota-detail", args=[world.b.tenant.pk])).status_code == 404
    listed = world.client("a_read_key").get(reverse("tenant-quota-list")).json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [row["tenant"] for row in rows] == [world.a.tenant.pk]


def test_only_operators_change_a_quota_and_the_raise_is_audited_and_approves_more(world):
    url = reverse("tenant-quota-detail", args=[world.a.tenant.pk])
    for who in ("a_admin", "a_write_key"):
        assert world.client(who).patch(url, {"max_replicas": 500}, format="json").status_code == 403
    too_big = _payload(name="approved-big", min_replicas=1, max_replicas=40)
    assert world.client("a_admin").post(reverse("endpoint-list"), too_big, format="json").status_code == 400
    raised = world.client("operator").patch(url, {"max_replicas": 64, "max_gpus": 64}, format="json")
    assert raised.status_code == 200, raised.content
    assert raised.json()["effective"]["max_replicas"] == 64
    entry = AuditEntry.objects.get(action="tenant.quota.update")
    assert entry.detail["changes"]["max_replicas"] == [None, 64] and entry.actor == world.operator
    assert world.client("a_admin").post(reverse("endpoint-list"), too_big, format="json").status_code == 201
    bad = world.client("operator").patch(url, {"max_gpus": -1}, format="json")
    assert bad.status_code == 400 and "max_gpus" in bad.json()
    reset = world.client("operator").patch(url, {"max_replicas": None}, format="json")
    assert reset.json()["effective"]["max_replicas"] == 16


def test_admin_quota_change_is_audited(world, client):
    world.operator.is_staff = True
    world.operator.save()
    client.force_login(world.operator)
    tenant = world.a.tenant
    response = client.post(
        reverse("admin:tenants_tenant_change", args=[tenant.pk]),
        {
            "name": tenant.name,
            "slug": tenant.slug,
            "is_active": "on",
            "created_at_0": tenant.created_at.strftime("%Y-%m-%d"),
            "created_at_1": tenant.created_at.strftime("%H:%M:%S"),
            "quota_max_gpus": "48",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    tenant.refresh_from_db()
    assert tenant.quota_max_gpus == 48
    entry = AuditEntry.objects.get(action="tenant.quota.update")
    assert entry.detail["changes"] == {"max_gpus": [None, 48]}
