"""Per-key controls and budgets over the REST API (docs/security.md, "Per-key controls", "Budgets"): set and read
with field errors for nonsense; a key minting or changing keys gives no more than it holds; each key's spend in its
period, for its own tenant only; tenants' budgets are the operators'; the minute's sync raises the proxies' Redis
counters to the records' spend and raises a tenant's soft alert once a month."""

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from billing.models import Webhook
from billing.notifiers import sign
from billing.spend import budget_counters_sync, usd_per_mu
from tenants.models import ApiKey, AuditEntry, Tenant
from tests.factories import UsageRecordFactory

pytestmark = pytest.mark.django_db

KEYS = reverse("api-key-list")


def test_a_tenant_sets_a_keys_controls_and_nonsense_is_a_field_error(world):
    client = world.client("a_admin")
    created = client.post(
        KEYS,
        {
            "name": "batch",
            "rpm_limit": 60,
            "tpm_limit": 100_000,
            "mu_per_min_limit": 500.5,
            "allowed_models": [world.a.endpoint.name, world.a.endpoint.name],
            "budget_usd": 25,
            "budget_period": "day",
        },
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["rpm_limit"], body["tpm_limit"], body["mu_per_min_limit"]) == (60, 100_000, 500.5)
    assert body["allowed_models"] == [world.a.endpoint.name] and (body["budget_usd"], body["budget_period"]) == (
        25,
        "day",
    )
    url = reverse("api-key-detail", args=[body["id"]])
    for payload, field in [
        ({"rpm_limit": 0}, "rpm_limit"),
        ({"budget_usd": -1}, "budget_usd"),
        ({"budget_period": "year"}, "budget_period"),
        ({"allowed_models": ["bad name!"]}, "allowed_models"),
        ({"allowed_models": "a-model"}, "allowed_models"),
        ({"mu_per_min_limit": "NaN"}, "mu_per_min_limit"),
    ]:
        refused = client.patch(url, payload, format="json")
        assert refused.status_code == 400 and field in refused.json(), (payload, refused.content)
    assert client.patch(url, {"rpm_limit": None, "allowed_models": []}, format="json").status_code == 200
    key = ApiKey.objects.get(pk=body["id"])
    assert key.rpm_limit is None and key.allowed_models == []
    assert AuditEntry.objects.filter(action="api_key.update", object_id=str(key.pk)).exists()


def test_a_key_gives_no_more_than_it_holds(world):
    holder = world.a.key
    ApiKey.objects.filter(pk=holder.pk).update(
        rpm_limit=10, allowed_models=[world.a.endpoint.name], budget_usd=5.0, budget_period="month"
    )
    client = world.client("a_write_key")
    inherited = client.post(KEYS, {"name": "child"}, format="json")
    assert inherited.status_code == 201, inherited.content
    child = inherited.json()
    assert (child["rpm_limit"], child["allowed_models"], child["budget_usd"]) == (10, [world.a.endpoint.name], 5.0)
    for payload, field in [
        ({"rpm_limit": 20}, "rpm_limit"),
        ({"rpm_limit": None}, "rpm_limit"),
        ({"allowed_models": [world.a.endpoint.name, "another-model"]}, "allowed_models"),
        ({"allowed_models": []}, "allowed_models"),
        ({"budget_usd": 50}, "budget_usd"),
        ({"budget_usd": 5, "budget_period": "day"}, None),  # per day is not within per month: refused too
    ]:
        refused = client.post(KEYS, {"name": "greedy", **payload}, format="json")
        assert refused.status_code == 400, (payload, refused.content)
        assert (field or "budget_usd") in refused.json()
    tighter = client.post(KEYS, {"name": "tighter", "rpm_limit": 5, "budget_usd": 1}, format="json")
    assert tighter.status_code == 201 and tighter.json()["rpm_limit"] == 5
    # Lifting a child's limit through the holder is refused as well; a person (tenant admin) may.
    child_url = reverse("api-key-detail", args=[child["id"]])
    assert client.patch(child_url, {"rpm_limit": 100}, format="json").status_code == 400
    assert world.client("a_admin").patch(child_url, {"rpm_limit": 100}, format="json").status_code == 200
    # ... and the holder cannot now touch that stronger key at all.
    assert client.patch(child_url, {"name": "renamed"}, format="json").status_code == 403


