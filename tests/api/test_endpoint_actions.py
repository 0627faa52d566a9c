"""Endpoint scale / update / delete rules beyond plain CRUD, and the shared-endpoint visibility rule."""

from django.urls import reverse

from endpoints.models import Endpoint
from tenants.models import AuditEntry
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory


def _scale(client, endpoint, desired, **extra):
    return client.post(
        reverse("endpoint-scale", args=[endpoint.pk]), {"desired_replicas": desired, **extra}, format="json"
    )


def test_scale_sets_desired_within_bounds_and_audits(world):
    endpoint = world.a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, max_replicas=4)
    response = _scale(world.client("a_admin"), endpoint, 3, reason="launch day")
    assert response.status_code == 200, response.content
    assert response.json()["desired_replicas"] == 3
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 3
    entry = AuditEntry.objects.get(action="endpoint.scale", object_id=str(endpoint.pk))
    pinned_until = response.json()["scale_pin"]["until"].replace("Z", "+00:00")
    assert entry.detail == {"from": 1, "to": 3, "reason": "launch day", "pinned_until": pinned_until}
    assert entry.actor == world.a.admin and entry.tenant == world.a.tenant


def test_scale_outside_bounds_is_400_and_changes_nothing(world):
    endpoint = world.a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, max_replicas=4, desired_replicas=2)
    client = world.client("operator")
    for body in (
        {"desired_replicas": 5},
        {"desired_replicas": 0},
        {"desired_replicas": -1},
        {"desired_replicas": "x"},
        {},
    ):
        response = client.post(reverse("endpoint-scale", args=[endpoint.pk]), body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert "desired_replicas" in response.json()
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 2


def test_scale_permissions(world):
    assert _scale(world.client("a_member"), world.a.endpoint, 2).status_code == 403
    assert _scale(world.client("a_read_key"), world.a.endpoint, 2).status_code == 403
    assert _scale(world.client("a_write_key"), world.a.endpoint, 2).status_code == 200
    assert _scale(world.client("a_admin"), world.b.endpoint, 2).status_code == 404
    world.b.endpoint.refresh_from_db()
    assert world.b.endpoint.desired_replicas == 1


def test_shared_endpoint_is_visible_to_reserving_tenant_but_only_operators_change_it(world):
    shared = EndpointFactory(name="shared-70b")
    ReservationFactory(tenant=world.a.tenant, endpoint=shared)
    a_admin = world.client("a_admin")
    listed = {row["name"] for row in a_admin.get(reverse("endpoint-list")).json()["results"]}
    assert "shared-70b" in listed
    assert "shared-70b" not in {
        row["name"] for row in world.client("b_admin").get(reverse("endpoint-list")).json()["results"]
    }
    assert (
        a_admin.patch(reverse("endpoint-detail", args=[shared.pk]), {"max_replicas": 9}, format="json").status_code
        == 403
    )
    assert _scale(a_admin, shared, 2).status_code == 403
    assert a_admin.delete(reverse("endpoint-detail", args=[shared.pk])).status_code == 403
    assert world.client("b_admin").get(reverse("endpoint-detail", args=[shared.pk])).status_code == 404
    assert _scale(world.client("operator"), shared, 2).status_code == 200


def test_tenant_created_endpoint_is_owned_by_that_tenant_whatever_the_payload(world):
    payload = {
        "name": "mine",
        "model_profile": world.a.endpoint.model_profile_id,
        "hardware_profile": world.a.endpoint.hardware_profile_id,
        "owner_tenant": world.b.tenant.pk,
    }
    response = world.client("a_admin").post(reverse("endpoint-list"), payload, format="json")
    # Pointing at another tenant is refused outright (it does not exist for tenant A).
    assert response.status_code == 400 and "owner_tenant" in response.json()
    del payload["owner_tenant"]
    response = world.client("a_admin").post(reverse("endpoint-list"), payload, format="json")
    assert response.status_code == 201
    assert Endpoint.objects.get(name="mine").owner_tenant == world.a.tenant
    assert response.json()["desired_replicas"] == 1


def test_tenant_cannot_move_its_endpoint_to_shared(world):
    response = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[world.a.endpoint.pk]), {"owner_tenant": None}, format="json"
    )
    assert response.status_code == 400 and "owner_tenant" in response.json()


