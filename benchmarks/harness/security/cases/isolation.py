"""Tenant isolation on the REST API and the proxy: a tenant's users and keys neither see nor change another
tenant's endpoints, usage, reservations, keys or webhooks (404: the object does not exist for them), keys do
only what their scopes allow, and a key cannot mint a stronger one."""

from __future__ import annotations

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld


def _ids(response) -> set:
    body = response.json()
    rows = body["results"] if isinstance(body, dict) and "results" in body else body
    return {row["id"] for row in rows}


def _refused(response) -> bool:
    return response.status_code in (401, 403, 404)


@security_case("isolation.api_other_tenants_endpoint", "tenant A reads, changes and deletes tenant B's endpoint")
def other_tenants_endpoint(world: SecurityWorld) -> str:
    theirs = world.b.endpoint
    url = f"/api/v1/endpoints/{theirs.pk}/"
    for who, label in ((world.a.keys["full"], "A's full key"), (world.a.admin, "A's admin")):
        api = world.api(who)
        listed = api.get("/api/v1/endpoints/")
        expect(listed.status_code == 200, f"{label}: listing failed ({listed.status_code})")
        expect(theirs.pk not in _ids(listed), f"{label} lists B's endpoint")
        expect(world.a.endpoint.pk in _ids(listed), f"{label} does not even see A's endpoint: the case proves nothing")
        expect(api.get(url).status_code == 404, f"{label} reads B's endpoint")
        patched = api.patch(url, {"concurrency_limit": 1}, format="json")
        expect(patched.status_code == 404, f"{label} PATCH on B's endpoint answered {patched.status_code}")
        deleted = api.delete(url)
        expect(deleted.status_code == 404, f"{label} DELETE on B's endpoint answered {deleted.status_code}")
    theirs.refresh_from_db()
    expect(theirs.concurrency_limit == 16, "B's endpoint changed")
    return "not listed; read, PATCH and DELETE answered 404 to A's key and admin"


@security_case("isolation.api_other_tenants_usage", "tenant A reads tenant B's usage records")
def other_tenants_usage(world: SecurityWorld) -> str:
    api = world.api(world.a.keys["read"])
    # The largest page: the proxy cases meter many more of A's requests than the default page holds.
    listed = api.get("/api/v1/usage/?limit=1000")
    expect(listed.status_code == 200, f"listing failed ({listed.status_code})")
    seen = {row["request_id"] for row in listed.json()["results"]}
    expect(world.a.usage.request_id in seen, "A does not see its own usage: the case proves nothing")
    expect(world.b.usage.request_id not in seen, "A lists B's usage")
    filtered = api.get(f"/api/v1/usage/?tenant={world.b.tenant.pk}")
    leaked = filtered.status_code == 200 and any(
        row["request_id"] == world.b.usage.request_id for row in filtered.json()["results"]
    )
    expect(not leaked, "filtering by B's tenant id returns B's usage")
    expect(filtered.status_code in (200, 400), f"filtering by B's tenant answered {filtered.status_code}")
    detail = api.get(f"/api/v1/usage/{world.b.usage.pk}/")
    expect(detail.status_code == 404, f"B's usage record by id answered {detail.status_code}")
    return f"own usage only; ?tenant=B answered {filtered.status_code} without B's rows; B's record by id 404"


@security_case("isolation.api_other_tenants_reservations", "tenant A reads and changes tenant B's reservation")
def other_tenants_reservations(world: SecurityWorld) -> str:
    api = world.api(world.a.keys["full"])
    listed = api.get("/api/v1/reservations/")
    expect(listed.status_code == 200, f"listing failed ({listed.status_code})")
    expect(_ids(listed) == {world.a.reservation.pk}, f"A lists reservations {sorted(_ids(listed))}")
    url = f"/api/v1/reservations/{world.b.reservation.pk}/"
    expect(api.get(url).status_code == 404, "A reads B's reservation")
    patched = api.patch(url, {"mu_per_min": 1}, format="json")
    expect(_refused(patched), f"PATCH on B's reservation answered {patched.status_code}")
    world.b.reservation.refresh_from_db()
    expect(world.b.reservation.mu_per_min == 1e6, "B's reservation changed")
    return f"only A's reservation listed; B's: read 404, PATCH {patched.status_code}"


@security_case("isolation.api_other_tenants_keys_and_webhooks", "tenant A lists, revokes or deletes B's keys/hooks")
def other_tenants_keys_and_webhooks(world: SecurityWorld) -> str:
    api = world.api(world.a.keys["write"])
    keys = _ids(api.get("/api/v1/api-keys/"))
    expect(keys and not keys & {row.pk for row in world.b.key_rows.values()}, "A lists B's API keys")
    their_key = world.b.key_rows["full"]
    revoked = api.post(f"/api/v1/api-keys/{their_key.pk}/revoke/")
    expect(revoked.status_code == 404, f"revoking B's key answered {revoked.status_code}")
    their_key.refresh_from_db()
    expect(their_key.revoked_at is None, "B's key was revoked by A")
    hooks = _ids(api.get("/api/v1/webhooks/"))
    expect(world.b.webhook.pk not in hooks, "A lists B's webhook")
    deleted = api.delete(f"/api/v1/webhooks/{world.b.webhook.pk}/")
    expect(deleted.status_code == 404, f"deleting B's webhook answered {deleted.status_code}")
    return "B's keys and webhooks are not listed; revoke and delete answered 404"


