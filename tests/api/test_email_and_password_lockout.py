"""Email addresses decide where password reset links go, so only the user (PATCH /api/v1/me/, with the current
password) or an operator changes one: a tenant admin cannot redirect a colleague's resets and take the account.
Wrong current passwords on /api/v1/me/ and /api/v1/me/password/ count as failed logins and share their lock-out."""

import pytest
from django.conf import settings
from django.core import mail
from django.core.cache import cache
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import AuditEntry
from tenants.services import EMAIL_SELF_OR_OPERATOR
from tenants.throttling import LoginLimits, _counters

PASSWORD = "pw-for-tests-123"  # tests.factories.UserFactory's
STRONG = "a-Strong-pass-9876"
ADDRESS, ELSEWHERE = "198.51.100.71", "198.51.100.72"
LIMITS = {"failures_per_user_address": 3, "failures_per_address": 50, "window_s": 600}


# -- who changes an email address -----------------------------------------------------------------------------
def test_a_tenant_admin_cannot_redirect_a_colleagues_reset_links(world):
    member = world.a.member
    member.email = "member@tenant-a.example"
    member.save()
    admin = world.client("a_admin")
    changed = admin.patch(reverse("user-detail", args=[member.pk]), {"email": "attacker@evil.example"}, format="json")
    assert changed.status_code == 400, changed.content
    assert changed.json()["email"] == [EMAIL_SELF_OR_OPERATOR]
    member.refresh_from_db()
    assert member.email == "member@tenant-a.example"
    # The rest of the takeover: the reset link still goes to the member, never to the admin's address.
    assert admin.post(reverse("user-reset-password", args=[member.pk])).status_code == 200
    assert [m.to for m in mail.outbox] == [["member@tenant-a.example"]]


def test_nor_its_own_through_the_users_api_and_other_fields_still_change(world):
    admin, member = world.a.admin, world.a.member
    client = world.client("a_admin")
    own = client.patch(reverse("user-detail", args=[admin.pk]), {"email": "new@tenant-a.example"}, format="json")
    assert own.status_code == 400 and "/api/v1/me/" in own.json()["email"][0]
    renamed = client.patch(
        reverse("user-detail", args=[member.pk]), {"first_name": "Ada", "email": member.email}, format="json"
    )
    assert renamed.status_code == 200, renamed.content
    member.refresh_from_db()
    assert member.first_name == "Ada"


def test_an_operator_changes_a_users_email(world):
    member = world.a.member
    response = world.client("operator").patch(
        reverse("user-detail", args=[member.pk]), {"email": "fixed@tenant-a.example"}, format="json"
    )
    assert response.status_code == 200, response.content
    member.refresh_from_db()
    assert member.email == "fixed@tenant-a.example"
    assert AuditEntry.objects.filter(action="user.update", object_id=str(member.pk)).exists()


def test_a_person_changes_their_own_email_with_their_password(world, low_limits):
    member = world.a.member
    client = world.client("a_member")
    url = reverse("me")
    for body, field in (
        ({"email": "mine@tenant-a.example"}, "current_password"),
        ({"email": "mine@tenant-a.example", "current_password": "guess"}, "current_password"),
        ({"email": "not an address", "current_password": PASSWORD}, "email"),
    ):
        refused = client.patch(url, body, format="json", REMOTE_ADDR=ELSEWHERE)
        assert refused.status_code == 400 and field in refused.json(), (body, refused.content)
    member.refresh_from_db()
    assert member.email == ""
    ok = client.patch(
        url, {"email": "mine@tenant-a.example", "current_password": PASSWORD}, format="json", REMOTE_ADDR=ELSEWHERE
    )
    assert ok.status_code == 200, ok.content
    assert ok.json()["email"] == "mine@tenant-a.example" and client.get(url).json()["email"] == ok.json()["email"]
    member.refresh_from_db()
    assert member.email == "mine@tenant-a.example"
    entry = AuditEntry.objects.get(action="user.email_change", object_id=str(member.pk))
    assert entry.detail == {"email": ["", "mine@tenant-a.example"]}
    keyed = world.client("a_write_key").patch(url, {"email": "k@x.example", "current_password": "x"}, format="json")
    assert keyed.status_code == 403


# -- the lock-out ------------------------------------------------------------------------------------------------
@pytest.fixture
def low_limits(tenant_a):
    """Low limits, and no counts left in the (real, shared) cache before or after."""

    def forget():
        limits = LoginLimits(**LIMITS)
        for address in (ADDRESS, ELSEWHERE):
            for key, _ in _counters(username=tenant_a.member.username, address=address, limits=limits):
                cache.delete_many([key, f"{key}:start"])

    forget()
    with override_settings(INFERCAP={**settings.INFERCAP, "LOGIN_THROTTLE": LIMITS}):
        yield
    forget()


def _as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client


def test_wrong_old_passwords_lock_password_changes_like_logins(world, low_limits):
    member = world.a.member
    client = _as(member)
    url = reverse("me-password")
    for n in range(LIMITS["failures_per_user_address"]):
        wrong = client.post(url, {"old_password": f"guess-{n}", "new_password": STRONG}, REMOTE_ADDR=ADDRESS)
        assert wrong.status_code == 400 and "old_password" in wrong.json()
    locked = client.post(url, {"old_password": PASSWORD, "new_password": STRONG}, REMOTE_ADDR=ADDRESS)
    assert locked.status_code == 429, locked.content
    assert 1 <= int(locked["Retry-After"]) <= LIMITS["window_s"]
    assert "Too many failed password attempts" in locked.json()["detail"]
    member.refresh_from_db()
    assert member.check_password(PASSWORD) and not member.check_password(STRONG)
    # The same lock-out as the console login: the right password no longer logs in from that address either.
    login = Client().post("/accounts/login/", {"username": member.username, "password": PASSWORD}, REMOTE_ADDR=ADDRESS)
    assert b"Too many failed login attempts" in login.content
    # And the email change behind the same session is locked as well.
    email = client.patch(
        reverse("me"), {"email": "x@evil.example", "current_password": PASSWORD}, format="json", REMOTE_ADDR=ADDRESS
    )
    assert email.status_code == 429
    # Another address is not locked: the owner changes the password there, which clears the count.
    ok = client.post(url, {"old_password": PASSWORD, "new_password": STRONG}, REMOTE_ADDR=ELSEWHERE)
    assert ok.status_code == 200, ok.content


def test_failed_logins_lock_the_password_change_too(world, low_limits):
    member = world.a.member
    for n in range(LIMITS["failures_per_user_address"]):
        Client().post("/accounts/login/", {"username": member.username, "password": f"x{n}"}, REMOTE_ADDR=ADDRESS)
    locked = _as(member).post(
        reverse("me-password"), {"old_password": PASSWORD, "new_password": STRONG}, REMOTE_ADDR=ADDRESS
    )
    assert locked.status_code == 429


def test_wrong_current_passwords_on_the_email_change_count_too(world, low_limits):
    member = world.a.member
    client = _as(member)
    for n in range(LIMITS["failures_per_user_address"]):
        wrong = client.patch(
            reverse("me"), {"email": "x@evil.example", "current_password": f"g{n}"}, format="json", REMOTE_ADDR=ADDRESS
        )
        assert wrong.status_code == 400
    locked = client.post(
        reverse("me-password"), {"old_password": PASSWORD, "new_password": STRONG}, REMOTE_ADDR=ADDRESS
    )
    assert locked.status_code == 429
    member.refresh_from_db()
    assert member.email == ""
