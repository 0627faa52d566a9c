"""Console and admin logins: after a few failures per username and address the login is refused, with a
message that says so, even with the right password; other users and addresses are unaffected."""

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import Client, override_settings

from tenants.throttling import LoginLimits, _counters

ADDRESS = "198.51.100.23"
LIMITS = {"failures_per_user_address": 3, "failures_per_address": 6, "window_s": 600}


@pytest.fixture(autouse=True)
def low_limits(tenant_a):
    """Low limits, and no counts left over from an earlier run (the cache is the real Redis)."""

    def forget():
        limits = LoginLimits(**LIMITS)
        for username in ("a-admin", "a-member", "operator", "nobody-1", "nobody-2", "nobody-3", "nobody-4"):
            for address in (ADDRESS, "198.51.100.24"):
                for key, _ in _counters(username=username, address=address, limits=limits):
                    cache.delete_many([key, f"{key}:start"])

    forget()
    with override_settings(INFERCAP={**settings.INFERCAP, "LOGIN_THROTTLE": LIMITS}):
        yield
    forget()


def _login(client, url, username, password, address=ADDRESS):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def _logged_in(client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
def test_login_locks_after_failures_even_with_the_right_password(url, operator):
    client = Client()
    for _ in range(3):
        response = _login(client, url, "operator", "wrong")
        assert response.status_code == 200 and b"Too many" not in response.content
    refused = _login(client, url, "operator", "pw-for-tests-123")
    assert refused.status_code == 429 and 1 <= int(refused["Retry-After"]) <= LIMITS["window_s"]
    assert b"Too many failed login attempts" in refused.content
    assert not _logged_in(client)
    # Another address, or another user from this one, is not locked out.
    assert _login(Client(), url, "operator", "pw-for-tests-123", address="198.51.100.24").status_code == 302


def test_other_users_log_in_from_the_same_address(tenant_a):
    client = Client()
    for _ in range(3):
        _login(client, "/accounts/login/", "a-admin", "wrong")
    assert _login(client, "/accounts/login/", "a-member", "pw-for-tests-123").status_code == 302


def test_a_successful_login_clears_the_count(tenant_a):
    for _ in range(2):
        _login(Client(), "/accounts/login/", "a-admin", "wrong")
    assert _login(Client(), "/accounts/login/", "a-admin", "pw-for-tests-123").status_code == 302
    for _ in range(2):
        _login(Client(), "/accounts/login/", "a-admin", "wrong")
    assert _login(Client(), "/accounts/login/", "a-admin", "pw-for-tests-123").status_code == 302


def test_one_address_spraying_many_usernames_is_locked_out(tenant_a):
    for n in range(1, 5):
        for _ in range(2):
            _login(Client(), "/accounts/login/", f"nobody-{n}", "guess")
    refused = _login(Client(), "/accounts/login/", "a-member", "pw-for-tests-123")
    assert b"Too many failed login attempts" in refused.content
    assert (
        _login(Client(), "/accounts/login/", "a-member", "pw-for-tests-123", address="198.51.100.24").status_code
        == 302
    )
