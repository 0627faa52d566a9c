"""Billing API: budgets, alerts and acknowledging, webhooks, cost reports with CSV, statements — tenant-isolated."""

from datetime import UTC, datetime, timedelta

import pytest

from billing.models import Alert, CostReport, SLOStatus, Webhook
from tenants.models import CapacityReservation
from tests.billing.conftest import PUBLIC_IP
from tests.conftest import client_for
from tests.factories import SLOFactory

NOW = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)


@pytest.fixture
def world(tenant_a, tenant_b):
    # The reservations exist from before the periods the tests ask about, whatever today's date is.
    CapacityReservation.objects.update(created_at=NOW - timedelta(days=60))
    slo_a = SLOFactory(endpoint=tenant_a.endpoint, tenant=tenant_a.tenant, name="a-availability")
    slo_b = SLOFactory(endpoint=tenant_b.endpoint, tenant=tenant_b.tenant, name="b-availability")
    for slo, remaining in ((slo_a, 0.25), (slo_b, 0.9)):
        SLOStatus.objects.create(
            slo=slo, evaluated_at=NOW, burn_rates={"5m": 20.0, "1h": 15.0}, budget_remaining=remaining
        )
    alert_a = Alert.objects.create(
        slo=slo_a,
        severity="page",
        state="firing",
        long_window="1h",
        short_window="5m",
        burn_rate_threshold=14.4,
        fired_at=NOW,
    )
    alert_b = Alert.objects.create(
        slo=slo_b,
        severity="ticket",
        state="firing",
        long_window="3d",
        short_window="6h",
        burn_rate_threshold=1,
    )
    for tenant, endpoint in ((tenant_a.tenant, tenant_a.endpoint), (tenant_b.tenant, tenant_b.endpoint)):
        for who in (None, tenant):
            CostReport.objects.create(
                granularity="hour",
                start=NOW,
                end=NOW + timedelta(hours=1),
                endpoint=endpoint,
                tenant=who,
                usd=2.5,
                gpu_hours=1.0,
                good_output_tokens=1000,
                good_tokens_per_usd=400.0,
            )
    return {"slo_a": slo_a, "slo_b": slo_b, "alert_a": alert_a, "alert_b": alert_b}


def test_budgets_show_only_own_slos(world, tenant_a, operator):
    body = client_for(tenant_a.member).get("/api/v1/slo-budgets/").json()
    assert [b["name"] for b in body] == ["a-availability"]
    assert body[0]["budget_remaining"] == 0.25 and body[0]["health"] == "page"
    assert body[0]["firing"] == ["page 1h/5m"] and body[0]["burn_rates"]["5m"] == 20.0
    assert client_for(tenant_a.member).get(f"/api/v1/slo-budgets/{world['slo_b'].pk}/").status_code == 404
    assert len(client_for(operator).get("/api/v1/slo-budgets/").json()) == 2


def test_alerts_list_and_acknowledge(world, tenant_a):
    listed = client_for(tenant_a.member).get("/api/v1/alerts/").json()["results"]
    assert [a["id"] for a in listed] == [world["alert_a"].pk]
    # Members read; admins acknowledge; another tenant's alert does not exist for them.
    assert client_for(tenant_a.member).post(f"/api/v1/alerts/{world['alert_a'].pk}/acknowledge/").status_code == 403
    assert client_for(tenant_a.admin).post(f"/api/v1/alerts/{world['alert_b'].pk}/acknowledge/").status_code == 404
    response = client_for(tenant_a.admin).post(f"/api/v1/alerts/{world['alert_a'].pk}/acknowledge/")
    assert response.status_code == 200
    assert response.json()["acknowledged_by"] == "a-admin" and response.json()["state"] == "firing"


