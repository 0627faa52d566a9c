"""No privilege escalation through the users API: keys never manage people, nobody sets another person's
password, a person changes their own only with the old one, and tenant admins cannot make operators or
move users between tenants."""

import re

import pytest
from django.core import mail
from django.urls import reverse

from tenants.models import AuditEntry, Role, User
from tests.factories import OperatorFactory, UserFactory

STRONG = "a-Strong-pass-9876"


def _password_works(user: User, password: str) -> bool:
    user.refresh_from_db()
    return user.check_password(password)


@pytest.mark.parametrize("who", ["a_write_key", "a_read_key"])
def test_api_key_cannot_create_a_user(world, who):
    """The takeover path: a write key creates a tenant admin with a password, logs in, mints a critical key."""
    before = User.objects.count()
    response = world.client(who).post(
        reverse("user-list"),
        {"username": "backdoor", "password": STRONG, "role": "tenant_admin"},
        format="json",
    )
    assert response.status_code == 403, response.content
    assert User.objects.count() == before


def test_write_key_cannot_change_reset_or_delete_a_user(world):
    client = world.client("a_write_key")
    admin = world.a.admin
    url = reverse("user-detail", args=[admin.pk])
    assert client.patch(url, {"password": STRONG}, format="json").status_code == 403
    assert client.patch(url, {"email": "attacker@example.com"}, format="json").status_code == 403
    assert client.patch(url, {"role": "tenant_member"}, format="json").status_code == 403
    assert client.post(reverse("user-reset-password", args=[admin.pk])).status_code == 403
    assert client.delete(url).status_code == 403
    admin.refresh_from_db()
    assert admin.email != "attacker@example.com" and admin.role == Role.TENANT_ADMIN
    assert admin.has_usable_password() and not _password_works(admin, STRONG)
    assert "API keys cannot" in client.delete(url).json()["detail"]


def test_write_key_may_still_list_users(world):
    response = world.client("a_write_key").get(reverse("user-list"))
    assert response.status_code == 200
    assert world.a.admin.username in {row["username"] for row in response.json()["results"]}


@pytest.mark.parametrize("who", ["a_admin", "operator"])
def test_nobody_sets_another_users_password_through_the_users_api(world, who):
    target = world.a.member
    response = world.client(who).patch(reverse("user-detail", args=[target.pk]), {"password": STRONG}, format="json")
    assert response.status_code == 400, response.content
    assert "me/password" in str(response.json()["password"])
    assert not _password_works(target, STRONG)


def test_own_password_is_not_set_through_the_users_api_either(world):
    """A stolen session must not turn into a permanent takeover by setting a new password without the old one."""
    admin = world.a.admin
    response = world.client("a_admin").patch(
        reverse("user-detail", args=[admin.pk]), {"password": STRONG}, format="json"
    )
    assert response.status_code == 400
    assert not _password_works(admin, STRONG)


def test_admin_still_gives_a_new_account_its_first_password(world):
    response = world.client("a_admin").post(
        reverse("user-list"), {"username": "newcomer", "password": STRONG}, format="json"
    )
    assert response.status_code == 201, response.content
    assert _password_works(User.objects.get(username="newcomer"), STRONG)


def test_change_own_password_needs_the_old_one(world):
    member = world.a.member
    client = world.client("a_member")
    url = reverse("me-password")
    wrong = client.post(url, {"old_password": "guess", "new_password": STRONG}, format="json")
    assert wrong.status_code == 400 and "old_password" in wrong.json()
    weak = client.post(url, {"old_password": "pw-for-tests-123", "new_password": "123"}, format="json")
    assert weak.status_code == 400 and "new_password" in weak.json()
    missing = client.post(url, {"new_password": STRONG}, format="json")
    assert missing.status_code == 400 and "old_password" in missing.json()
    assert not _password_works(member, STRONG)

    ok = client.post(url, {"old_password": "pw-for-tests-123", "new_password": STRONG}, format="json")
    assert ok.status_code == 200, ok.content
    assert _password_works(member, STRONG)
    assert AuditEntry.objects.filter(action="user.password_change", object_id=str(member.pk)).exists()


