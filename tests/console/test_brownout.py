"""The console's brownout page: per tenant and endpoint called, how often overload served its requests shorter,
from the fallback, or shed them, against its reservation, from the usage records; operators only."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from console.selectors import brownout_rows
from tests.factories import EndpointFactory, UsageRecordFactory

pytestmark = pytest.mark.django_db


def _usage(tenant, endpoint, served_by, *, n, degradation="", status="ok", mu=1.0, ago=timedelta(minutes=5)):
    at = timezone.now() - ago
    for _ in range(n):
        UsageRecordFactory(
            tenant=tenant,
            endpoint=served_by,
            requested_endpoint=endpoint,
            degradation=degradation,
            status=status,
            mu=mu if status == "ok" else 0.0,
            started_at=at,
            finished_at=at,
        )


def test_rows_count_degraded_fallback_and_shed_against_the_reservation(tenant_a, tenant_b):
    small = EndpointFactory(name="small")
    a_model = tenant_a.endpoint  # A reserves on it (the fixture's reservation)
    _usage(tenant_a.tenant, a_model, a_model, n=6)
    _usage(tenant_a.tenant, a_model, a_model, n=2, degradation="degraded")
    _usage(tenant_a.tenant, a_model, small, n=3, degradation="fallback")
    _usage(tenant_a.tenant, a_model, a_model, n=1, status="shed")
    _usage(tenant_b.tenant, small, small, n=3, status="shed")
    _usage(tenant_b.tenant, small, small, n=4, mu=60.0)  # best effort: 4 MU/min over an hour, all of it excess
    _usage(tenant_b.tenant, small, small, n=5, status="shed", ago=timedelta(hours=3))  # outside the hour
    now = timezone.now()
    rows = {(r.tenant, r.endpoint): r for r in brownout_rows(since=now - timedelta(hours=1), now=now)}
    a = rows[(tenant_a.tenant.name, a_model.name)]
    assert (a.requests, a.degraded, a.fallback, a.shed) == (12, 2, 3, 1)
    assert a.reserved_mu_per_min == tenant_a.tenant.reservations.get().mu_per_min
    b = rows[(tenant_b.tenant.name, "small")]
    assert (b.requests, b.shed, b.reserved_mu_per_min) == (7, 3, None)
    assert b.used_mu_per_min == pytest.approx(4.0) and b.over_reservation_mu_per_min == pytest.approx(4.0)
    assert (a.shed_share, b.shed_share) == (0.25, 0.75)


def test_the_page_is_for_operators(client, operator, tenant_a):
    _usage(tenant_a.tenant, tenant_a.endpoint, tenant_a.endpoint, n=2, status="shed")
    client.force_login(tenant_a.member)
    assert client.get(reverse("console:brownout")).status_code == 404
    client.force_login(operator)
    page = client.get(reverse("console:brownout")).content.decode()
    assert tenant_a.tenant.name in page and "a-model" in page and "100%" in page
    assert client.get(reverse("console:brownout") + "?window=24h").status_code == 200