def test_webhooks_are_tenant_scoped(world, tenant_a, tenant_b, operator, fake_dns):
    fake_dns.names.update({"hooks.example": [PUBLIC_IP], "h.example": [PUBLIC_IP]})
    admin = client_for(tenant_a.admin)
    created = admin.post(
        "/api/v1/webhooks/",
        {
            "name": "pager",
            "url": "https://hooks.example/a",
            "secret": "x",
            "severities": ["page"],
            "tenant": tenant_b.tenant.pk,
        },
        format="json",
    )
    assert created.status_code == 400  # another tenant's id is "does not exist"
    created = admin.post(
        "/api/v1/webhooks/",
        {"name": "pager", "url": "https://hooks.example/a", "secret": "x", "severities": ["page"]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert "secret" not in created.json()
    assert Webhook.objects.get(name="pager").tenant == tenant_a.tenant
    assert admin.post("/api/v1/webhooks/", {"name": "x", "url": "ftp://nope"}, format="json").status_code == 400
    for internal in ("http://127.0.0.1:8000/", "http://10.1.2.3/hook", "http://localhost/x", "http://[::1]/"):
        assert admin.post("/api/v1/webhooks/", {"name": "x", "url": internal}, format="json").status_code == 400
    # Operators may (their alert router may well live inside the network).
    ops = client_for(operator).post("/api/v1/webhooks/", {"name": "ops", "url": "http://10.0.0.5/hook"}, format="json")
    assert ops.status_code == 201 and ops.json()["tenant"] is None
    bad_severity = admin.post(
        "/api/v1/webhooks/", {"name": "x", "url": "https://h.example", "severities": ["sms"]}, format="json"
    )
    assert bad_severity.status_code == 400
    assert client_for(tenant_b.admin).get("/api/v1/webhooks/").json()["results"] == []
    assert (
        client_for(tenant_a.member).post("/api/v1/webhooks/", {"name": "m", "url": "https://h.example"}).status_code
        == 403
    )


def test_cost_reports_scoped_and_exported_as_csv(world, tenant_a, operator):
    rows = client_for(tenant_a.member).get("/api/v1/cost-reports/?granularity=hour").json()["results"]
    assert {(r["endpoint_name"], r["tenant_slug"]) for r in rows} == {("a-model", None), ("a-model", "tenant-a")}
    assert len(client_for(operator).get("/api/v1/cost-reports/").json()["results"]) == 4
    response = client_for(tenant_a.member).get("/api/v1/cost-reports/export/?granularity=hour")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    lines = response.content.decode().strip().splitlines()
    assert len(lines) == 3 and "b-model" not in response.content.decode()
    assert client_for(operator).get("/api/v1/cost-reports/?start=yesterday").status_code == 400
    assert client_for(operator).get("/api/v1/cost-reports/?granularity=week").status_code == 400


def test_live_costs_and_statements(world, tenant_a, tenant_b, operator):
    live = client_for(tenant_a.member).get("/api/v1/cost-reports/live/?start=2026-11-28&end=2026-11-29")
    assert live.status_code == 200
    assert {(ln["endpoint"], ln["tenant"]) for ln in live.json()} <= {("a-model", None), ("a-model", "tenant-a")}
    bad = client_for(tenant_a.member).get("/api/v1/cost-reports/live/?start=2026-11-29&end=2026-11-28")
    assert bad.status_code == 400
    statement = client_for(tenant_a.member).get("/api/v1/statements/?start=2026-11-01&end=2026-12-01").json()
    assert statement["tenant"] == "tenant-a"
    assert statement["lines"][0]["reserved_mu_per_min"] == 100.0
    assert client_for(tenant_a.member).get(f"/api/v1/statements/?tenant={tenant_b.tenant.pk}").status_code == 404
    assert client_for(operator).get("/api/v1/statements/").status_code == 400
    assert client_for(operator).get(f"/api/v1/statements/?tenant={tenant_b.tenant.pk}").json()["tenant"] == "tenant-b"
    assert client_for(operator).get("/api/v1/statements/?tenant=abc").status_code == 400


def test_anonymous_is_refused(world, api_client):
    for url in ("/api/v1/slo-budgets/", "/api/v1/alerts/", "/api/v1/cost-reports/", "/api/v1/statements/"):
        assert api_client.get(url).status_code in (401, 403)
