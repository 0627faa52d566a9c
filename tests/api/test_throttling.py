"""REST API throttles: per API key, per person and per anonymous address, answering 429 with Retry-After."""

import uuid

import pytest
from django.conf import settings
from django.test import override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.services import api_key_create
from tenants.throttling import AnonymousRateThrottle, PrincipalRateThrottle


@pytest.fixture(autouse=True)
def low_rates(monkeypatch):
    """Low rates, and counters no other test or earlier run shares (the cache is the real Redis)."""
    run = uuid.uuid4().hex
    for throttle in (PrincipalRateThrottle, AnonymousRateThrottle):
        monkeypatch.setattr(throttle, "cache_format", f"throttle-test-{run}-%(scope)s-%(ident)s")
    rates = {"principal": "3/min", "anon": "2/min"}
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}):
        yield


def _key_client(world) -> APIClient:
    _, raw = api_key_create(tenant=world.a.tenant, name="busy", scopes=["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _assert_throttled(response):
    assert response.status_code == 429, response.content
    assert 1 <= int(response["Retry-After"]) <= 60
    assert "throttled" in response.json()["detail"].lower()


def test_each_api_key_has_its_own_budget(world):
    busy, other = _key_client(world), _key_client(world)
    url = reverse("endpoint-list")
    assert [busy.get(url).status_code for _ in range(3)] == [200, 200, 200]
    _assert_throttled(busy.get(url))
    assert other.get(url).status_code == 200


def test_a_person_is_throttled_across_routes(world):
    client = world.client("a_member")
    statuses = [client.get(reverse(name)).status_code for name in ("me", "endpoint-list", "user-list")]
    assert statuses == [200, 200, 200]
    _assert_throttled(client.get(reverse("api-key-list")))
    assert world.client("a_admin").get(reverse("me")).status_code == 200


def test_anonymous_calls_are_throttled_per_address(world):
    client = APIClient()
    assert [client.get(reverse("api-root")).status_code for _ in range(2)] == [200, 200]
    _assert_throttled(client.get(reverse("api-root")))
    assert client.get(reverse("api-root"), REMOTE_ADDR="192.0.2.55").status_code == 200
