"""API keys: stored hashed, the full key shown once, revoked / expired / scope-less / inactive keys refused."""

import hashlib
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from tenants.keys import authenticate_api_key
from tenants.models import ApiKey, AuditEntry
from tenants.services import api_key_create, api_key_revoke


def _bearer_client(world, raw):
    client = world.client("anonymous")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_key_is_stored_only_as_its_sha256_and_prefix(world):
    key, raw = api_key_create(tenant=world.a.tenant, name="ci")
    row = ApiKey.objects.filter(pk=key.pk).values().get()
    assert row["key_hash"] == hashlib.sha256(raw.encode()).hexdigest()
    assert row["prefix"] == raw[:12]
    assert raw not in {str(value) for value in row.values()}
    assert authenticate_api_key(raw).pk == key.pk
    assert authenticate_api_key(raw[:-1] + ("A" if raw[-1] != "A" else "B")) is None


def test_full_key_is_shown_once_then_only_the_prefix(world):
    client = world.client("a_admin")
    created = client.post(reverse("api-key-list"), {"name": "deploy", "scopes": ["read"]}, format="json")
    assert created.status_code == 201, created.content
    raw = created.json()["key"]
    assert raw.startswith("ick_") and created.json()["prefix"] == raw[:12]
    assert created["Cache-Control"] == "no-store"

    detail = client.get(reverse("api-key-detail", args=[created.json()["id"]]))
    listing = client.get(reverse("api-key-list"))
    for body in (detail.content, listing.content):
        assert raw.encode() not in body
        assert b"key_hash" not in body
    assert raw[:12] in {row["prefix"] for row in listing.json()["results"]}
    # The key shown once works.
    assert _bearer_client(world, raw).get(reverse("endpoint-list")).status_code == 200


def test_revoked_key_is_refused(world):
    client = _bearer_client(world, world.a.raw_key)
    assert client.get(reverse("endpoint-list")).status_code == 200
    response = world.client("a_admin").post(reverse("api-key-revoke", args=[world.a.key.pk]))
    assert response.status_code == 200 and response.json()["is_usable"] is False
    refused = client.get(reverse("endpoint-list"))
    assert refused.status_code == 401
    assert "revoked" in refused.json()["detail"]
    assert AuditEntry.objects.filter(action="api_key.revoke", object_id=str(world.a.key.pk)).exists()
    assert authenticate_api_key(world.a.raw_key) is None


def test_revoke_is_idempotent_and_keeps_the_first_time(world):
    first = api_key_revoke(api_key=world.a.key).revoked_at
    again = world.client("a_admin").post(reverse("api-key-revoke", args=[world.a.key.pk]))
    assert again.status_code == 200
    world.a.key.refresh_from_db()
    assert world.a.key.revoked_at == first


def test_expired_key_is_refused(world):
    key, raw = api_key_create(tenant=world.a.tenant, name="short-lived", scopes=["read"])
    assert _bearer_client(world, raw).get(reverse("endpoint-list")).status_code == 200
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _bearer_client(world, raw).get(reverse("endpoint-list")).status_code == 401


def test_key_of_inactive_tenant_is_refused(world):
    world.a.tenant.is_active = False
    world.a.tenant.save()
    assert _bearer_client(world, world.a.raw_key).get(reverse("endpoint-list")).status_code == 401


def test_inference_only_key_cannot_use_the_rest_api(world):
    _, raw = api_key_create(tenant=world.a.tenant, name="proxy only", scopes=["inference"])
    assert _bearer_client(world, raw).get(reverse("endpoint-list")).status_code == 403


def test_garbage_and_unknown_keys_are_refused(world):
    for raw in ("nonsense", "ick_", "ick_" + "x" * 43, "ick_\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"):
        response = _bearer_client(world, raw).get(reverse("endpoint-list"))
        assert response.status_code == 401, raw


def test_tenant_cannot_revoke_another_tenants_key(world):
    response = world.client("a_admin").post(reverse("api-key-revoke", args=[world.b.key.pk]))
    assert response.status_code == 404
    world.b.key.refresh_from_db()
    assert world.b.key.revoked_at is None


def test_member_and_read_key_cannot_revoke(world):
    for who in ("a_member", "a_read_key"):
        assert world.client(who).post(reverse("api-key-revoke", args=[world.a.key.pk])).status_code == 403
    world.a.key.refresh_from_db()
    assert world.a.key.revoked_at is None


def test_operator_creates_key_for_a_named_tenant_only(world):
    client = world.client("operator")
    missing = client.post(reverse("api-key-list"), {"name": "x"}, format="json")
    assert missing.status_code == 400 and "tenant" in missing.json()
    created = client.post(reverse("api-key-list"), {"name": "x", "tenant": world.b.tenant.pk}, format="json")
    assert created.status_code == 201
    assert ApiKey.objects.get(pk=created.json()["id"]).tenant == world.b.tenant


