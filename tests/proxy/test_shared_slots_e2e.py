"""Two real proxy processes share one replica's concurrency limit (``endpoints.admission.shares``)."""

import json
import re
import threading
import time

import httpx
import pytest

from endpoints.proxy.state import MEMBERS_KEY
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import chat_body, post, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LIMIT = 3


def _requests_at_replica(url: str) -> int:
    """What the simulated replica holds: running plus waiting (its own queue would hide an overshoot)."""
    text = httpx.get(url + "/metrics", timeout=2).text
    total = 0.0
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        total += sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([\d.e+]+)$", text, re.M))
    return int(total)


def _settled(raw_entries) -> bool:
    entries = [json.loads(v) for v in raw_entries]
    return len(entries) == 2 and all(e["t"] > max(x["j"] for x in entries) for e in entries)


def test_two_proxies_never_send_a_replica_more_than_its_limit(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0, concurrency_limit=LIMIT)
    replica_url = f"http://127.0.0.1:{port}"
    bases = [spawn_proxy(procs), spawn_proxy(procs)]
    for base in bases:  # each process loads its state and joins the group on its first request
        assert post(base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=2)).status_code == 200
    wait_for(lambda: len(clean_redis.hgetall(MEMBERS_KEY)) == 2)
    # Both have heartbeated since the later one joined: each counts the other.
    wait_for(lambda: _settled(clean_redis.hgetall(MEMBERS_KEY).values()))

    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _requests_at_replica(replica_url))
            time.sleep(0.01)

    results: list[int] = []

    def fire(base, i):
        body = chat_body(endpoint.name, max_tokens=30, content=f"request {i} through {base}")
        results.append(post(base, tenant_a.raw_key, body, timeout=60).status_code)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=fire, args=(bases[i % 2], i)) for i in range(4 * LIMIT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    watcher.join(5)
    assert results == [200] * (4 * LIMIT)  # the excess waited in the proxies' queues, none was refused
    # Each process alone would have sent up to LIMIT: together they stay within it, and use all of it.
    assert peak[0] == LIMIT, peak[0]
