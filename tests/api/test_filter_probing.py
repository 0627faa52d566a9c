"""Filters by a foreign key cannot tell another tenant's object from a missing one."""

import pytest
from django.urls import reverse


@pytest.mark.parametrize(
    "route, field, target",
    [
        ("user-list", "tenant", "tenant"),
        ("api-key-list", "tenant", "tenant"),
        ("reservation-list", "tenant", "tenant"),
        ("reservation-list", "endpoint", "endpoint"),
        ("replica-list", "endpoint", "endpoint"),
        ("endpoint-list", "owner_tenant", "tenant"),
    ],
)
def test_another_tenants_id_answers_like_a_missing_one(world, route, field, target):
    client = world.client("a_admin")
    other = client.get(reverse(route), {field: getattr(world.b, target).pk})
    missing = client.get(reverse(route), {field: 10**9})
    assert other.status_code == missing.status_code == 200, (other.content, missing.content)
    assert other.json()["results"] == missing.json()["results"] == []


def test_own_id_still_filters_and_garbage_is_a_field_error(world):
    client = world.client("a_admin")
    mine = client.get(reverse("user-list"), {"tenant": world.a.tenant.pk})
    assert {row["username"] for row in mine.json()["results"]} >= {"a-admin", "a-member"}
    bad = client.get(reverse("user-list"), {"tenant": "two"})
    assert bad.status_code == 400 and "tenant" in bad.json()
