"""Books of LoRA adapter traffic (docs/lora-serving.md): usage records name the adapter and can be filtered by it, and a
tenant's statement breaks its base endpoint's used MU down by adapter, its own only."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from billing.statements import statement_for
from tests.factories import UsageRecordFactory

pytestmark = pytest.mark.django_db

AT = timezone.now() - timedelta(hours=2)


def _usage(actors, adapter: str, n: int, mu: float) -> None:
    for i in range(n):
        UsageRecordFactory(
            tenant=actors.tenant, endpoint=actors.endpoint, adapter=adapter, mu=mu, output_tokens=10,
            started_at=AT + timedelta(minutes=i), finished_at=AT + timedelta(minutes=i),
        )  # fmt: skip


def test_usage_api_names_and_filters_by_adapter(tenant_a, tenant_b):
    _usage(tenant_a, "a-ft", 2, 1.5)
    _usage(tenant_a, "", 1, 1.0)
    _usage(tenant_b, "a-ft", 1, 9.0)  # another tenant's records under the same name stay its own
    client = APIClient()
    client.force_authenticate(tenant_a.admin)
    rows = client.get("/api/v1/usage/?adapter=a-ft").json()["results"]
    assert [r["adapter"] for r in rows] == ["a-ft", "a-ft"] and {r["tenant"] for r in rows} == {tenant_a.tenant.pk}
    assert len(client.get("/api/v1/usage/").json()["results"]) == 3


def test_statement_lines_break_used_mu_down_by_adapter(tenant_a, tenant_b):
    _usage(tenant_a, "a-ft", 2, 1.5)
    _usage(tenant_a, "a-other-ft", 1, 4.0)
    _usage(tenant_a, "", 3, 1.0)
    _usage(tenant_b, "b-ft", 5, 1.0)
    statement = statement_for(tenant=tenant_a.tenant, start=AT - timedelta(hours=1), end=timezone.now())
    [line] = [line for line in statement.as_dict()["lines"] if line["endpoint"] == tenant_a.endpoint.name]
    assert line["adapters"] == [
        {"adapter": "a-ft", "requests": 2, "mu": 3.0, "output_tokens": 20},
        {"adapter": "a-other-ft", "requests": 1, "mu": 4.0, "output_tokens": 10},
    ]
