"""Two real proxy processes share one replica's concurrency limit (``gateway.admission.shares``): together
they never exceed it, and a busy process borrows what an idle one does not use."""

import json
import re
import threading
import time

import httpx
import pytest

from billing.models import UsageRecord
from gateway.proxy.membership import MEMBERS_KEY
from tenants.models import CapacityReservation
from tenants.services import api_key_create
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import Held, chat_body, post, wait_for
from tests.proxy.test_admission_e2e import Fired

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIMIT = 3


def _requests_at_replica(url: str) -> int:
    """What the simulated replica holds: running plus waiting (its own queue would hide an overshoot)."""
    text = httpx.get(url + "/metrics", timeout=2).text
    total = 0.0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        total += sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([\d.e+]+)$", text, re.M))
    return int(total)


def _holdings(client) -> list[int]:
    """Each member's slots held, from its holdings hash beside the members hash (only what it holds is there)."""
    return [
        sum(map(int, client.hgetall(f"{MEMBERS_KEY}:h:{pid.decode()}").values())) for pid in client.hkeys(MEMBERS_KEY)
    ]


def _held_on(client, replica_id: str) -> list[int]:
    """Each member's slots held on one replica (0 where its holdings hash has none)."""
    return [int(client.hget(f"{MEMBERS_KEY}:h:{pid.decode()}", replica_id) or 0) for pid in client.hkeys(MEMBERS_KEY)]


def _members(client) -> list[dict]:
    return [json.loads(v) for v in client.hgetall(MEMBERS_KEY).values()]


def _all_beaten_after(client, moment: float) -> float | None:
    """The last beat time once every member has beaten after ``moment`` (Redis' clock); None before."""
    times = [m["t"] for m in _members(client)]
    return max(times) if times and min(times) > moment else None


def _admitted_at(request_ids: list[str]) -> list[float]:
    """When each request left its proxy's queue (arrival plus queue time, from its usage record), in order."""

    def records():
        found = {r.request_id: r for r in UsageRecord.objects.filter(request_id__in=request_ids)}
        return found if len(found) == len(request_ids) else None

    found = wait_for(records, message="the usage records")
    return [found[i].started_at.timestamp() + (found[i].queue_ms or 0.0) / 1000 for i in request_ids]


def _beaten_with_demand(client, demands: set[tuple[int, ...]]) -> float | None:
    """When the last of ``demands`` (running + queued per class, summed over replicas) was published, once every
    one of them is in some member's last heartbeat; None before."""
    seen = {}
    for member in _members(client):  # per replica: every class, the critical and the sheddable part (non-zero only)
        total, critical, sheddable = (sum(member.get(k, {}).values()) for k in ("q", "c", "x"))
        seen[(critical, total - critical - sheddable, sheddable)] = member["t"]
    return max(seen[d] for d in demands) if demands <= set(seen) else None


