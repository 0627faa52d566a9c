"""Autoscaler decisions over the API: read-only, and a tenant sees only its own endpoints' decisions."""

import pytest

from capacity.models import AutoscalerDecision
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

URL = "/api/v1/autoscaler-decisions/"


def decision(endpoint, axis="horizontal", tick="", **kw):
    return AutoscalerDecision.objects.create(
        endpoint=endpoint, axis=axis, current=1, desired=2, reason="scale up: demand needs 1.40 replicas",
        inputs={"up_need": 1.4}, applied=True, tick=tick, **kw,
    )  # fmt: skip


def ids(response):
    body = response.json()
    return {row["id"] for row in (body["results"] if isinstance(body, dict) else body)}


def test_tenants_see_only_their_endpoints_decisions(tenant_a, tenant_b, operator):
    a = decision(tenant_a.endpoint, tick="h-1")
    a_vertical = decision(tenant_a.endpoint, axis="vertical", tick="v-1")
    b = decision(tenant_b.endpoint, tick="h-1")
    for user in (tenant_a.admin, tenant_a.member):
        response = client_for(user).get(URL)
        assert response.status_code == 200
        assert ids(response) == {a.pk, a_vertical.pk}
    assert client_for(tenant_a.member).get(f"{URL}{b.pk}/").status_code == 404
    detail = client_for(tenant_a.member).get(f"{URL}{a.pk}/").json()
    assert detail["inputs"] == {"up_need": 1.4} and detail["endpoint_name"] == tenant_a.endpoint.name
    assert ids(client_for(operator).get(URL)) == {a.pk, a_vertical.pk, b.pk}
    assert ids(client_for(tenant_a.admin).get(URL, {"axis": "vertical"})) == {a_vertical.pk}


def test_decisions_are_read_only(tenant_a, operator, api_client):
    a = decision(tenant_a.endpoint)
    for user in (tenant_a.admin, operator):
        client = client_for(user)
        assert client.post(URL, {"endpoint": tenant_a.endpoint.pk}, format="json").status_code in (403, 405)
        assert client.delete(f"{URL}{a.pk}/").status_code in (403, 405)
    assert api_client.get(URL).status_code in (401, 403)
