"""Tenant limits: Redis token buckets shared by limiter instances (as by proxy processes), and the fail modes."""

import asyncio

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from gateway.proxy.limits import Bucket, LimiterUnavailable, LocalBuckets, RateLimiter, buckets_for
from gateway.proxy.snapshot import ReservationInfo


def run(coro):
    return asyncio.run(coro)


async def _flush(client):
    async for key in client.scan_iter("infercap:rl:*"):
        await client.delete(key)


def test_buckets_from_reservation():
    res = ReservationInfo(mu_per_min=120.0, burst_minutes=0.5, priority="standard", rpm_limit=10, tpm_limit=1000)
    bs = {b.name: b for b in buckets_for(reservation=res, mu=3.0, tokens=200)}
    assert bs["mu"].capacity == 60.0 and bs["mu"].refill_per_s == 2.0 and bs["mu"].cost == 3.0
    assert bs["rpm"].capacity == 10 and bs["tpm"].cost == 200
    assert buckets_for(reservation=None, mu=3.0, tokens=10) == []


def test_shared_buckets_across_two_limiters_and_retry_after():
    async def scenario():
        a = aioredis.Redis.from_url(settings.REDIS_URL)
        b = aioredis.Redis.from_url(settings.REDIS_URL)
        await _flush(a)
        la, lb = RateLimiter(a), RateLimiter(b)
        rpm = [Bucket("rpm", 4.0, 4 / 60.0, 1.0)]
        results = []
        for i in range(6):
            limiter = la if i % 2 == 0 else lb
            results.append(await limiter.acquire(tenant_id=1, endpoint_id=2, buckets=rpm))
        assert [w == 0 for w, _ in results] == [True] * 4 + [False] * 2
        wait, which = results[-1]
        assert which == "rpm" and 10 < wait <= 15.5  # one request refills in 15 s
        # A request bigger than the whole bucket still runs once it is full, leaving the bucket in debt.
        big = [Bucket("mu", 10.0, 10.0, 25.0)]
        assert (await la.acquire(tenant_id=1, endpoint_id=3, buckets=big))[0] == 0
        wait, _ = await lb.acquire(tenant_id=1, endpoint_id=3, buckets=[Bucket("mu", 10.0, 10.0, 1.0)])
        assert 1.4 < wait <= 1.6
        # Settling refunds what the estimate over-charged.
        await la.settle(tenant_id=1, endpoint_id=3, buckets=big, actual={"mu": 0.0})
        assert (await lb.acquire(tenant_id=1, endpoint_id=3, buckets=[Bucket("mu", 10.0, 10.0, 1.0)]))[0] == 0
        await _flush(a)
        await a.aclose()
        await b.aclose()

    run(scenario())


def test_fail_open_uses_local_buckets_and_fail_closed_refuses():
    async def scenario():
        dead = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
        rpm = [Bucket("rpm", 2.0, 2 / 60.0, 1.0)]
        open_limiter = RateLimiter(dead, fail_mode="open")
        got = [(await open_limiter.acquire(tenant_id=1, endpoint_id=1, buckets=rpm))[0] for _ in range(3)]
        assert got[:2] == [0.0, 0.0] and got[2] > 0, "limits still hold per process while Redis is down"
        assert open_limiter.redis_failures == 1, "the breaker stops later requests from paying a connect timeout"
        closed = RateLimiter(dead, fail_mode="closed")
        with pytest.raises(LimiterUnavailable):
            await closed.acquire(tenant_id=1, endpoint_id=1, buckets=rpm)
        await dead.aclose()

    run(scenario())


def test_local_buckets_refill_with_the_clock():
    now = [0.0]
    local = LocalBuckets(clock=lambda: now[0])
    b = [Bucket("rpm", 1.0, 1.0, 1.0)]
    assert local.take(["k"], b) == (0.0, "")
    wait, which = local.take(["k"], b)
    assert which == "rpm" and wait == pytest.approx(1.0)
    now[0] = 1.0
    assert local.take(["k"], b) == (0.0, "")