@security_case("isolation.api_key_scopes", "keys and members act beyond their scope or role; anonymous calls")
def key_scopes(world: SecurityWorld) -> str:
    hook = {"name": "probe", "url": "https://hooks.example/x"}
    checks = {
        "anonymous GET endpoints": world.api(None).get("/api/v1/endpoints/").status_code in (401, 403),
        "bogus key": world.api("ick_not-a-real-key-000000000000").get("/api/v1/endpoints/").status_code == 401,
        "inference-only key on the API": world.api(world.a.keys["inference"]).get("/api/v1/endpoints/").status_code
        == 403,
        "read key writes": world.api(world.a.keys["read"]).post("/api/v1/webhooks/", hook, format="json").status_code
        == 403,
        "member writes": world.api(world.a.member).post("/api/v1/webhooks/", hook, format="json").status_code == 403,
    }
    failed = [name for name, ok in checks.items() if not ok]
    expect(not failed, "not refused: " + ", ".join(failed))
    return f"{len(checks)} refused: " + ", ".join(checks)


@security_case("isolation.api_key_cannot_mint_stronger_key", "a leaked key mints a key with more scopes or priority")
def key_cannot_mint_stronger_key(world: SecurityWorld) -> str:
    api = world.api(world.a.keys["write"])  # read + write, max priority standard
    attempts = {
        "more scopes": {"name": "x", "scopes": ["inference", "read", "write"]},
        "higher priority": {"name": "x", "scopes": ["read"], "max_priority": "critical"},
        "another tenant": {"name": "x", "scopes": ["read"], "tenant": world.b.tenant.pk},
    }
    accepted = [
        label
        for label, body in attempts.items()
        if api.post("/api/v1/api-keys/", body, format="json").status_code < 400
    ]
    own = world.a.key_rows["write"]
    widened = api.patch(f"/api/v1/api-keys/{own.pk}/", {"scopes": ["inference", "read", "write"]}, format="json")
    if widened.status_code < 400:
        accepted.append("widening itself")
    expect(not accepted, "accepted: " + ", ".join(accepted))
    control = api.post("/api/v1/api-keys/", {"name": "weaker", "scopes": ["read"]}, format="json")
    expect(control.status_code == 201, f"even a weaker key was refused ({control.status_code}): proves nothing")
    return "stronger scopes, priority, another tenant and self-widening refused; a weaker key allowed"


# -- through the proxy ---------------------------------------------------------------------------------------------
def _error(response) -> dict:
    try:
        return response.json().get("error") or {}
    except ValueError:
        return {}


@security_case(
    "isolation.proxy_other_tenants_model",
    "tenant A's key sends completions to tenant B's private endpoint through the proxy",
    needs_proxy=True,
)
def proxy_other_tenants_model(world: SecurityWorld) -> str:
    key = world.a.keys["inference"]
    own = world.proxy_post(key, world.completion(world.a.endpoint.name))
    expect(own.status_code == 200, f"A's own endpoint answered {own.status_code}: the case proves nothing")
    theirs = world.proxy_post(key, world.completion(world.b.endpoint.name))
    missing = world.proxy_post(key, world.completion(f"{world.tag}-no-such-model"))
    expect(theirs.status_code == 404, f"B's endpoint answered {theirs.status_code} to A's key")
    # B's endpoint must look exactly like one that does not exist: no existence oracle.
    same = {k: _error(theirs).get(k) for k in ("type", "code", "param")} == {
        k: _error(missing).get(k) for k in ("type", "code", "param")
    }
    expect(same, f"B's endpoint is told apart from a missing one: {_error(theirs)} vs {_error(missing)}")
    return f"404 {_error(theirs).get('code')}, indistinguishable from a model that does not exist"


@security_case(
    "isolation.proxy_credentials",
    "the proxy is called anonymously, with a bogus key or an API-only key",
    needs_proxy=True,
)
def proxy_credentials(world: SecurityWorld) -> str:
    body = world.completion(world.a.endpoint.name)
    statuses = {
        "anonymous": (world.proxy_post(None, body).status_code, 401),
        "bogus key": (world.proxy_post("ick_not-a-real-key-000000000000", body).status_code, 401),
        "read-only key": (world.proxy_post(world.a.keys["read"], body).status_code, 403),
        "write key without inference": (world.proxy_post(world.a.keys["write"], body).status_code, 403),
    }
    wrong = [f"{label} got {got}" for label, (got, want) in statuses.items() if got != want]
    expect(not wrong, "; ".join(wrong))
    return ", ".join(f"{label} {got}" for label, (got, _) in statuses.items())