def test_change_own_password_keeps_this_session_and_ends_the_others(world, client):
    member = world.a.member
    other = type(client)()
    assert client.login(username=member.username, password="pw-for-tests-123")
    assert other.login(username=member.username, password="pw-for-tests-123")
    response = client.post(
        reverse("me-password"),
        {"old_password": "pw-for-tests-123", "new_password": STRONG},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert client.get(reverse("me")).status_code == 200
    assert other.get(reverse("me")).status_code in (401, 403)


def test_api_key_has_no_password_to_change(world):
    response = world.client("a_write_key").post(
        reverse("me-password"), {"old_password": "x", "new_password": STRONG}, format="json"
    )
    assert response.status_code == 403


def test_admin_resets_a_password_by_mailed_link_without_learning_it(world, client):
    member = world.a.member
    member.email = "member@example.com"
    member.save()
    response = world.client("a_admin").post(reverse("user-reset-password", args=[member.pk]))
    assert response.status_code == 200, response.content
    member.refresh_from_db()
    assert not member.has_usable_password()  # the old password (and any session on it) is dead at once
    assert AuditEntry.objects.filter(action="user.password_reset", object_id=str(member.pk)).exists()

    assert [message.to for message in mail.outbox] == [["member@example.com"]]
    link = re.search(r"https?://[^/\s]+(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    form = client.get(link, follow=True)
    assert form.status_code == 200
    done = client.post(form.redirect_chain[-1][0], {"new_password1": STRONG, "new_password2": STRONG})
    assert done.status_code == 302
    assert _password_works(member, STRONG)


def test_reset_needs_an_email_address(world):
    member = world.a.member
    member.email = ""
    member.save()
    response = world.client("a_admin").post(reverse("user-reset-password", args=[member.pk]))
    assert response.status_code == 400 and "email" in response.json()
    member.refresh_from_db()
    assert member.has_usable_password()


def test_member_cannot_reset_and_admin_cannot_reset_another_tenants_user(world):
    assert world.client("a_member").post(reverse("user-reset-password", args=[world.a.admin.pk])).status_code == 403
    assert world.client("a_admin").post(reverse("user-reset-password", args=[world.b.admin.pk])).status_code == 404


def test_tenant_admin_cannot_make_an_operator_or_a_superuser(world):
    client = world.client("a_admin")
    member = world.a.member
    url = reverse("user-detail", args=[member.pk])
    promoted = client.patch(url, {"role": "operator", "tenant": None}, format="json")
    assert promoted.status_code == 400 and "role" in promoted.json()
    client.patch(url, {"is_staff": True, "is_superuser": True}, format="json")  # not writable fields: ignored
    member.refresh_from_db()
    assert member.role == Role.TENANT_MEMBER and not member.is_staff and not member.is_superuser


def test_tenant_admin_cannot_move_a_user_to_another_tenant_or_out_of_any(world):
    client = world.client("a_admin")
    member = world.a.member
    url = reverse("user-detail", args=[member.pk])
    moved = client.patch(url, {"tenant": world.b.tenant.pk}, format="json")
    assert moved.status_code == 400 and "tenant" in moved.json()
    orphaned = client.patch(url, {"tenant": None}, format="json")
    assert orphaned.status_code == 400 and "tenant" in orphaned.json()
    member.refresh_from_db()
    assert member.tenant_id == world.a.tenant.pk


def test_tenant_admin_cannot_touch_a_superuser_listed_in_its_tenant(world):
    """is_operator covers superusers too: one sitting in a tenant's list is still out of a tenant admin's reach."""
    boss = OperatorFactory(username="boss", role=Role.TENANT_ADMIN, tenant=world.a.tenant, is_superuser=True)
    client = world.client("a_admin")
    assert (
        client.patch(reverse("user-detail", args=[boss.pk]), {"email": "x@example.com"}, format="json").status_code
        == 403
    )
    assert client.post(reverse("user-reset-password", args=[boss.pk])).status_code == 403
    assert client.delete(reverse("user-detail", args=[boss.pk])).status_code == 403


def test_operator_can_reset_any_users_password(world):
    target = UserFactory(username="someone", tenant=world.b.tenant, email="someone@example.com")
    response = world.client("operator").post(reverse("user-reset-password", args=[target.pk]))
    assert response.status_code == 200
    assert mail.outbox and mail.outbox[0].to == ["someone@example.com"]
