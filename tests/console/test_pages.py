"""Console pages render for the right people, and a tenant never sees another tenant's objects."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from billing.alerts import slo_evaluate_all
from billing.models import Alert
from billing.rollups import usage_rollup_run
from capacity.models import AutoscalerDecision
from endpoints.models import ReplicaState
from tests.factories import EndpointFactory, ReplicaFactory, SLOFactory, UsageRecordFactory

pytestmark = pytest.mark.django_db

OPERATOR_PAGES = [
    "console:fleet",
    "console:endpoint-create",
    "console:tenants",
    "console:brownout",
    "console:reservation-sell",
    "console:cost",
    "console:planner",
    "console:planner-mix",
    "console:planner-pd",
]
TENANT_PAGES = ["console:tenant-home", "console:api-keys", "console:statement"]


def _world(tenant_a, tenant_b):
    now = timezone.now()
    for actors in (tenant_a, tenant_b):
        ReplicaFactory(endpoint=actors.endpoint, name=f"{actors.tenant.slug}-r1", state=ReplicaState.READY)
        slo = SLOFactory(endpoint=actors.endpoint, name=f"{actors.tenant.slug}-avail")
        Alert.objects.create(
            slo=slo,
            severity="page",
            state="firing",
            long_window="1h",
            short_window="5m",
            burn_rate_threshold=14.4,
            burn_rate_long=20,
            burn_rate_short=30,
        )
        AutoscalerDecision.objects.create(
            endpoint=actors.endpoint,
            axis="horizontal",
            current=1,
            desired=2,
            reason="demand up",
            at=now - timedelta(minutes=5),
        )
        for i in range(5):
            UsageRecordFactory(
                tenant=actors.tenant,
                endpoint=actors.endpoint,
                ttft_ms=100 + i * 50,
                tpot_ms=20,
                finished_at=now - timedelta(minutes=i + 1),
            )
    usage_rollup_run(now=now)  # what the beat does every minute: the console reads rollups and SLO statuses
    slo_evaluate_all(now=now)


def test_anonymous_is_sent_to_login(client):
    response = client.get(reverse("console:fleet"))
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert client.get("/").status_code == 302
    login = client.get("/accounts/login/")
    assert login.status_code == 200
    page = login.content.decode()
    # A forgotten password has a way back (the reset-by-email flow), and the tab has an icon.
    assert f'href="{reverse("password_reset")}"' in page
    assert client.get(reverse("password_reset")).status_code == 200
    assert 'rel="icon" href="/static/console/favicon.svg"' in page


def test_operator_sees_every_page_and_every_endpoint(client, operator, tenant_a, tenant_b):
    _world(tenant_a, tenant_b)
    client.force_login(operator)
    for name in OPERATOR_PAGES + ["console:slos"]:
        assert client.get(reverse(name)).status_code == 200, name
    fleet = client.get(reverse("console:fleet")).content.decode()
    assert "a-model" in fleet and "b-model" in fleet
    detail = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).content.decode()
    assert "<polyline" in detail  # charts have data
    assert "not evaluated yet" not in detail and "budget left" in detail
    assert "SLO 2000 ms" in detail  # TTFT chart carries the SLO line
    assert "demand up" in detail  # decision listed and marked
    assert "a-r1" in detail and "Drain" in detail
    assert client.get(reverse("console:home")).url == reverse("console:fleet")


def test_tenant_sees_only_its_endpoints(client, tenant_a, tenant_b):
    _world(tenant_a, tenant_b)
    client.force_login(tenant_a.member)
    for name in TENANT_PAGES + ["console:slos"]:
        page = client.get(reverse(name))
        assert page.status_code == 200, name
        assert "b-model" not in page.content.decode() and "b-avail" not in page.content.decode(), name
    home = client.get(reverse("console:tenant-home")).content.decode()
    assert "a-model" in home
    assert client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).status_code == 200
    assert client.get(reverse("console:endpoint", args=[tenant_b.endpoint.pk])).status_code == 404
    assert client.get(reverse("console:home")).url == reverse("console:tenant-home")


def test_tenant_gets_404_on_operator_pages_and_actions(client, tenant_a, tenant_b):
    _world(tenant_a, tenant_b)
    client.force_login(tenant_a.admin)
    for name in OPERATOR_PAGES:
        assert client.get(reverse(name)).status_code == 404, name
    replica = tenant_a.endpoint.replicas.get()
    assert client.get(reverse("console:replica-drain", args=[tenant_a.endpoint.pk, replica.pk])).status_code == 404
    assert client.post(reverse("console:endpoint-scale", args=[tenant_a.endpoint.pk]), {}).status_code == 404
    alert = Alert.objects.filter(slo__endpoint=tenant_a.endpoint).get()
    assert client.post(reverse("console:alert-ack", args=[alert.pk]), {"confirmed": "yes"}).status_code == 404
    other_key = tenant_b.key
    assert client.post(reverse("console:api-key-revoke", args=[other_key.pk])).status_code == 404
    other_key.refresh_from_db()
    assert other_key.revoked_at is None


def test_member_cannot_manage_keys(client, tenant_a):
    client.force_login(tenant_a.member)
    assert "Create a key" not in client.get(reverse("console:api-keys")).content.decode()
    response = client.post(
        reverse("console:api-key-create"),
        {"name": "x", "scopes": ["inference"], "max_priority": "standard", "confirmed": "yes"},
    )
    assert response.status_code == 404


def test_hold_decisions_are_not_marked(client, operator, tenant_a):
    now = timezone.now()
    for i in range(20):  # the autoscaler stores a "hold" every tick
        AutoscalerDecision.objects.create(
            endpoint=tenant_a.endpoint,
            axis="horizontal",
            current=2,
            desired=2,
            reason="hold",
            at=now - timedelta(seconds=5 * i),
        )
    AutoscalerDecision.objects.create(
        endpoint=tenant_a.endpoint, axis="horizontal", current=2, desired=3, reason="burst", at=now
    )
    client.force_login(operator)
    page = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).content.decode()
    assert page.count('class="marker"') == 1 and "burst" in page and ">hold<" not in page


def test_fleet_page_queries_do_not_grow_with_endpoints(client, operator, django_assert_max_num_queries):
    client.force_login(operator)
    for i in range(3):
        endpoint = EndpointFactory(name=f"fleet-{i}")
        ReplicaFactory(endpoint=endpoint, name=f"fleet-{i}-r")
        SLOFactory(endpoint=endpoint)
    with CaptureQueriesContext(connection) as three:
        assert client.get(reverse("console:fleet")).status_code == 200
    for i in range(3, 9):
        endpoint = EndpointFactory(name=f"fleet-{i}")
        ReplicaFactory(endpoint=endpoint, name=f"fleet-{i}-r")
        SLOFactory(endpoint=endpoint)
    with django_assert_max_num_queries(len(three.captured_queries)):
        assert client.get(reverse("console:fleet")).status_code == 200
