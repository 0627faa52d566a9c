"""Which reservation a request draws from (docs/lora.md): a request naming a LoRA adapter draws from that adapter's
reservation when its tenant holds one, else from the tenant's base-model reservation on the endpoint; a base-model
request never draws from an adapter's. All from the snapshot; the buckets of the two are apart in Redis."""

import asyncio
import dataclasses

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from endpoints.models import Adapter
from gateway.proxy.errors import ProxyError
from gateway.proxy.limits import RateLimiter
from gateway.proxy.snapshot import ReservationInfo
from gateway.proxy.snapshot_loader import read_snapshot
from gateway.proxy.stages import charge_limits, price_request, resolve_model
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.snapshots import TENANT_A, TENANT_B, key
from tests.proxy.test_lora import BASE, world
from tests.proxy.test_stages import chat

SUPPORT_FT_ID = 5


def adapter_reservation(*, mu_per_min=120.0, priority="critical", rpm=None) -> ReservationInfo:
    return ReservationInfo(
        mu_per_min=mu_per_min, burst_minutes=1.0, priority=priority, rpm_limit=rpm, tpm_limit=None,
        adapter_id=SUPPORT_FT_ID,
    )  # fmt: skip


def reserved_world(*, base=True, rpm=None):
    """Tenant A: a standard base-model reservation of 600 MU/min on chat-7b (unless ``base`` is false) and a critical
    one of 120 MU/min for its adapter support-ft; shared-ft has none."""
    snap = world()
    if not base:
        snap.reservations.clear()
    snap.adapter_reservations[(TENANT_A, BASE.id, "support-ft")] = adapter_reservation(rpm=rpm)
    return dataclasses.replace(snap)  # built again, so its derived totals count the reservation just added


def price(snap, model, *, tenant_id=TENANT_A, best_effort=0.0):
    k = key(tenant_id=tenant_id)
    endpoint, adapter = resolve_model(snap, k, chat(model, max_tokens=50))
    return price_request(
        snap, key=k, endpoint=endpoint, req=chat(model, max_tokens=50), requested=None,
        best_effort_mu_per_min=best_effort, adapter=adapter,
    )  # fmt: skip


def test_an_adapter_request_draws_from_its_adapters_reservation_others_from_the_base_models():
    snap = reserved_world()
    lora = price(snap, "support-ft")
    assert lora.priority == "critical"
    assert [(b.name, b.capacity, b.scope) for b in lora.buckets] == [("mu", 120.0, f"adapter{SUPPORT_FT_ID}")]
    for model in ("shared-ft", "chat-7b"):  # an adapter without a reservation of its own; the base model itself
        drawn = price(snap, model)
        assert drawn.priority == "standard" and [(b.capacity, b.scope) for b in drawn.buckets] == [(600.0, "")]
    # Fair pain weighs the tenant's load on the endpoint against all it reserved there.
    assert lora.reserved_mu_per_s == drawn.reserved_mu_per_s == pytest.approx(720.0 / 60)
    # Another tenant using the shared adapter draws from nothing of A's.
    assert price(snap, "shared-ft", tenant_id=TENANT_B, best_effort=100.0).buckets[0].name == "best_effort_mu"


def test_base_model_requests_never_draw_from_an_adapter_reservation():
    snap = reserved_world(base=False)
    assert price(snap, "support-ft").buckets[0].scope == f"adapter{SUPPORT_FT_ID}"
    base = price(snap, "chat-7b", best_effort=300.0)
    assert base.priority == "sheddable" and [(b.name, b.scope) for b in base.buckets] == [("best_effort_mu", "")]


def test_the_adapters_buckets_run_out_apart_from_the_base_models_in_redis():
    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        async for stale in client.scan_iter("infercap:rl:*"):
            await client.delete(stale)
        limiter = RateLimiter(client, lease_fraction=0.0)  # every request asks Redis: the test reads its keys
        snap = reserved_world(rpm=2)
        k = key()
        for _ in range(2):
            await charge_limits(limiter, key=k, endpoint=BASE, price=price(snap, "support-ft"))
        with pytest.raises(ProxyError) as caught:
            await charge_limits(limiter, key=k, endpoint=BASE, price=price(snap, "support-ft"))
        assert (caught.value.status, "(rpm)" in caught.value.message) == (429, True)
        # The base model's bucket is untouched by the adapter's traffic.
        assert await charge_limits(limiter, key=k, endpoint=BASE, price=price(snap, "chat-7b"))
        keys = sorted([k.decode() async for k in client.scan_iter("infercap:rl:*")])
        await client.aclose()
        return keys

    prefix = f"infercap:rl:{TENANT_A}:{BASE.id}:"
    assert asyncio.run(scenario()) == [f"{prefix}adapter{SUPPORT_FT_ID}:mu", f"{prefix}adapter{SUPPORT_FT_ID}:rpm",
                                       f"{prefix}mu"]  # fmt: skip


@pytest.mark.django_db
def test_the_snapshot_carries_adapter_reservations_by_tenant_endpoint_and_adapter_name(tenant_a, tenant_b):
    endpoint = EndpointFactory(owner_tenant=None)
    ft = Adapter.objects.create(name="snap-ft", owner_tenant=None, endpoint=endpoint, rank=8, artifact_path="snap-ft")
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=40.0)
    ReservationFactory(tenant=tenant_a.tenant, endpoint=endpoint, adapter=ft, mu_per_min=10.0, priority="critical")
    ReservationFactory(tenant=tenant_b.tenant, endpoint=endpoint, adapter=ft, mu_per_min=5.0)
    snap = read_snapshot("1")
    a, b = tenant_a.tenant.pk, tenant_b.tenant.pk
    assert snap.reservations[(a, endpoint.pk)].adapter_id is None
    assert (a, endpoint.pk) in snap.reservations and (b, endpoint.pk) not in snap.reservations
    mine = snap.adapter_reservations[(a, endpoint.pk, "snap-ft")]
    assert (mine.adapter_id, mine.mu_per_min, mine.priority) == (ft.pk, 10.0, "critical")
    assert snap.reservation_for(b, endpoint.pk, "snap-ft").mu_per_min == 5.0
    assert snap.reservation_for(b, endpoint.pk) is None  # B's base-model traffic: best effort
    assert snap.reserved_mu_per_min(a, endpoint.pk) == 50.0