def test_leases_spare_redis_round_trips_without_exceeding_the_shared_limit():
    async def scenario():
        a = aioredis.Redis.from_url(settings.REDIS_URL)
        b = aioredis.Redis.from_url(settings.REDIS_URL)
        await _flush(a)
        la, lb = RateLimiter(a), RateLimiter(b)
        # 200 units, no refill to speak of, 1 per request: leases of 10 (5%) serve most requests locally.
        bucket = [Bucket("mu", 200.0, 1e-6, 1.0)]
        admitted = 0
        for i in range(300):
            limiter = la if i % 3 else lb
            wait, _ = await limiter.acquire(tenant_id=9, endpoint_id=9, buckets=bucket)
            admitted += wait == 0
            if i == 149:
                calls = la.redis_calls + lb.redis_calls
                assert admitted == 150 and calls <= 25, f"{calls} Redis calls for 150 admitted requests"
        assert admitted <= 200, "two processes together never admit more than the bucket holds"
        assert admitted >= 180, "leases only lapse unspent when a process stops using them"
        await _flush(a)
        await a.aclose()
        await b.aclose()

    run(scenario())


async def _level(client, key: str) -> float:
    raw = await client.hget(key, "tokens")
    return float(raw) if raw is not None else float("nan")


def test_lapsed_leases_go_back_to_the_bucket_so_an_idle_share_never_drains_it():
    """A tenant far below its limit, with pauses longer than a lease lives: every token not spent comes back."""

    async def scenario():
        a = aioredis.Redis.from_url(settings.REDIS_URL)
        await _flush(a)
        limiter = RateLimiter(a, lease_ttl_s=0.05)
        bucket = [Bucket("mu", 100.0, 1e-9, 1.0)]  # leases of 5; without returns 17 requests would empty it
        key = limiter.keys(7, 7, bucket)[0]
        results = []
        for _ in range(40):
            results.append((await limiter.acquire(tenant_id=7, endpoint_id=7, buckets=bucket))[0])
            await asyncio.sleep(0.06)  # on purpose: the 0.05 s lease lapses between requests
        assert results == [0.0] * 40
        await limiter.sweep()
        assert limiter.leased(key) == 0.0
        # Conservation: what is in Redis is the capacity less what was spent.
        assert await _level(a, key) == pytest.approx(60.0, abs=1e-3)
        await _flush(a)
        await a.aclose()

    run(scenario())


def test_busy_tenant_is_served_from_leases_topped_up_in_the_background():
    async def scenario():
        a = aioredis.Redis.from_url(settings.REDIS_URL)
        b = aioredis.Redis.from_url(settings.REDIS_URL)
        await _flush(a)
        la, lb = RateLimiter(a, lease_ttl_s=0.3), RateLimiter(b, lease_ttl_s=0.3)
        bucket = [Bucket("mu", 400.0, 1e-9, 1.0)]  # leases of 20
        key = la.keys(5, 5, bucket)[0]
        admitted = 0
        for i in range(150):
            limiter = la if i % 2 else lb
            admitted += (await limiter.acquire(tenant_id=5, endpoint_id=5, buckets=bucket))[0] == 0
            # Corrections of earlier requests stay in the lease (no Redis call per request).
            await limiter.settle(tenant_id=5, endpoint_id=5, buckets=bucket, actual={"mu": 0.5})
            await asyncio.sleep(0.01)  # on purpose: the 150 requests span several lease lifetimes
        assert admitted == 150
        # Requests waited for Redis only when a process had no lease yet (or it lapsed between two turns).
        assert la.blocking_calls + lb.blocking_calls <= 6, (la.blocking_calls, lb.blocking_calls)
        await asyncio.sleep(0.35)  # on purpose: past the 0.3 s lease lifetime, so the sweep returns every lease
        await la.sweep()
        await lb.sweep()
        # Conservation across both processes: 150 requests × 0.5 MU each were really spent.
        assert await _level(a, key) == pytest.approx(400.0 - 75.0, abs=1e-3)
        await _flush(a)
        await a.aclose()
        await b.aclose()

    run(scenario())
