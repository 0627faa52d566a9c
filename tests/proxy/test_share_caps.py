"""Caps moved replica by replica (``gateway.proxy.caps``) must not leave a stale cap behind: a replica that leaves the
snapshot and comes back, or that an outage gave an even share while it drained, admits nothing until the heartbeat
works its cap out again, for another process may hold all of it by then. Each test runs the real heartbeat script on
Redis, with a second process beating beside this one; each failed before ``caps.new_cap`` and the recovery beat's
caps worked out whole."""

import asyncio
import dataclasses

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from gateway.proxy.config import ProxyConfig
from gateway.proxy.membership import HEARTBEAT
from gateway.proxy.state import ProxyState
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import endpoint, snapshot


def _held(key: str, pid: str) -> dict[str, int]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return {k.decode(): int(v) for k, v in client.hgetall(f"{key}:h:{pid}").items()}
    finally:
        client.close()


async def _state(key: str, client):
    ep = endpoint(id=7, name="e", replicas=2, limit=4)  # replicas "100" and "101", 4 slots each
    state = ProxyState(ProxyConfig(member_ttl_s=60.0))
    state.members_key, state.redis = key, object()
    state._heartbeat = client.register_script(HEARTBEAT)
    state.snapshot = snapshot(endpoints=[ep])
    rt = state.runtime_for(ep)
    await state._beat()
    await state._beat()
    assert rt.caps == {"100": 4, "101": 4}
    return state, rt, ep


async def _other_takes_100(key: str, client) -> None:
    """Another process joins and is granted all of "100" (this one gave it back)."""
    other = client.register_script(HEARTBEAT)
    await other(keys=[key], args=["other", '{"100":4}', '{"100":4}', "{}", "{}", "60.0", '{"100":4}', "0"])


async def _queue_then_bring_100_back(state, rt, ep) -> int:
    """Fill "101", queue three requests, bring "100" back in a snapshot: what started on "100"."""
    free = rt.slots["101"].view.concurrency_limit - rt.slots["101"].view.in_flight
    assert all(rt.try_take(RouteRequest(request_id=f"r{i}", prompt_text="hi"), 0.1) for i in range(free))
    queued = [
        asyncio.ensure_future(
            rt.acquire(RouteRequest(request_id=f"q{i}", prompt_text="hi"), tenant="t", priority="standard", mu=0.1)
        )
        for i in range(3)
    ]
    await asyncio.sleep(0)
    assert len(rt.queue) == 3
    state.apply_snapshot(snapshot(endpoints=[ep]))
    await asyncio.sleep(0)
    for waiting in queued:
        waiting.cancel()
    return rt.slots["100"].view.in_flight


def test_a_replica_back_in_the_snapshot_does_not_admit_on_the_cap_it_had_before_it_went(members_key):
    key = members_key

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        state, rt, ep = await _state(key, client)
        route = RouteRequest(request_id="a", prompt_text="hi")
        slot = rt.try_take(route, 0.1, exclude={"101"})
        state.apply_snapshot(snapshot(endpoints=[dataclasses.replace(ep, replicas=ep.replicas[1:])]))
        rt.release(slot, route, 0.1, 0.1)  # its last stream: the slot is dropped
        assert "100" not in rt.slots
        await state._beat()  # "100" given back
        assert "100" not in state._book.holdings
        await _other_takes_100(key, client)
        await state._beat()
        await state._beat()
        started = await _queue_then_bring_100_back(state, rt, ep)
        await client.aclose()
        return started, _held(key, state.process_id).get("100", 0), _held(key, "other").get("100", 0)

    started, held, other = asyncio.run(scenario())
    assert other == 4 and held == 0 and started == 0


def test_an_outages_even_share_of_a_draining_replica_does_not_outlive_the_outage(members_key):
    key = members_key

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        state, rt, ep = await _state(key, client)
        script = state._heartbeat
        slot = rt.try_take(RouteRequest(request_id="a", prompt_text="hi"), 0.1, exclude={"101"})
        assert slot.view.replica_id == "100"
        state.apply_snapshot(snapshot(endpoints=[dataclasses.replace(ep, replicas=ep.replicas[1:])]))
        await state._beat()  # "100" drains (one stream) and is given back
        assert "100" not in state._book.holdings and rt.caps["100"] == 0

        async def away(**_):
            raise redis.ConnectionError("away")

        state._heartbeat = away
        with pytest.raises(redis.ConnectionError):
            await state._beat()
        assert rt.caps["100"] == 4  # the outage's even share: the whole limit, this process being alone
        state._heartbeat = script
        await state._beat()  # Redis is back: caps from the holdings again, on every replica
        assert rt.caps["100"] == 0
        await _other_takes_100(key, client)
        started = await _queue_then_bring_100_back(state, rt, ep)
        await client.aclose()
        return started - 1, _held(key, state.process_id).get("100", 0)  # less the stream that drained

    started, held = asyncio.run(scenario())
    assert held == 0 and started == 0