def _two_proxies(procs, clean_redis, endpoint, raw_key):
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0, concurrency_limit=LIMIT)
    bases = [spawn_proxy(procs), spawn_proxy(procs)]
    for base in bases:  # each process loads its state and joins the group on its first request
        assert post(base, raw_key, chat_body(endpoint.name, max_tokens=2)).status_code == 200
    # Both members hold slots: the idle pair split the limit between them.
    wait_for(lambda: sorted(_holdings(clean_redis)) == sorted([LIMIT // 2, LIMIT - LIMIT // 2]))
    return f"http://127.0.0.1:{port}", bases


def _fire_and_watch(replica_url, raw_key, requests):
    """Send ``requests`` ((base, body) pairs) at once; return their statuses and the replica's peak load."""
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _requests_at_replica(replica_url))
            time.sleep(0.01)

    results: list[int] = []

    def fire(base, body):
        results.append(post(base, raw_key, body, timeout=60).status_code)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=fire, args=request) for request in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    watcher.join(5)
    return results, peak[0]


def test_two_proxies_never_send_a_replica_more_than_its_limit(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    replica_url, bases = _two_proxies(procs, clean_redis, endpoint, tenant_a.raw_key)
    requests = [
        (bases[i % 2], chat_body(endpoint.name, max_tokens=30, content=f"request {i} through {bases[i % 2]}"))
        for i in range(4 * LIMIT)
    ]
    results, peak = _fire_and_watch(replica_url, tenant_a.raw_key, requests)
    assert results == [200] * (4 * LIMIT)  # the excess waited in the proxies' queues, none was refused
    # Each process alone would have sent up to LIMIT: together they stay within it, and use all of it.
    assert peak == LIMIT, peak
    assert sum(_holdings(clean_redis)) <= LIMIT


def test_a_busy_proxy_borrows_the_slots_an_idle_one_does_not_use(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    replica_url, bases = _two_proxies(procs, clean_redis, endpoint, tenant_a.raw_key)
    # Every request goes to one process; the other, idle, holds part of the limit until it sees the queue.
    requests = [
        (bases[0], chat_body(endpoint.name, max_tokens=60, content=f"request {i} to the busy one"))
        for i in range(3 * LIMIT)
    ]
    results, peak = _fire_and_watch(replica_url, tenant_a.raw_key, requests)
    assert results == [200] * (3 * LIMIT)
    assert peak == LIMIT, peak  # the whole limit, not the busy process's even share
    # Idle again: the two split the limit evenly again, within a few heartbeats.
    wait_for(lambda: sorted(_holdings(clean_redis)) == sorted([LIMIT // 2, LIMIT - LIMIT // 2]))


def test_critical_requests_queued_in_one_proxy_take_slots_before_sheddable_ones_queued_in_another(
    procs, clean_redis, tenant_a
):
    endpoint = tenant_a.endpoint
    CapacityReservation.objects.filter(tenant=tenant_a.tenant, endpoint=endpoint).update(
        priority="critical", mu_per_min=100_000
    )
    _, critical_key = api_key_create(tenant=tenant_a.tenant, name="critical", max_priority="critical")
    _, sheddable_key = api_key_create(tenant=tenant_a.tenant, name="sheddable", max_priority="sheddable")
    limit = 2
    spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0, concurrency_limit=limit)
    # The queue-age limit is not under test: under load the late sheddable request may wait past the 2 s default.
    a, b = spawn_proxy(procs, max_age_sheddable_s=30), spawn_proxy(procs, max_age_sheddable_s=30)
    for base in (a, b):
        assert post(base, critical_key, chat_body(endpoint.name, max_tokens=2)).status_code == 200
    wait_for(lambda: sorted(_holdings(clean_redis)) == [1, 1])
    # Proxy a runs two long sheddable streams (it borrows b's idle slot for the second) and queues a third.
    held = [Held(a, sheddable_key, chat_body(endpoint.name, max_tokens=1500)) for _ in range(limit)]
    late_sheddable = Fired(a, sheddable_key, chat_body(endpoint.name, max_tokens=3, content="sheddable"))
    # Proxy b queues two critical requests: everyone's next free slots are theirs.
    critical = [
        Fired(b, critical_key, chat_body(endpoint.name, max_tokens=3, content=f"critical {i}")) for i in (1, 2)
    ]
    # Both demands are published (a: 2 sheddable running + 1 queued; b: 2 critical queued). A beat computes the
    # allocation from the previous beat's read, so two more beats each and both processes admit by both demands.
    published_at = wait_for(
        lambda: _beaten_with_demand(clean_redis, {(0, 0, 3), (2, 0, 0)}), message="both demands published"
    )
    read_at = wait_for(lambda: _all_beaten_after(clean_redis, published_at), message="both processes read both")
    wait_for(lambda: _all_beaten_after(clean_redis, read_at), message="both processes admit by both demands")
    assert late_sheddable.response is None and all(c.response is None for c in critical)
    # The first slot a's streams give back goes to b's critical requests, not to a's own queued request.
    held[0].release()
    wait_for(lambda: any(c.response is not None for c in critical), timeout=30, message="a critical request served")
    assert late_sheddable.response is None
    held[1].release()
    assert [c.join().status_code for c in critical] == [200, 200]
    assert late_sheddable.join().status_code == 200
    # Admitted after both critical requests (it may finish first: once one critical request is left it needs one
    # slot, and the sheddable one may take the other).
    critical_ids = [c.response.headers["x-request-id"] for c in critical]
    admitted = _admitted_at([*critical_ids, late_sheddable.response.headers["x-request-id"]])
    assert admitted[-1] > max(admitted[:-1]), admitted
