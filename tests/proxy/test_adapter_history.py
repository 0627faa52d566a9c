"""The books' history of each LoRA adapter reaches the proxies' router: usage records → ``Adapter.request_rate``
(a beat task) → the config snapshot → ``InfercapRouter.set_adapter_history`` (docs/lora.md#routing)."""

import dataclasses
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from endpoints.adapters import ADAPTER_RATE_WINDOW_S, adapter_rates_refresh
from endpoints.config_version import VERSION_KEY
from endpoints.models import Adapter
from gateway.proxy.config import ProxyConfig
from gateway.proxy.snapshot_loader import read_snapshot
from gateway.proxy.state import ProxyState
from tests.adapter_artifacts import LORA_OPTIONS
from tests.factories import EndpointFactory, TenantFactory, UsageRecordFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def served():
    tenant = TenantFactory()
    endpoint = EndpointFactory(owner_tenant=tenant, launch_options=dict(LORA_OPTIONS), routing_policy="infercap")
    other = EndpointFactory(owner_tenant=tenant, launch_options=dict(LORA_OPTIONS), routing_policy="infercap")
    adapters = {
        name: Adapter.objects.create(name=name, owner_tenant=tenant, endpoint=ep, rank=8, artifact_path=name)
        for name, ep in (("steady", endpoint), ("idle", endpoint), ("elsewhere", other))
    }
    return tenant, endpoint, other, adapters


def usage(tenant, endpoint, adapter, n, *, ago):
    for _ in range(n):
        UsageRecordFactory(tenant=tenant, endpoint=endpoint, adapter=adapter, finished_at=timezone.now() - ago)


def test_rates_come_from_the_last_days_usage_and_a_change_reloads_the_proxies(
    served, django_capture_on_commit_callbacks
):
    tenant, endpoint, other, adapters = served
    usage(tenant, endpoint, "steady", 6, ago=timedelta(hours=3))
    usage(tenant, endpoint, "steady", 4, ago=timedelta(days=2))  # older than the window: not counted
    usage(tenant, other, "elsewhere", 2, ago=timedelta(minutes=5))
    usage(tenant, endpoint, "", 9, ago=timedelta(minutes=5))  # base-model requests
    bus = redis.Redis.from_url(settings.REDIS_URL)
    before = int(bus.get(VERSION_KEY) or 0)
    with django_capture_on_commit_callbacks(execute=True):
        assert adapter_rates_refresh() == 2
    rates = dict(Adapter.objects.values_list("name", "request_rate"))
    assert rates == {
        "steady": pytest.approx(6 / ADAPTER_RATE_WINDOW_S),
        "idle": 0.0,
        "elsewhere": pytest.approx(2 / ADAPTER_RATE_WINDOW_S),
    }
    assert int(bus.get(VERSION_KEY) or 0) > before
    # Nothing moved by 10 %: no write, no reload.
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert adapter_rates_refresh() == 0
    assert callbacks == []
    # A day later the old requests age out.
    with django_capture_on_commit_callbacks(execute=True):
        assert adapter_rates_refresh(now=timezone.now() + timedelta(days=1)) == 2
    assert set(Adapter.objects.values_list("request_rate", flat=True)) == {0.0}


def test_the_snapshot_hands_each_endpoints_router_its_adapters_history(served):
    tenant, endpoint, other, adapters = served
    usage(tenant, endpoint, "steady", 6, ago=timedelta(hours=1))
    usage(tenant, other, "elsewhere", 3, ago=timedelta(hours=1))
    adapter_rates_refresh()
    snap = read_snapshot("v1")
    # By engine name: the router counts adapters as the replicas hold them (docs/lora-serving.md).
    steady = snap.adapters_by_name["steady"].engine_name
    assert steady.startswith(f"lora-t{tenant.pk}-{adapters['steady'].pk}-")
    assert snap.adapter_rates(endpoint.name) == {steady: pytest.approx(6 / ADAPTER_RATE_WINDOW_S)}
    state = ProxyState(ProxyConfig())
    state.snapshot = snap
    runtime = state.runtime_for(snap.endpoints_by_name[endpoint.name])
    assert runtime.router.adapter_book.history == {steady: pytest.approx(6 / ADAPTER_RATE_WINDOW_S)}
    # The next snapshot replaces it (here: the adapter's requests aged out).
    quiet = dataclasses.replace(
        snap,
        version="v2",
        adapters_by_name={n: dataclasses.replace(a, request_rate=0.0) for n, a in snap.adapters_by_name.items()},
    )
    state.apply_snapshot(quiet)
    assert runtime.router.adapter_book.history == {}


def test_the_beat_task_refreshes_the_rates(served):
    from workers.schedule import beat_schedule
    from workers.tasks.adapters import rates_refresh

    entry = beat_schedule()["adapters-rates-refresh"]
    assert entry["task"] == "adapters.rates_refresh" and entry["schedule"] == 300.0
    tenant, endpoint, _, _ = served
    usage(tenant, endpoint, "steady", 3, ago=timedelta(minutes=1))
    assert rates_refresh.apply().get() == 1
    assert Adapter.objects.get(name="steady").request_rate == pytest.approx(3 / ADAPTER_RATE_WINDOW_S)
