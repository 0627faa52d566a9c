"""A suspended tenant (``is_active`` off): its people cannot log in, their open sessions stop working on the REST API
and the console, its keys are refused; operators carry on; setting it active again gives everything back. The
suspension, after commit, drains the tenant's replicas (a worker task, eager under test settings)."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from endpoints.models import Replica, ReplicaState
from tenants.models import AuditEntry
from tenants.services import tenant_update

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple 42"


def _session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)  # a real session: authentication runs on every request, unlike force_authenticate
    return client


def _set_active(world, active: bool) -> None:
    tenant_update(tenant=world.a.tenant, actor=world.operator, is_active=active)


def test_open_sessions_and_keys_are_refused_then_restored(world):
    admin, member = _session(world.a.admin), _session(world.a.member)
    key = APIClient()
    key.credentials(HTTP_AUTHORIZATION=f"Bearer {world.a.raw_key}")
    assert admin.get("/api/v1/me/").status_code == 200
    # When A is suspended
    _set_active(world, False)
    # Then its admin can neither scale, create nor mint; its member and key read nothing
    endpoint = world.a.endpoint
    assert admin.post(f"/api/v1/endpoints/{endpoint.pk}/scale/", {"desired_replicas": 2}).status_code == 401
    assert admin.post("/api/v1/api-keys/", {"name": "x", "scopes": ["read"]}).status_code == 401
    assert admin.post("/api/v1/users/", {"username": "sneaky", "password": PASSWORD}).status_code == 401
    assert member.get("/api/v1/endpoints/").status_code == 401
    assert key.get("/api/v1/endpoints/").status_code == 401
    # And B and the operators are untouched
    assert _session(world.b.admin).get("/api/v1/endpoints/").status_code == 200
    assert _session(world.operator).get(f"/api/v1/tenants/{world.a.tenant.pk}/").status_code == 200
    # When reactivated, then the same session and key work again
    _set_active(world, True)
    assert admin.get("/api/v1/endpoints/").status_code == 200
    assert key.get("/api/v1/endpoints/").status_code == 200


def test_console_login_and_held_sessions_are_refused(world):
    world.a.admin.set_password(PASSWORD)
    world.a.admin.save()
    held = Client()
    held.force_login(world.a.admin)
    _set_active(world, False)
    assert held.get("/console/tenant/").status_code == 302
    fresh = Client()
    fresh.post("/accounts/login/", {"username": world.a.admin.username, "password": PASSWORD})
    assert "_auth_user_id" not in fresh.session
    _set_active(world, True)
    fresh.post("/accounts/login/", {"username": world.a.admin.username, "password": PASSWORD})
    assert fresh.get("/console/tenant/").status_code == 200


def test_an_operator_linked_to_a_tenant_is_never_suspended_with_it(world):
    world.operator.tenant = world.a.tenant
    world.operator.save()
    _set_active(world, False)
    assert _session(world.operator).get("/api/v1/tenants/").status_code == 200


def test_suspension_drains_ready_replicas_and_stops_booting_ones(world, django_capture_on_commit_callbacks):
    # Given A's endpoint run by the local actuator: two ready replicas and one booting
    endpoint = world.a.endpoint
    endpoint.launch_options = {"actuator": "local"}
    endpoint.save()
    ready = [
        Replica.objects.create(endpoint=endpoint, name=f"r{i}", state=ReplicaState.READY, actuator="local")
        for i in range(2)
    ]
    booting = Replica.objects.create(endpoint=endpoint, name="boot", state=ReplicaState.STARTING, actuator="local")
    hand = Replica.objects.create(endpoint=world.b.endpoint, name="b-r", state=ReplicaState.READY, actuator="local")
    # When an operator suspends A through the API, and the transaction commits
    with django_capture_on_commit_callbacks(execute=True):
        response = _session(world.operator).patch(f"/api/v1/tenants/{world.a.tenant.pk}/", {"is_active": False})
    assert response.status_code == 200
    # Then the ready replicas drain (their streams finish), the booting one stops, B's replica is untouched
    states = {r.name: Replica.objects.get(pk=r.pk).state for r in (*ready, booting, hand)}
    assert states == {"r0": "draining", "r1": "draining", "boot": "stopped", "b-r": "ready"}
    assert AuditEntry.objects.filter(action="tenant.suspend_drain", tenant=world.a.tenant).exists()
    assert AuditEntry.objects.filter(action="tenant.update", tenant=world.a.tenant).exists()
