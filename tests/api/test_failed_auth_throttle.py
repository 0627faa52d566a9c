"""Failed authentications per client address: bad API keys and wrong passwords share one per-address budget; past
it the address gets 429 with Retry-After before any key is looked up, on the API and on both login pages. Client
addresses ignore X-Forwarded-For unless NUM_PROXIES says how many proxies in front append to it."""

import secrets

import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.throttling import LoginLimits, auth_failures_forget

LIMITS = {"failures_per_user_address": 100, "failures_per_address": 3, "window_s": 600}


def _address() -> str:
    # Random, so no earlier run's counts (the cache is the real Redis) are met.
    return f"2001:db8:{secrets.token_hex(2)}::{secrets.token_hex(2)}"


@pytest.fixture
def addresses():
    used: list[str] = []

    def new() -> str:
        used.append(_address())
        return used[-1]

    with override_settings(INFERCAP={**settings.INFERCAP, "LOGIN_THROTTLE": LIMITS}):
        yield new
    limits = LoginLimits(**LIMITS)
    for address in used:
        auth_failures_forget(address=address, limits=limits)
        cache.delete(f"throttle_anon_{address}")


def _keyed(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _bad_key() -> APIClient:
    return _keyed(f"ick_{secrets.token_hex(16)}")


def test_bad_keys_from_one_address_are_throttled_before_any_lookup(tenant_a, addresses):
    address, elsewhere = addresses(), addresses()
    url = reverse("endpoint-list")
    assert [_bad_key().get(url, REMOTE_ADDR=address).status_code for _ in range(3)] == [401] * 3
    with CaptureQueriesContext(connection) as queries:
        refused = _bad_key().get(url, REMOTE_ADDR=address)
    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused["Retry-After"]) <= LIMITS["window_s"]
    assert "too many failed authentications" in refused.json()["detail"]
    assert len(queries) == 0
    # The right key from that address waits too (else the guess that worked would show); elsewhere it works.
    assert _keyed(tenant_a.raw_key).get(url, REMOTE_ADDR=address).status_code == 429
    assert _keyed(tenant_a.raw_key).get(url, REMOTE_ADDR=elsewhere).status_code == 200
    assert _bad_key().get(url, REMOTE_ADDR=elsewhere).status_code == 401


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_bad_keys_lock_the_login_pages_of_that_address_with_a_429(url, operator, addresses):
    address = addresses()
    for _ in range(3):
        _bad_key().get(reverse("endpoint-list"), REMOTE_ADDR=address)
    client = Client()
    refused = client.post(url, {"username": "operator", "password": "pw-for-tests-123"}, REMOTE_ADDR=address)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= LIMITS["window_s"]
    assert b"Too many failed login attempts" in refused.content
    assert "_auth_user_id" not in client.session


def test_wrong_passwords_count_against_api_keys_of_the_address(tenant_a, addresses):
    address = addresses()
    for n in range(3):
        wrong = Client().post("/accounts/login/", {"username": f"nobody-{n}", "password": "x"}, REMOTE_ADDR=address)
        assert wrong.status_code == 200
    assert _keyed(tenant_a.raw_key).get(reverse("endpoint-list"), REMOTE_ADDR=address).status_code == 429


def _anonymous_statuses(remote: str, forwarded: list[str]) -> list[int]:
    client = APIClient()
    return [client.get(reverse("api-root"), REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=f).status_code for f in forwarded]


@pytest.fixture
def anon_two_per_minute():
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "anon": "2/min"}
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}):
        yield


def test_a_rotated_forwarded_for_does_not_escape_the_anonymous_throttle(db, addresses, anon_two_per_minute):
    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == 0
    statuses = _anonymous_statuses(addresses(), [f"198.51.100.{n}" for n in range(4)])
    assert statuses == [200, 200, 429, 429]


def test_behind_one_proxy_the_address_it_appended_counts(db, addresses, anon_two_per_minute):
    ingress, client, neighbour = addresses(), addresses(), addresses()
    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}):
        assert _anonymous_statuses(ingress, [f"10.0.0.{n}, {client}" for n in range(3)]) == [200, 200, 429]
        assert _anonymous_statuses(ingress, [neighbour]) == [200]
        # And the login lock-out counts the same address: the ingress's own is never the one locked.
        for _ in range(3):
            _bad_key().get(reverse("endpoint-list"), REMOTE_ADDR=ingress, HTTP_X_FORWARDED_FOR=f"1.2.3.4, {client}")
        locked = Client().post(
            "/accounts/login/", {"username": "x", "password": "y"}, REMOTE_ADDR=ingress, HTTP_X_FORWARDED_FOR=client
        )
        free = Client().post(
            "/accounts/login/", {"username": "x", "password": "y"}, REMOTE_ADDR=ingress, HTTP_X_FORWARDED_FOR=neighbour
        )
    assert locked.status_code == 429 and free.status_code == 200