def test_update_clamps_desired_into_new_bounds(world):
    endpoint = world.a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, max_replicas=8, desired_replicas=6)
    response = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[endpoint.pk]), {"max_replicas": 4}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["desired_replicas"] == 4
    assert AuditEntry.objects.get(action="endpoint.update", object_id=str(endpoint.pk)).detail == {
        "changes": {"max_replicas": [8, 4]}
    }


def test_desired_replicas_is_not_writable_by_update(world):
    endpoint = world.a.endpoint
    response = world.client("a_admin").patch(
        reverse("endpoint-detail", args=[endpoint.pk]), {"desired_replicas": 3}, format="json"
    )
    assert response.status_code == 200
    endpoint.refresh_from_db()
    assert endpoint.desired_replicas == 1


def test_delete_refused_while_replicas_are_active(world):
    endpoint = EndpointFactory(owner_tenant=world.a.tenant)
    replica = ReplicaFactory(endpoint=endpoint, state="ready")
    client = world.client("a_admin")
    response = client.delete(reverse("endpoint-detail", args=[endpoint.pk]))
    assert response.status_code == 400 and "replicas" in response.json()
    assert Endpoint.objects.filter(pk=endpoint.pk).exists()
    type(replica).objects.filter(pk=replica.pk).update(state="stopped")
    assert client.delete(reverse("endpoint-detail", args=[endpoint.pk])).status_code == 204
    assert AuditEntry.objects.filter(action="endpoint.delete", object_id=str(endpoint.pk)).exists()


def test_profile_in_use_cannot_be_deleted(world):
    profile = world.a.endpoint.hardware_profile
    response = world.client("operator").delete(reverse("hardware-profile-detail", args=[profile.pk]))
    assert response.status_code == 409
    assert world.a.endpoint.name in response.json()["detail"]
    assert type(profile).objects.filter(pk=profile.pk).exists()


def test_replica_detail_shows_its_transitions(world):
    from endpoints.services import replica_transition

    replica = ReplicaFactory(endpoint=world.a.endpoint, state="pending")
    replica_transition(replica=replica, to_state="starting", reason="actuator")
    body = world.client("a_member").get(reverse("replica-detail", args=[replica.pk])).json()
    assert body["state"] == "starting"
    assert [(t["from_state"], t["to_state"], t["reason"]) for t in body["transitions"]] == [
        ("pending", "starting", "actuator")
    ]


def test_pinned_benchmark_must_be_a_finished_run_of_the_same_pair(world):
    from capacity.models import CapacityBenchmark
    from tests.factories import ModelProfileFactory

    endpoint = world.a.endpoint
    mine = dict(model_profile=endpoint.model_profile, hardware_profile=endpoint.hardware_profile)
    running = CapacityBenchmark.objects.create(version=1, **mine)
    other_model = CapacityBenchmark.objects.create(
        version=1,
        status="succeeded",
        model_profile=ModelProfileFactory(name="other"),
        hardware_profile=endpoint.hardware_profile,
    )
    good = CapacityBenchmark.objects.create(version=2, status="succeeded", **mine)
    client, url = world.client("operator"), reverse("endpoint-detail", args=[endpoint.pk])
    for bad in (running, other_model):
        response = client.patch(url, {"pinned_benchmark": bad.pk}, format="json")
        assert response.status_code == 400 and "pinned_benchmark" in response.json(), response.content
    assert client.patch(url, {"pinned_benchmark": good.pk}, format="json").json()["pinned_benchmark"] == good.pk


def test_tenant_with_usage_or_running_replicas_cannot_be_deleted(world):
    from tenants.models import Tenant
    from tests.factories import UsageRecordFactory

    client = world.client("operator")
    replica = ReplicaFactory(endpoint=world.a.endpoint, state="ready")
    response = client.delete(reverse("tenant-detail", args=[world.a.tenant.pk]))
    assert response.status_code == 400 and "replicas" in str(response.json())
    type(replica).objects.filter(pk=replica.pk).update(state="stopped")
    UsageRecordFactory(tenant=world.a.tenant, endpoint=world.a.endpoint)
    response = client.delete(reverse("tenant-detail", args=[world.a.tenant.pk]))
    assert response.status_code == 400 and "is_active" in str(response.json())
    assert Tenant.objects.filter(pk=world.a.tenant.pk).exists()
