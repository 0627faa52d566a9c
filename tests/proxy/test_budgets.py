"""Budget arithmetic and the counters' cache (gateway/proxy/budgets.py), against the real Redis: periods in UTC,
Retry-After to the period's end, spend added per key and tenant, and checks that read Redis at most once a second."""

import asyncio
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from gateway.proxy.budgets import Budgets, period_label, seconds_left, spend_key
from gateway.proxy.errors import ProxyError
from gateway.proxy.snapshot import KeyInfo

T = datetime(2026, 2, 27, 23, 59, 30, tzinfo=UTC).timestamp()


def key(**kw) -> KeyInfo:
    base = dict(
        id=7, prefix="ik_x", tenant_id=3, tenant_slug="t", scopes=frozenset(), max_priority="standard", expires_at=None
    )
    return KeyInfo(**{**base, **kw})


def test_periods_are_utc_days_and_months_and_retry_after_ends_them():
    assert period_label("day", T) == "2026-02-27" and period_label("month", T) == "2026-02"
    assert seconds_left("day", T) == 30
    assert seconds_left("month", T) == 86400 + 30  # February 2026 has 28 days
    assert spend_key("key", 7, "2026-02") == "infercap:spend:key:7:2026-02"


def test_spend_is_counted_per_key_and_tenant_and_refused_once_read(clean_redis):
    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        clock = [T]
        tasks = []
        budgets = Budgets(
            client, usd_per_mu=0.01, clock=lambda: clock[0], spawn=lambda c: tasks.append(asyncio.ensure_future(c))
        )
        capped = key(budget_usd=1.0, budget_period="day", tenant_budget_usd=5.0)
        budgets.check(capped)  # nothing spent
        await asyncio.gather(*tasks)
        tasks.clear()
        await budgets.add(capped, 60.0)  # 0.60 USD
        await budgets.add(capped, 50.0)  # 1.10 USD: past the key's 1.00
        assert float(await client.get("infercap:spend:key:7:2026-02-27")) == pytest.approx(1.10)
        assert float(await client.get("infercap:spend:tenant:3:2026-02")) == pytest.approx(1.10)
        assert 0 < await client.ttl("infercap:spend:key:7:2026-02-27") <= 40 * 86400
        with pytest.raises(ProxyError) as refused:
            budgets.check(capped)  # this process wrote the counter: it knows at once
        err = refused.value
        assert "daily budget of $1.00" in err.message
        assert (err.status, err.code, err.type, err.retry_after) == (429, "budget_exceeded", "insufficient_quota", 30)
        # Another process learns of the spend from Redis, at most a refresh interval later, in the background.
        other = Budgets(
            client, usd_per_mu=0.01, clock=lambda: clock[0], spawn=lambda c: tasks.append(asyncio.ensure_future(c))
        )
        other.check(capped)  # unknown yet: passes, and starts a read
        assert len(tasks) == 2  # the key's and the tenant's counters
        await asyncio.gather(*tasks)
        tasks.clear()
        with pytest.raises(ProxyError):
            other.check(capped)
        assert tasks == []  # fresh: no second read within the second
        # The next day the key's counter is a new one; the tenant's month goes on (1.10 of 5.00).
        clock[0] = T + 60
        other.check(capped)
        await asyncio.gather(*tasks)
        other.check(capped)
        # No budget, no counter: a request of a key without one adds nothing.
        await budgets.add(key(id=8), 100.0)
        assert await client.exists("infercap:spend:key:8:2026-02") == 0
        await client.aclose()

    asyncio.run(scenario())


def test_a_tenant_hard_stop_refuses_every_key_of_the_tenant(clean_redis):
    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        await client.set("infercap:spend:tenant:3:2026-02", "12.5")
        tasks = []
        budgets = Budgets(
            client, usd_per_mu=0.01, clock=lambda: T, spawn=lambda c: tasks.append(asyncio.ensure_future(c))
        )
        first, second = key(id=1, tenant_budget_usd=10.0), key(id=2, tenant_budget_usd=10.0)
        budgets.check(first)  # the tenant's counter not read yet: passes, and starts the read
        await asyncio.gather(*tasks)
        for some_key in (first, second):  # the tenant's one counter stops both keys
            with pytest.raises(ProxyError) as refused:
                budgets.check(some_key)
            assert "organisation's monthly budget of $10.00" in refused.value.message
        budgets.check(key(id=3, tenant_id=4, tenant_budget_usd=10.0))  # another tenant's counter: nothing spent
        await asyncio.gather(*tasks)
        budgets.check(key(id=3, tenant_id=4, tenant_budget_usd=10.0))
        await client.aclose()

    asyncio.run(scenario())