def test_a_key_cannot_mint_a_stronger_key(world):
    _, raw = api_key_create(tenant=world.a.tenant, name="limited", scopes=["read", "write"], max_priority="sheddable")
    client = _bearer_client(world, raw)
    url = reverse("api-key-list")
    assert "scopes" in client.post(url, {"name": "x"}, format="json").json()  # default scope: inference
    assert "scopes" in client.post(url, {"name": "x", "scopes": ["read", "inference"]}, format="json").json()
    assert (
        "max_priority"
        in client.post(url, {"name": "x", "scopes": ["read"], "max_priority": "critical"}, format="json").json()
    )
    ok = client.post(url, {"name": "x", "scopes": ["read"], "max_priority": "sheddable"}, format="json")
    assert ok.status_code == 201, ok.content


def _key_with(world, **options):
    key, raw = api_key_create(tenant=world.a.tenant, name="limited", scopes=["read", "write"], **options)
    return key, _bearer_client(world, raw)


def test_a_key_without_a_priority_does_not_mint_one_above_its_own(world):
    """Leaving max_priority out must not fall back to the model default (standard) above a sheddable key."""
    _, client = _key_with(world, max_priority="sheddable")
    created = client.post(reverse("api-key-list"), {"name": "child", "scopes": ["read"]}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["max_priority"] == "sheddable"


def test_an_expiring_key_cannot_mint_a_key_that_outlives_it(world):
    expires = timezone.now() + timedelta(hours=1)
    _, client = _key_with(world, expires_at=expires)
    url = reverse("api-key-list")
    forever = client.post(url, {"name": "x", "scopes": ["read"], "expires_at": None}, format="json")
    assert forever.status_code == 400 and "expires_at" in forever.json()
    later = (expires + timedelta(days=30)).isoformat()
    assert (
        "expires_at" in client.post(url, {"name": "x", "scopes": ["read"], "expires_at": later}, format="json").json()
    )
    unsaid = client.post(url, {"name": "x", "scopes": ["read"]}, format="json")
    assert unsaid.status_code == 201, unsaid.content
    assert ApiKey.objects.get(pk=unsaid.json()["id"]).expires_at == expires


def test_a_key_cannot_extend_its_own_expiry_or_raise_its_own_limits(world):
    expires = timezone.now() + timedelta(hours=1)
    key, client = _key_with(world, expires_at=expires, max_priority="sheddable")
    url = reverse("api-key-detail", args=[key.pk])
    for payload, field in [
        ({"expires_at": None}, "expires_at"),
        ({"expires_at": (expires + timedelta(days=1)).isoformat()}, "expires_at"),
        ({"max_priority": "critical"}, "max_priority"),
        ({"scopes": ["read", "write", "inference"]}, "scopes"),
    ]:
        response = client.patch(url, payload, format="json")
        assert response.status_code == 400 and field in response.json(), (payload, response.content)
    key.refresh_from_db()
    assert key.expires_at == expires and key.max_priority == "sheddable" and key.scopes == ["read", "write"]
    shorter = client.patch(url, {"expires_at": (expires - timedelta(minutes=30)).isoformat()}, format="json")
    assert shorter.status_code == 200, shorter.content


def test_a_key_cannot_change_or_revoke_a_stronger_key(world):
    strong, _ = api_key_create(tenant=world.a.tenant, name="prod", scopes=["inference"], max_priority="critical")
    expiring, _ = api_key_create(
        tenant=world.a.tenant, name="temp", scopes=["read"], expires_at=timezone.now() + timedelta(hours=1)
    )
    _, client = _key_with(world, max_priority="sheddable")
    for key in (strong, expiring):
        before = ApiKey.objects.filter(pk=key.pk).values().get()
        assert (
            client.patch(reverse("api-key-detail", args=[key.pk]), {"expires_at": None}, format="json").status_code
            == 403
        )
        assert client.post(reverse("api-key-revoke", args=[key.pk])).status_code == 403
        assert ApiKey.objects.filter(pk=key.pk).values().get() == before
    # A key within its grant stays manageable by it.
    weak, _ = api_key_create(tenant=world.a.tenant, name="weak", scopes=["read"], max_priority="sheddable")
    assert client.post(reverse("api-key-revoke", args=[weak.pk])).status_code == 200


def test_a_key_cannot_move_a_key_to_another_tenant(world):
    response = world.client("a_write_key").patch(
        reverse("api-key-detail", args=[world.a.key.pk]), {"tenant": world.b.tenant.pk}, format="json"
    )
    assert response.status_code == 400 and "tenant" in response.json()
    world.a.key.refresh_from_db()
    assert world.a.key.tenant == world.a.tenant
