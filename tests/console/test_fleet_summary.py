"""The fleet page at a glance: totals over every endpoint (GPUs held and their price per hour, replicas by state,
MU have / sold / used), cards while there are few endpoints and a sortable, paginated table when there are many."""

import re

import pytest
from django.urls import reverse

from console.fleet_summary import CARDS_UP_TO, PAGE_SIZE
from endpoints.models import ReplicaState
from tests.factories import EndpointFactory, HardwareProfileFactory, ReplicaFactory

pytestmark = pytest.mark.django_db


def _total(page: str, name: str) -> str:
    return re.search(rf'data-total="{name}">([^<]+)<', page).group(1).strip()


def test_totals_count_gpus_at_each_replicas_own_price(client, operator, tenant_a, tenant_b):
    # tenant A's endpoint: a100-80g at $2.50 per GPU-hour. Two ready, one starting, one stopped (not held).
    for state in (ReplicaState.READY, ReplicaState.READY, ReplicaState.STARTING, ReplicaState.STOPPED):
        ReplicaFactory(endpoint=tenant_a.endpoint, state=state)
    # A replica of a pool on its own profile: 4 GPUs at $10 each; and one on a profile with no price.
    pool = HardwareProfileFactory(name="h100-x4", gpus_per_replica=4, usd_per_gpu_hour=10.0)
    ReplicaFactory(endpoint=tenant_b.endpoint, state=ReplicaState.READY, hardware_profile=pool)
    unpriced = HardwareProfileFactory(name="mystery", usd_per_gpu_hour=None)
    ReplicaFactory(endpoint=tenant_b.endpoint, state=ReplicaState.DRAINING, hardware_profile=unpriced)
    client.force_login(operator)
    page = client.get(reverse("console:fleet")).content.decode()
    assert _total(page, "gpus") == "8"  # 3 + 4 + 1
    assert _total(page, "usd-per-hour").startswith("$47.50/h USD")  # 3 × 2.50 + 4 × 10
    assert "+1 GPUs with no list price" in page
    assert 'data-total-state="ready">3 ready' in page and 'data-total-state="starting">1 starting' in page
    assert 'class="endpoint-card"' in page or "endpoint-card" in page  # two endpoints: cards
    assert 'id="fleet-table"' not in page


def test_many_endpoints_are_a_sorted_paginated_table(client, operator):
    count = PAGE_SIZE + 5
    assert count > CARDS_UP_TO
    endpoints = [EndpointFactory(name=f"ep-{i:03d}") for i in range(count)]
    for i, endpoint in enumerate(endpoints[:3]):  # ep-000 … ep-002: 1, 2, 3 ready replicas
        for _ in range(i + 1):
            ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY)
    client.force_login(operator)
    first = client.get(reverse("console:fleet")).content.decode()
    assert 'id="fleet-table"' in first and "endpoint-card" not in first
    names = re.findall(r'<tr data-endpoint="\d+">\s*<td><a [^>]+>([^<]+)</a>', first)
    assert names == [f"ep-{i:03d}" for i in range(PAGE_SIZE)]
    assert "page 1 of 2" in first
    second = client.get(reverse("console:fleet"), {"view": "table", "page": 2}).content.decode()
    assert re.findall(r'<tr data-endpoint="\d+">\s*<td><a [^>]+>([^<]+)</a>', second)[-1] == f"ep-{count - 1:03d}"
    by_ready = client.get(reverse("console:fleet"), {"view": "table", "sort": "ready", "dir": "desc"}).content
    top = re.findall(r'<tr data-endpoint="\d+">\s*<td><a [^>]+>([^<]+)</a>', by_ready.decode())[:3]
    assert top == ["ep-002", "ep-001", "ep-000"]
    assert 'aria-sort="descending"' in by_ready.decode()
    # Unknown sort keys fall back to the name; the cards can still be asked for, one page at a time.
    assert client.get(reverse("console:fleet"), {"sort": "drop table"}).status_code == 200
    cards = client.get(reverse("console:fleet"), {"view": "cards"}).content.decode()
    assert cards.count("endpoint-card") == PAGE_SIZE
