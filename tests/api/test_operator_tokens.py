"""Operator tokens: minted by operators only, shown once, stored hashed, scoped, expiring, revocable, audited as their
owner, and no way into people's accounts or past their own grant."""

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from tenants.models import AuditEntry, OperatorToken, Role
from tenants.operator_tokens import authenticate_operator_token
from tenants.services import operator_token_create


def _bearer(world, raw):
    client = world.client("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _token(world, scopes=("read", "write", "tokens"), **kwargs):
    return operator_token_create(user=world.operator, name="ci", scopes=list(scopes), **kwargs)


def test_minted_by_an_operator_session_shown_once_stored_as_its_digest(world):
    created = world.client("operator").post(
        reverse("operator-token-list"), {"name": "deploy", "scopes": ["read", "write"]}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    raw = body["token"]
    assert raw.startswith("ico_") and body["prefix"] == raw[:12] and body["owner"] == "operator"
    assert created["Cache-Control"] == "no-store"
    assert (
        timedelta(days=29) < timezone.datetime.fromisoformat(body["expires_at"]) - timezone.now() <= timedelta(days=30)
    )
    row = OperatorToken.objects.filter(pk=body["id"]).values().get()
    assert row["token_hash"] == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in {str(value) for value in row.values()}
    listing = world.client("operator").get(reverse("operator-token-list"))
    assert raw.encode() not in listing.content and b"token_hash" not in listing.content
    assert raw[:12] in {t["prefix"] for t in listing.json()["results"]}
    # The token works on the API, as its owner.
    me = _bearer(world, raw).get(reverse("me"))
    assert me.status_code == 200 and me.json()["username"] == "operator" and me.json()["is_operator"] is True
    assert me.json()["operator_token_prefix"] == raw[:12]
    assert _bearer(world, raw).get(reverse("tenant-list")).json()["count"] == 2


@pytest.mark.parametrize("who", ["a_admin", "a_member", "a_write_key", "anonymous"])
def test_tenants_and_keys_cannot_mint_see_or_revoke(world, who):
    token, _ = _token(world)
    client = world.client(who)
    refused = 401 if who == "anonymous" else 403
    minted = client.post(reverse("operator-token-list"), {"name": "x", "scopes": ["read"]}, format="json")
    assert minted.status_code == refused
    listing = client.get(reverse("operator-token-list"))
    assert listing.status_code == 401 if who == "anonymous" else listing.json()["count"] == 0
    revoked = client.post(reverse("operator-token-revoke", args=[token.pk]))
    assert revoked.status_code == 401 if who == "anonymous" else revoked.status_code in (403, 404)
    assert OperatorToken.objects.count() == 1 and OperatorToken.objects.get().revoked_at is None


def test_a_tenant_users_token_is_refused_even_if_a_row_exists(world):
    # Minting refuses a tenant's person; a row put there some other way (or a demoted operator's) does not work.
    with pytest.raises(Exception, match="active operator accounts only"):
        operator_token_create(user=world.a.admin, name="x", scopes=["read"])
    token, raw = _token(world)
    world.operator.role, world.operator.is_superuser = Role.TENANT_ADMIN, False
    world.operator.tenant = world.a.tenant
    world.operator.save()
    assert _bearer(world, raw).get(reverse("endpoint-list")).status_code == 401


def test_expired_revoked_and_inactive_owner_are_401(world):
    token, raw = _token(world)
    client = _bearer(world, raw)
    assert client.get(reverse("endpoint-list")).status_code == 200
    OperatorToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get(reverse("endpoint-list")).status_code == 401
    token2, raw2 = _token(world)
    revoked = world.client("operator").post(reverse("operator-token-revoke", args=[token2.pk]))
    assert revoked.status_code == 200 and revoked.json()["is_usable"] is False
    assert _bearer(world, raw2).get(reverse("endpoint-list")).status_code == 401
    assert AuditEntry.objects.filter(action="operator_token.revoke", object_id=str(token2.pk)).exists()
    _, raw3 = _token(world)
    world.operator.is_active = False
    world.operator.save()
    assert _bearer(world, raw3).get(reverse("endpoint-list")).status_code == 401
    assert authenticate_operator_token(raw3) is None
    assert _bearer(world, raw3[:-1] + ("A" if raw3[-1] != "A" else "B")).get(reverse("me")).status_code == 401


def test_scope_limits_the_token(world):
    _, read = _token(world, scopes=["read"])
    _, write = _token(world, scopes=["write"])
    profile = {"name": "h", "gpu_type": "L4", "gpu_memory_gb": 24, "memory_bandwidth_gbps": 300}
    assert _bearer(world, read).get(reverse("endpoint-list")).status_code == 200
    assert _bearer(world, read).post(reverse("hardware-profile-list"), profile, format="json").status_code == 403
    assert _bearer(world, write).post(reverse("hardware-profile-list"), profile, format="json").status_code == 201
    for raw in (read, write):  # the token routes need the tokens scope, whatever else a token holds
        assert _bearer(world, raw).get(reverse("operator-token-list")).status_code == 403
        minted = _bearer(world, raw).post(reverse("operator-token-list"), {"name": "x", "scopes": ["read"]})
        assert minted.status_code == 403


def test_a_token_mints_and_revokes_only_within_its_grant(world):
    holder, raw = _token(world, scopes=["read", "tokens"], expires_at=timezone.now() + timedelta(days=2))
    client = _bearer(world, raw)
    wider = client.post(reverse("operator-token-list"), {"name": "x", "scopes": ["write"]}, format="json")
    assert wider.status_code == 400 and "scopes" in wider.json()
    later = (timezone.now() + timedelta(days=10)).isoformat()
    longer = client.post(reverse("operator-token-list"), {"name": "x", "scopes": ["read"], "expires_at": later})
    assert longer.status_code == 400 and "expires_at" in longer.json()
    ok = client.post(reverse("operator-token-list"), {"name": "child", "scopes": ["read"]}, format="json")
    assert ok.status_code == 201 and ok.json()["expires_at"] == holder.expires_at.isoformat().replace("+00:00", "Z")
    stronger, _ = _token(world)
    assert client.post(reverse("operator-token-revoke", args=[stronger.pk])).status_code == 403
    assert client.post(reverse("operator-token-revoke", args=[ok.json()["id"]])).status_code == 200


def test_lifetime_is_bounded(world):
    client = world.client("operator")
    far = (timezone.now() + timedelta(days=400)).isoformat()
    assert client.post(
        reverse("operator-token-list"), {"name": "x", "scopes": ["read"], "expires_at": far}
    ).status_code == (400)
    past = (timezone.now() - timedelta(days=1)).isoformat()
    assert client.post(
        reverse("operator-token-list"), {"name": "x", "scopes": ["read"], "expires_at": past}
    ).status_code == (400)


def test_writes_are_audited_as_the_owner_with_the_token(world):
    token, raw = _token(world, scopes=["write"])
    response = _bearer(world, raw).patch(
        reverse("tenant-detail", args=[world.b.tenant.pk]), {"accepts_fallback": True}, format="json"
    )
    assert response.status_code == 200, response.content
    use = AuditEntry.objects.get(action="operator_token.use")
    assert use.actor == world.operator and use.detail["method"] == "PATCH"
    assert use.actor_label == f"operator (token {token.prefix})"
    change = AuditEntry.objects.get(action="tenant.update")
    assert change.actor == world.operator and change.detail["operator_token"] == token.prefix
    # Reads leave no audit entry, only last_used_at.
    _bearer(world, raw).get(reverse("tenant-list"))
    assert AuditEntry.objects.filter(action="operator_token.use").count() == 1
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_token_is_not_a_person(world):
    _, raw = _token(world)
    client = _bearer(world, raw)
    new_operator = {"username": "mallory", "password": "a-long-password-9", "role": "operator"}
    assert client.post(reverse("user-list"), new_operator, format="json").status_code == 403
    assert client.post(reverse("user-reset-password", args=[world.a.admin.pk])).status_code == 403
    assert client.post(reverse("me-password"), {"old_password": "x", "new_password": "y"}).status_code == 403
    assert client.patch(reverse("me"), {"email": "m@example.com", "current_password": "x"}).status_code == 403


def test_keys_minted_by_a_token_expire_no_later_than_it(world):
    token, raw = _token(world, scopes=["write"], expires_at=timezone.now() + timedelta(days=1))
    client = _bearer(world, raw)
    body = {"tenant": world.a.tenant.pk, "name": "sdk", "scopes": ["inference"]}
    created = client.post(reverse("api-key-list"), body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["expires_at"] == token.expires_at.isoformat().replace("+00:00", "Z")
    forever = client.post(reverse("api-key-list"), {**body, "expires_at": None}, format="json")
    assert forever.status_code == 400 and "expires_at" in forever.json()


def test_the_management_command_mints_the_first_token(db):
    out = StringIO()
    call_command("create_operator_token", "--username", "ci-bot", "--service-account", "--days", "7", stdout=out)
    raw = out.getvalue().split("token (shown once): ")[1].strip()
    token = authenticate_operator_token(raw)
    assert token is not None and token.user.username == "ci-bot" and token.user.is_operator
    assert not token.user.has_usable_password()
    assert set(token.scopes) == {"read", "write", "tokens"}
    with pytest.raises(CommandError, match="no user"):
        call_command("create_operator_token", "--username", "nobody", stdout=StringIO())
