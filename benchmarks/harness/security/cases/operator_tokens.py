"""Operator tokens, names as references and scale pins: the surfaces the operators' API credentials added.

A tenant can neither mint nor use an operator token; a token is refused once expired, revoked or held by anyone but
an active operator; its scopes limit it; it mints, revokes and lends keys only within its own grant; it is no person;
its writes are audited as its owner; it is no key on the proxy. Names in request bodies read another tenant's
endpoint like a missing one; an operator's pin never holds a suspended tenant's replicas or passes its quota.

Every case here guards behaviour that did not exist before (there were no operator tokens, names or pins to attack);
each says what it would have caught.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.utils import timezone

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from capacity.autoscaling import store, ticks
from capacity.models import ScalePin
from capacity.services import simulated_profiles_get_or_create
from endpoints.models import Endpoint, Runtime
from tenants.models import AuditEntry, OperatorToken, Role, Tenant, User
from tenants.operator_tokens import generate_token
from tenants.services import operator_token_create, operator_token_revoke, tenant_update

TOKENS = "/api/v1/operator-tokens/"
ALL_SCOPES = ["read", "tokens", "write"]


def _mint(world: SecurityWorld, scopes=ALL_SCOPES, *, user=None, days: float = 1.0):
    expires_at = timezone.now() + timedelta(days=days)
    return operator_token_create(user=user or world.operator, name=f"{world.tag} bench", scopes=scopes,
                                 expires_at=expires_at)  # fmt: skip


def _status(client, method: str, path: str, body: dict | None = None) -> int:
    return getattr(client, method)(path, body or {}, format="json").status_code


@security_case(
    "operator_tokens.tenant_cannot_mint",
    "a tenant's admin, member or write key mints, lists or revokes operator tokens (guards new behaviour)",
)
def tenant_cannot_mint(world: SecurityWorld) -> str:
    token, _ = _mint(world)
    seen = {}
    for label, who in (
        ("admin", world.a.admin),
        ("member", world.a.member),
        ("write key", world.a.keys["write"]),
    ):
        client = world.api(who)
        minted = _status(client, "post", TOKENS, {"name": "mine", "scopes": ["read"]})
        listed = client.get(TOKENS).json()
        revoked = _status(client, "post", f"{TOKENS}{token.pk}/revoke/")
        expect(minted == 403, f"the tenant's {label} minting got {minted}")
        expect(listed.get("count") == 0, f"the tenant's {label} listed operator tokens: {listed}")
        expect(revoked in (403, 404), f"the tenant's {label} revoking got {revoked}")
        seen[label] = (minted, revoked)
    token.refresh_from_db()
    expect(token.revoked_at is None, "a tenant revoked an operator's token")
    expect(OperatorToken.objects.filter(user__tenant__isnull=False).count() == 0, "a tenant holds a token")
    return "; ".join(f"{label}: mint {m}, revoke {r}, list empty" for label, (m, r) in seen.items())


@security_case(
    "operator_tokens.tenant_account_cannot_use",
    "a token held by a tenant's admin (a row put there directly) or by an operator demoted to a tenant works "
    "(guards new behaviour)",
)
def tenant_account_cannot_use(world: SecurityWorld) -> str:
    raw, prefix, digest = generate_token()
    OperatorToken.objects.create(user=world.a.admin, name="smuggled", prefix=prefix, token_hash=digest,
                                 scopes=ALL_SCOPES, expires_at=timezone.now() + timedelta(days=1))  # fmt: skip
    smuggled = world.api(raw).get("/api/v1/tenants/").status_code
    expect(smuggled == 401, f"a tenant admin's operator token got {smuggled}")
    demoted = User.objects.create_user(username=f"{world.tag}-demoted", role=Role.OPERATOR)
    _, raw_demoted = _mint(world, user=demoted)
    before = world.api(raw_demoted).get("/api/v1/tenants/").status_code
    demoted.role, demoted.tenant = Role.TENANT_ADMIN, world.a.tenant
    demoted.save(update_fields=["role", "tenant"])
    after = world.api(raw_demoted).get("/api/v1/tenants/").status_code
    expect(before == 200 and after == 401, f"a demoted operator's token: {before} before, {after} after")
    return "a tenant admin's token 401; an operator's token 200, after demotion 401"


@security_case(
    "operator_tokens.expired_revoked_refused",
    "an expired, revoked, altered token, or one of a deactivated operator, calls the API (guards new behaviour)",
)
def expired_revoked_refused(world: SecurityWorld) -> str:
    got = {}
    expired, raw_expired = _mint(world)
    OperatorToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    got["expired"] = world.api(raw_expired).get("/api/v1/endpoints/").status_code
    revoked, raw_revoked = _mint(world)
    operator_token_revoke(token=revoked, actor=world.operator)
    got["revoked"] = world.api(raw_revoked).get("/api/v1/endpoints/").status_code
    _, raw = _mint(world)
    got["altered"] = world.api(raw[:-2] + ("AA" if raw[-2:] != "AA" else "BB")).get("/api/v1/endpoints/").status_code
    got["prefix only"] = world.api(raw[:12]).get("/api/v1/endpoints/").status_code
    retired = User.objects.create_user(username=f"{world.tag}-retired", role=Role.OPERATOR)
    _, raw_retired = _mint(world, user=retired)
    User.objects.filter(pk=retired.pk).update(is_active=False)
    got["owner deactivated"] = world.api(raw_retired).get("/api/v1/endpoints/").status_code
    wrong = [f"{label} {status}" for label, status in got.items() if status != 401]
    expect(not wrong, f"not refused: {', '.join(wrong)}")
    return ", ".join(f"{label} {status}" for label, status in got.items())


@security_case(
    "operator_tokens.scope_limits",
    "a read token changes things, a write token manages tokens, a tokens-only token reads the fleet (guards new "
    "behaviour)",
)
def scope_limits(world: SecurityWorld) -> str:
    _, read = _mint(world, ["read"])
    _, write = _mint(world, ["write"])
    _, tokens = _mint(world, ["tokens"])
    tenant_url = f"/api/v1/tenants/{world.b.tenant.pk}/"
    got = {
        "read PATCH tenant": (_status(world.api(read), "patch", tenant_url, {"is_active": False}), 403),
        "read mints": (_status(world.api(read), "post", TOKENS, {"name": "x", "scopes": ["read"]}), 403),
        "write lists tokens": (world.api(write).get(TOKENS).status_code, 403),
        "write mints": (_status(world.api(write), "post", TOKENS, {"name": "x", "scopes": ["write"]}), 403),
        "tokens reads endpoints": (world.api(tokens).get("/api/v1/endpoints/").status_code, 403),
        "read GET endpoints": (world.api(read).get("/api/v1/endpoints/").status_code, 200),
    }
    wrong = [f"{label} got {status} (want {want})" for label, (status, want) in got.items() if status != want]
    expect(not wrong, "; ".join(wrong))
    expect(Tenant.objects.get(pk=world.b.tenant.pk).is_active, "a read token suspended a tenant")
    return ", ".join(f"{label} {status}" for label, (status, _) in got.items())


@security_case(
    "operator_tokens.cannot_widen_or_outlive",
    "a token mints a token with more scopes or a later expiry, revokes a stronger one, or mints a tenant key "
    "that outlives it (guards new behaviour)",
)
def cannot_widen_or_outlive(world: SecurityWorld) -> str:
    holder, raw = _mint(world, ["read", "tokens"], days=1)
    stronger, _ = _mint(world, ALL_SCOPES, days=2)
    client = world.api(raw)
    later = (holder.expires_at + timedelta(days=30)).isoformat()
    got = {
        "wider scopes": _status(client, "post", TOKENS, {"name": "x", "scopes": ["read", "write"]}),
        "later expiry": _status(client, "post", TOKENS, {"name": "x", "scopes": ["read"], "expires_at": later}),
        "revoke stronger": _status(client, "post", f"{TOKENS}{stronger.pk}/revoke/"),
    }
    _, raw_write = _mint(world, ["write"], days=1)
    key_body = {"tenant": world.a.tenant.pk, "name": "forever", "scopes": ["inference", "write"], "expires_at": None}
    got["key without expiry"] = _status(world.api(raw_write), "post", "/api/v1/api-keys/", key_body)
    wrong = [f"{label} got {status}" for label, status in got.items() if status not in (400, 403)]
    expect(not wrong, "; ".join(wrong))
    stronger.refresh_from_db()
    expect(stronger.revoked_at is None, "the stronger token was revoked")
    child = client.post(TOKENS, {"name": "child", "scopes": ["read"]}, format="json")
    expect(child.status_code == 201, f"a token within the grant was refused: {child.status_code}")
    expect(child.json()["expires_at"].startswith(holder.expires_at.date().isoformat()), "the child outlives it")
    return ", ".join(f"{label} {status}" for label, status in got.items()) + "; a narrower child 201, same expiry"


@security_case(
    "operator_tokens.not_a_person",
    "a leaked token creates an operator account, resets a password or changes the owner's password or email "
    "(guards new behaviour)",
)
def not_a_person(world: SecurityWorld) -> str:
    _, raw = _mint(world)
    client = world.api(raw)
    got = {
        "create operator": _status(
            client,
            "post",
            "/api/v1/users/",
            {"username": f"{world.tag}-mallory", "password": "Sec-a-long-pass-9x", "role": "operator"},
        ),  # fmt: skip
        "reset admin": _status(client, "post", f"/api/v1/users/{world.a.admin.pk}/reset-password/"),
        "own password": _status(client, "post", "/api/v1/me/password/", {"old_password": "x", "new_password": "y"}),
        "own email": _status(client, "patch", "/api/v1/me/", {"email": "m@example.com", "current_password": "x"}),
    }
    wrong = [f"{label} got {status}" for label, status in got.items() if status != 403]
    expect(not wrong, "; ".join(wrong))
    expect(not User.objects.filter(username=f"{world.tag}-mallory").exists(), "an account was created")
    return ", ".join(f"{label} {status}" for label, status in got.items())


@security_case(
    "operator_tokens.writes_audited_as_owner",
    "a write made with a token leaves no trail, or a trail that does not name its owner and the token "
    "(guards new behaviour)",
)
def writes_audited_as_owner(world: SecurityWorld) -> str:
    token, raw = _mint(world, ["write"])
    before = AuditEntry.objects.count()
    response = world.api(raw).patch(f"/api/v1/tenants/{world.b.tenant.pk}/", {"accepts_fallback": True}, format="json")
    expect(response.status_code == 200, f"the write failed: {response.status_code}")
    refused = world.api(raw).delete(f"/api/v1/tenants/{world.b.tenant.pk}/")  # a write that fails is recorded too
    entries = list(AuditEntry.objects.order_by("id")[before:])
    uses = [e for e in entries if e.action == "operator_token.use"]
    expect(len(uses) == 2, f"{len(uses)} operator_token.use entries for 2 writes")
    expect(all(e.actor_id == world.operator.pk and token.prefix in e.actor_label for e in uses), "not as the owner")
    change = next((e for e in entries if e.action == "tenant.update"), None)
    expect(change is not None and change.actor_id == world.operator.pk, "the change is not the owner's")
    expect(change.detail.get("operator_token") == token.prefix, "the change does not name the token")
    return f"2 writes ({response.status_code}, {refused.status_code}) → 2 use entries as {uses[0].actor_label}"


@security_case(
    "operator_tokens.stored_hashed_listed_without_secret",
    "a token's secret is stored or listed in clear (guards new behaviour)",
)
def stored_hashed_listed_without_secret(world: SecurityWorld) -> str:
    created = world.api(world.operator).post(TOKENS, {"name": "ci", "scopes": ["read"]}, format="json")
    expect(created.status_code == 201, f"minting failed: {created.status_code}")
    raw = created.json()["token"]
    row = OperatorToken.objects.filter(pk=created.json()["id"]).values().get()
    expect(row["token_hash"] == hashlib.sha256(raw.encode()).hexdigest(), "not stored as its SHA-256")
    expect(raw not in {str(v) for v in row.values()}, "the secret is stored in clear")
    listing = world.api(world.operator).get(TOKENS).content.decode()
    detail = world.api(world.operator).get(f"{TOKENS}{row['id']}/").content.decode()
    expect(raw not in listing and raw not in detail and "token_hash" not in listing, "the secret is listed")
    expect(created.headers.get("Cache-Control") == "no-store", "the one answer with the secret may be cached")
    return "SHA-256 only; listed by prefix; the secret in one no-store answer"


@security_case(
    "operator_tokens.not_on_the_proxy",
    "an operator token sends completions through the proxy (guards new behaviour: tokens are for the REST API)",
    needs_proxy=True,
)
def not_on_the_proxy(world: SecurityWorld) -> str:
    token, raw = _mint(world)
    try:
        status = world.proxy_post(raw, world.completion(world.shared.name)).status_code
    finally:
        OperatorToken.objects.filter(pk=token.pk).delete()  # the proxy cases share the committed world
    expect(status == 401, f"the proxy answered an operator token with {status}")
    return "401"


@security_case(
    "names.other_tenants_endpoint_by_name",
    "a tenant names another tenant's endpoint in a body (SLO, fallback, rollout) to use it or learn it exists "
    "(guards new behaviour: names were not accepted before)",
)
def other_tenants_endpoint_by_name(world: SecurityWorld) -> str:
    client = world.api(world.a.admin)
    answers = {}
    for label, name in (("B's", world.b.endpoint.name), ("missing", f"{world.tag}-no-such-model")):
        slo = client.post("/api/v1/slos/", {"name": "x", "endpoint": name, "sli": "availability", "objective": 0.99},
                          format="json")  # fmt: skip
        fallback = client.patch(f"/api/v1/endpoints/{world.a.endpoint.pk}/", {"fallback": name}, format="json")
        answers[label] = (slo.status_code, fallback.status_code, slo.json().get("endpoint"), fallback.json())
    b, missing = answers["B's"], answers["missing"]
    expect(b[:2] == (400, 400), f"B's endpoint by name: {b[:2]}")
    same = b[2] == [m.replace(world.tag + "-no-such-model", world.b.endpoint.name) for m in missing[2]]
    expect(same, f"B's name answers unlike a missing one: {b[2]} vs {missing[2]}")
    expect(Endpoint.objects.get(pk=world.a.endpoint.pk).fallback_id is None, "A's fallback points at B's endpoint")
    return f"SLO and fallback by B's name: 400 '{b[2][0]}', as a missing name"


def _pinned_endpoint(world: SecurityWorld, **fields) -> Endpoint:
    hardware, model = simulated_profiles_get_or_create()
    return Endpoint.objects.create(
        name=f"{world.tag}-a-pinned", owner_tenant=world.a.tenant, model_profile=model, hardware_profile=hardware,
        runtime=Runtime.SIM, launch_options={"actuator": "static"}, concurrency_limit=4, **fields,
    )  # fmt: skip


def _tick(endpoint: Endpoint, tick: str):
    try:
        return ticks.horizontal_tick(endpoint_id=endpoint.pk, tick=tick)
    finally:  # the tick appended a demand sample: leave no key behind for a rolled-back id
        store.client().delete(store.SAMPLES_KEY.format(endpoint_id=endpoint.pk))


@security_case(
    "capacity.pin_within_suspension_and_quota",
    "a tenant admin's pin holds replicas past its tenant's suspension or its replica quota (guards new behaviour)",
)
def pin_within_suspension_and_quota(world: SecurityWorld) -> str:
    endpoint = _pinned_endpoint(world, min_replicas=0, max_replicas=8, desired_replicas=0)
    Tenant.objects.filter(pk=world.a.tenant.pk).update(quota_max_replicas=2)
    scaled = world.api(world.a.admin).post(f"/api/v1/endpoints/{endpoint.pk}/scale/", {"desired_replicas": 6},
                                           format="json")  # fmt: skip
    if scaled.status_code == 200:
        expect(ScalePin.objects.filter(endpoint=endpoint, replicas=6).exists(), "the scale made no pin")
        capped = _tick(endpoint, f"{world.tag}-quota")
        expect(capped.desired <= 2, f"a pin of 6 decided {capped.desired} against a quota of 2 ({capped.reason})")
        quota = f"pin 6 held at {capped.desired} by the quota"
    else:
        quota = f"a pin past the quota refused ({scaled.status_code})"
        ScalePin.objects.update_or_create(endpoint=endpoint, defaults={"replicas": 2,
                                          "until": timezone.now() + timedelta(hours=1)})  # fmt: skip
    tenant_update(tenant=Tenant.objects.get(pk=world.a.tenant.pk), actor=world.operator, is_active=False)
    held = _tick(endpoint, f"{world.tag}-suspended")
    expect(held.desired == 0, f"a suspended tenant's pinned endpoint decided {held.desired} ({held.reason})")
    return f"{quota}; suspended: 0 ({held.reason})"
