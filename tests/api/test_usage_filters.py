"""Usage records: time range, endpoint, tenant and status filters, cursor pagination, tenant scoping."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from tests.factories import EndpointFactory, ReservationFactory, UsageRecordFactory

URL = "/api/v1/usage/"


def _ids(response):
    assert response.status_code == 200, response.content
    return {row["request_id"] for row in response.json()["results"]}


def test_time_range_endpoint_and_status_filters(world):
    now = timezone.now()
    a = world.a
    UsageRecordFactory(request_id="old", tenant=a.tenant, endpoint=a.endpoint, finished_at=now - timedelta(hours=3))
    UsageRecordFactory(
        request_id="recent", tenant=a.tenant, endpoint=a.endpoint, finished_at=now - timedelta(minutes=5)
    )
    UsageRecordFactory(request_id="shed", tenant=a.tenant, endpoint=a.endpoint, status="shed", finished_at=now)
    other = EndpointFactory(owner_tenant=a.tenant)
    UsageRecordFactory(request_id="elsewhere", tenant=a.tenant, endpoint=other, finished_at=now)
    client = world.client("a_member")

    since = (now - timedelta(hours=1)).isoformat()
    assert _ids(client.get(URL, {"since": since})) == {"recent", "shed", "elsewhere"}
    assert _ids(client.get(URL, {"until": since})) == {"old"}
    assert _ids(client.get(URL, {"endpoint": other.pk})) == {"elsewhere"}
    assert _ids(client.get(URL, {"status": "shed"})) == {"shed"}
    assert _ids(client.get(URL, {"status": ["shed", "ok"], "endpoint": a.endpoint.pk, "since": since})) == {
        "recent",
        "shed",
    }


def test_bad_filters_are_400(world):
    client = world.client("a_member")
    now = timezone.now()
    for params in (
        {"since": "yesterday"},
        {"status": "exploded"},
        {"endpoint": "abc"},
        {"tenant": world.b.tenant.pk},  # another tenant does not exist for tenant A
        {"since": now.isoformat(), "until": (now - timedelta(hours=1)).isoformat()},
    ):
        response = client.get(URL, params)
        assert response.status_code == 400, (params, response.content)


def test_tenant_sees_only_its_requests_on_a_shared_endpoint(world):
    shared = EndpointFactory()
    ReservationFactory(tenant=world.a.tenant, endpoint=shared)
    ReservationFactory(tenant=world.b.tenant, endpoint=shared)
    UsageRecordFactory(request_id="a-req", tenant=world.a.tenant, endpoint=shared)
    UsageRecordFactory(request_id="b-req", tenant=world.b.tenant, endpoint=shared)
    assert _ids(world.client("a_read_key").get(URL, {"endpoint": shared.pk})) == {"a-req"}
    assert _ids(world.client("operator").get(URL, {"endpoint": shared.pk})) == {"a-req", "b-req"}
    assert _ids(world.client("operator").get(URL, {"tenant": world.b.tenant.pk})) == {"b-req"}


def test_cursor_pagination_walks_every_record_once_newest_first(world):
    now = timezone.now()
    for i in range(7):
        UsageRecordFactory(
            request_id=f"r{i}",
            tenant=world.a.tenant,
            endpoint=world.a.endpoint,
            finished_at=now - timedelta(seconds=i),
        )
    client = world.client("a_admin")
    seen, url, params = [], URL, {"limit": 3}
    while url:
        body = client.get(url, params).json()
        seen += [row["request_id"] for row in body["results"]]
        url, params = body["next"], None
    assert seen == [f"r{i}" for i in range(7)]


def test_usage_rows_carry_names_not_secrets(world):
    UsageRecordFactory(request_id="x", tenant=world.a.tenant, endpoint=world.a.endpoint, api_key=world.a.key)
    response = world.client("a_member").get(reverse("usage-record-list"))
    row = response.json()["results"][0]
    assert row["endpoint_name"] == world.a.endpoint.name
    assert row["api_key_prefix"] == world.a.key.prefix
    assert world.a.key.key_hash.encode() not in response.content
