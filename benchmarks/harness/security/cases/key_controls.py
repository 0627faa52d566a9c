"""Attacks on per-key controls and budgets (docs/security.md, "Per-key controls", "Budgets"): a leaked limited
key minting an unlimited one, and a tenant reading another's key spend or budget."""

from __future__ import annotations

from django.urls import reverse

from benchmarks.harness.security.registry import expect, security_case
from benchmarks.harness.security.world import SecurityWorld
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create


@security_case(
    "keys.cannot_mint_past_its_controls",
    "a key with an RPM limit, an allowlist and a budget mints a key without them, or with larger ones",
)
def cannot_mint_past_its_controls(world: SecurityWorld) -> str:
    _, raw = api_key_create(
        tenant=world.a.tenant,
        name=f"{world.tag} limited",
        scopes=["inference", "read", "write"],
        rpm_limit=10,
        allowed_models=[world.a.endpoint.name],
        budget_usd=5.0,
    )
    api, url = world.api(raw), reverse("api-key-list")
    attempts = {
        "no RPM limit": ({"rpm_limit": None}, "rpm_limit"),
        "a larger RPM limit": ({"rpm_limit": 1000}, "rpm_limit"),
        "every model": ({"allowed_models": []}, "allowed_models"),
        "another model too": ({"allowed_models": [world.a.endpoint.name, world.shared.name]}, "allowed_models"),
        "no budget": ({"budget_usd": None}, "budget_usd"),
        "a larger budget": ({"budget_usd": 10_000}, "budget_usd"),
    }
    wrong = []
    for label, (body, field) in attempts.items():
        response = api.post(url, {"name": "x", "scopes": ["inference"], **body}, format="json")
        if response.status_code != 400 or field not in response.json():
            wrong.append(f"{label} {response.status_code}")
    expect(not wrong, "accepted: " + ", ".join(wrong))
    unsaid = api.post(url, {"name": "child", "scopes": ["inference"]}, format="json")
    expect(unsaid.status_code == 201, f"a key within its controls was refused ({unsaid.status_code}): proves nothing")
    child = ApiKey.objects.get(pk=unsaid.json()["id"])
    expect(
        (child.rpm_limit, child.allowed_models, child.budget_usd) == (10, [world.a.endpoint.name], 5.0),
        f"a child with nothing said got {child.rpm_limit}, {child.allowed_models}, {child.budget_usd}",
    )
    return "children without or past the holder's RPM limit, allowlist or budget 400; an unsaid one inherits them"


@security_case(
    "isolation.key_spend_and_budgets",
    "tenant B's admin and keys read tenant A's key spend, key budgets or tenant budget",
)
def key_spend_and_budgets(world: SecurityWorld) -> str:
    a_key = world.a.key_rows["inference"]
    ApiKey.objects.filter(pk=a_key.pk).update(budget_usd=123.0)
    Tenant.objects.filter(pk=world.a.tenant.pk).update(budget_usd=456.0)
    leaks = []
    for who in (world.b.admin, world.b.keys["read"]):
        api = world.api(who)
        spend = api.get(reverse("key-spend"), {"api_key": a_key.pk})
        if spend.status_code != 200 or spend.json()["results"]:
            leaks.append(f"key-spend {spend.status_code} {str(spend.content)[:80]}")
        listed = api.get(reverse("key-spend")).json()["results"]
        if any(row["tenant"] != world.b.tenant.pk for row in listed):
            leaks.append("key-spend list holds another tenant's keys")
        key = api.get(reverse("api-key-detail", args=[a_key.pk]))
        if key.status_code != 404:
            leaks.append(f"api-key detail {key.status_code}")
        tenant = api.get(reverse("tenant-detail", args=[world.a.tenant.pk]))
        if tenant.status_code != 404:
            leaks.append(f"tenant detail {tenant.status_code}")
    expect(not leaks, "; ".join(leaks))
    own = world.api(world.a.admin).get(reverse("key-spend"), {"api_key": a_key.pk}).json()["results"]
    expect(own and own[0]["budget_usd"] == 123.0, "tenant A cannot read its own key's budget: proves nothing")
    return "B's admin and read key see none of A's key spend, key budgets or tenant budget (404 or empty)"
