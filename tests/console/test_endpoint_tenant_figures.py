"""A tenant reserving on a shared endpoint sees its own figures on the endpoint page, never the endpoint's totals
(other tenants' sales, use, queues and the autoscaler's demand reasons), as the API's ledger already does."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from billing.rollups import usage_rollup_run
from capacity.models import AutoscalerDecision
from console.selectors import endpoint_series
from endpoints.models import ReplicaState
from tests.factories import EndpointFactory, ReplicaFactory, ReservationFactory, UsageRecordFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(tenant_a, tenant_b):
    now = timezone.now()
    endpoint = EndpointFactory(name="shared-70b")
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, actuator="local", actuator_ref="4242")
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=100.0)
    ReservationFactory(tenant=tenant_b.tenant, endpoint=endpoint, mu_per_min=5000.0)
    for tenant, n in ((tenant_a.tenant, 2), (tenant_b.tenant, 9)):
        for i in range(n):
            UsageRecordFactory(tenant=tenant, endpoint=endpoint, finished_at=now - timedelta(minutes=2, seconds=i))
    usage_rollup_run(now=now)
    AutoscalerDecision.objects.create(
        endpoint=endpoint, axis="horizontal", current=1, desired=3, reason="scale up: b-secret-demand", at=now
    )
    return endpoint


def test_reserving_tenant_sees_only_its_own_figures(client, tenant_a, shared):
    client.force_login(tenant_a.member)
    page = client.get(reverse("console:endpoint", args=[shared.pk])).content.decode()
    assert 'id="own-figures"' in page and "100.0 MU/min" in page
    assert "5,100.0" not in page and "5,000.0" not in page  # sold in total, and tenant B's reservation
    assert "b-secret-demand" not in page  # the autoscaler's reasons are every tenant's demand
    assert "4242" not in page  # the replica's pid
    assert "Queue depth by class" not in page


def test_operator_and_owner_still_see_the_totals(client, operator, tenant_a, shared):
    client.force_login(operator)
    page = client.get(reverse("console:endpoint", args=[shared.pk])).content.decode()
    assert "5,100.0" in page and "b-secret-demand" in page and "4242" in page
    client.force_login(tenant_a.member)
    own = client.get(reverse("console:endpoint", args=[tenant_a.endpoint.pk])).content.decode()
    assert "Queue depth by class" in own and 'id="own-figures"' not in own


def test_the_series_of_a_tenant_counts_its_own_requests(tenant_a, tenant_b, shared):
    now = timezone.now()
    every = endpoint_series(endpoint=shared, now=now)
    mine = endpoint_series(endpoint=shared, now=now, tenant_id=tenant_a.tenant.pk)
    assert round(sum(v for v in every.requests_per_s if v is not None) * 60) == 11
    assert round(sum(v for v in mine.requests_per_s if v is not None) * 60) == 2