def test_key_spend_is_the_periods_mu_at_the_usage_price_and_stays_in_its_tenant(world):
    now = timezone.now()
    month_start = datetime(now.year, now.month, 1, tzinfo=UTC)
    day_start = datetime(now.year, now.month, now.day, tzinfo=UTC)
    key = world.a.key
    records = [(100.0, now), (40.0, day_start - timedelta(seconds=1)), (7.0, month_start - timedelta(days=2))]
    for mu, at in records:
        UsageRecordFactory(tenant=world.a.tenant, endpoint=world.a.endpoint, api_key=key, mu=mu, finished_at=at)
    in_month = sum(mu for mu, at in records if at >= month_start)
    in_day = sum(mu for mu, at in records if at >= day_start)
    assert in_day == 100.0 and in_month >= in_day  # the day before may be last month's (on the 1st)
    rows = world.client("a_admin").get(reverse("key-spend")).json()
    mine = next(r for r in rows["results"] if r["api_key"] == key.pk)
    assert mine["period"] == "month" and mine["spend_usd"] == pytest.approx(in_month * usd_per_mu())
    assert mine["budget_usd"] is None and mine["budget_left_usd"] is None
    ApiKey.objects.filter(pk=key.pk).update(budget_usd=1.0, budget_period="day")
    one = world.client("a_admin").get(reverse("key-spend"), {"api_key": key.pk}).json()["results"]
    assert one[0]["period"] == "day" and one[0]["spend_usd"] == pytest.approx(in_day * usd_per_mu())
    assert one[0]["budget_left_usd"] == pytest.approx(1.0 - in_day * usd_per_mu())
    # Tenant B sees none of A's keys; a non-number is a field error.
    assert world.client("b_admin").get(reverse("key-spend"), {"api_key": key.pk}).json()["results"] == []
    assert world.client("b_admin").get(reverse("key-spend"), {"api_key": "x"}).status_code == 400


def test_tenant_budgets_are_the_operators(world):
    url = reverse("tenant-detail", args=[world.a.tenant.pk])
    denied = world.client("a_admin").patch(url, {"budget_usd": 10**9}, format="json")
    assert denied.status_code == 403
    ok = world.client("operator").patch(
        url, {"budget_usd": 500, "budget_hard_stop": True, "budget_alert_fraction": 0.9}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["budget_hard_stop"] is True
    bad = world.client("operator").patch(url, {"budget_alert_fraction": 1.5}, format="json")
    assert bad.status_code == 400 and "budget_alert_fraction" in bad.json()


def test_the_sync_raises_counters_to_the_records_and_alerts_once(world, clean_redis):
    now = timezone.now()
    key = world.a.key
    ApiKey.objects.filter(pk=key.pk).update(budget_usd=100.0, budget_period="month")
    Tenant.objects.filter(pk=world.a.tenant.pk).update(budget_usd=0.001, budget_hard_stop=True)
    UsageRecordFactory(tenant=world.a.tenant, endpoint=world.a.endpoint, api_key=key, mu=1000.0, finished_at=now)
    month = f"{now.astimezone(UTC):%Y-%m}"
    clean_redis.set(f"infercap:spend:tenant:{world.a.tenant.pk}:{month}", "999")  # counted ahead of the records
    received = []

    def hook(request):
        received.append((request.headers.get("X-Infercap-Signature"), json.loads(request.content)))
        return httpx.Response(204)

    Webhook.objects.create(name="ops", url="http://127.0.0.1:9/hooks", secret="s3")  # the operators' own
    Webhook.objects.create(name="a-internal", url="http://127.0.0.1:9/a", tenant=world.a.tenant)  # SSRF: refused
    Webhook.objects.create(name="b-hook", url="http://127.0.0.1:9/b", tenant=world.b.tenant)  # not A's business
    http = httpx.Client(transport=httpx.MockTransport(hook))
    done = budget_counters_sync(now=now, client=clean_redis, http=http)
    assert done["alerted"] == [world.a.tenant.slug] and done["counters"] == 2
    assert float(clean_redis.get(f"infercap:spend:key:{key.pk}:{month}")) == pytest.approx(1000.0 * usd_per_mu())
    assert float(clean_redis.get(f"infercap:spend:tenant:{world.a.tenant.pk}:{month}")) == 999.0  # never lowered
    entry = AuditEntry.objects.get(action="tenant.budget_alert")
    assert entry.tenant_id == world.a.tenant.pk and entry.detail["hard_stop"] is True
    [(signature, payload)] = received  # the operators' hook only
    assert payload["event"] == "budget_alert" and payload["tenant"] == world.a.tenant.slug
    assert signature == sign("s3", json.dumps(payload, sort_keys=True).encode())
    assert entry.detail["deliveries"]["ops"] == "sent" and entry.detail["deliveries"]["a-internal"].startswith(
        "refused"
    )
    assert "b-hook" not in entry.detail["deliveries"]
    assert budget_counters_sync(now=now, client=clean_redis, http=http)["alerted"] == []  # once a month
    assert len(received) == 1


def test_without_redis_the_sync_sends_the_soft_alert_and_raises_no_counter(tenant_a, settings):
    """The embedded default has no Redis: the minute's sync must not fail there (it did, every minute, in
    ``make run``), and the soft alert still goes out."""
    settings.REDIS_URL = ""
    Tenant.objects.filter(pk=tenant_a.tenant.pk).update(budget_usd=0.0001, budget_alert_fraction=0.5)
    UsageRecordFactory(tenant=tenant_a.tenant, endpoint=tenant_a.endpoint, mu=10.0)
    done = budget_counters_sync(http=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))))
    assert done == {"counters": 0, "alerted": [tenant_a.tenant.slug]}
