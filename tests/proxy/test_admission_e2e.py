"""Admission through the real proxy: saturation, queue age, priority, fairness, eviction, disconnects, limits."""

import re
import threading
import time

import httpx
import pytest

from billing.models import UsageRecord
from tenants.models import CapacityReservation
from tenants.services import api_key_create
from tests.factories import EndpointFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, Held, assert_openai_error, chat_body, post, wait_for, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Fired:
    """A request sent on a thread; records its response and when it finished."""

    def __init__(self, base, key, body, headers=None):
        self.response = None
        self.finished = None
        self.thread = threading.Thread(target=self._run, args=(base, key, body, headers), daemon=True)
        self.thread.start()

    def _run(self, base, key, body, headers):
        self.response = post(base, key, body, headers=headers, timeout=60)
        self.finished = time.monotonic()

    def join(self):
        self.thread.join(60)
        assert self.response is not None
        return self.response


def queued(base: str, endpoint: str, n: int) -> bool:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    total = sum(
        float(v)
        for v in re.findall(
            rf'infercap_proxy_queue_depth\{{endpoint="{re.escape(endpoint)}",priority="\w+"\}} ([\d.]+)', text
        )
    )
    return total >= n


def retry_after(response) -> int:
    value = response.headers["retry-after"]
    assert value.isdigit() and 1 <= int(value) <= 60
    return int(value)


def test_saturation_queue_age_priority_and_eviction(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    CapacityReservation.objects.filter(tenant=tenant_a.tenant, endpoint=endpoint).update(
        priority="critical", mu_per_min=10_000
    )
    _, raw = api_key_create(tenant=tenant_a.tenant, name="critical key", max_priority="critical")
    spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0, concurrency_limit=1)
    base = spawn_proxy(procs, max_queue=2, max_age_standard_s=0.5, max_age_sheddable_s=20)
    name = endpoint.name
    shed = {"x-infercap-priority": "sheddable"}
    std = {"x-infercap-priority": "standard"}
    assert post(base, raw, chat_body(name, max_tokens=2)).status_code == 200  # warm-up

    # Wave 1: the slot is held; sheddable S then critical C queue; the queue (2) is full.
    hold = Held(base, raw, chat_body(name, max_tokens=1500))
    s1 = Fired(base, raw, chat_body(name, max_tokens=3, content="sheddable one"), shed)
    wait_for(lambda: queued(base, name, 1))
    c1 = Fired(base, raw, chat_body(name, max_tokens=3, content="critical one"))
    wait_for(lambda: queued(base, name, 2))
    # Saturated: a sheddable request is refused outright...
    full = post(base, raw, chat_body(name, max_tokens=3), headers=shed)
    assert assert_openai_error(full, 429)["code"] == "queue_full"
    retry_after(full)
    # ...and a critical one evicts the queued sheddable request to get in.
    c2 = Fired(base, raw, chat_body(name, max_tokens=3, content="critical two"))
    evicted = s1.join()
    assert assert_openai_error(evicted, 429)["code"] == "evicted"
    retry_after(evicted)
    hold.release()
    for f in (c1, c2):
        assert f.join().status_code == 200

    # Wave 2: priority ordering when both get served: the critical request queued last is served first.
    hold = Held(base, raw, chat_body(name, max_tokens=1500))
    s3 = Fired(base, raw, chat_body(name, max_tokens=3, content="sheddable three"), shed)
    wait_for(lambda: queued(base, name, 1))
    c3 = Fired(base, raw, chat_body(name, max_tokens=3, content="critical three"))
    wait_for(lambda: queued(base, name, 2))
    hold.release()
    for f in (s3, c3):
        assert f.join().status_code == 200
    assert c3.finished < s3.finished, "critical must be served before the sheddable request queued ahead of it"

    # Wave 3: a standard request older than its class's max queue age is answered 429 before dispatch.
    hold = Held(base, raw, chat_body(name, max_tokens=1500))
    started = time.monotonic()
    aged = post(base, raw, chat_body(name, max_tokens=3), headers=std)
    waited = time.monotonic() - started
    assert assert_openai_error(aged, 429)["code"] == "queue_age"
    assert 0.4 < waited < 5.0
    retry_after(aged)
    hold.release()

    records = wait_usage(11, tenant=tenant_a.tenant)
    statuses = sorted(r.status for r in records)
    assert statuses == ["client_cancelled"] * 3 + ["ok"] * 5 + ["shed"] * 3, statuses
    shed_records = [r for r in records if r.status == "shed"]
    assert all(r.output_tokens == 0 and r.replica_id is None for r in shed_records)


def _in_flight(base: str, endpoint: str) -> float:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    return sum(
        float(v)
        for v in re.findall(
            rf'infercap_proxy_in_flight\{{endpoint="{re.escape(endpoint)}",replica="[^"]+"\}} ([\d.]+)', text
        )
    )


def test_fairness_between_tenants_and_disconnect_frees_the_slot(procs, clean_redis, tenant_a, tenant_b):
    shared = EndpointFactory(name="shared-model", owner_tenant=None)
    for actors in (tenant_a, tenant_b):
        CapacityReservation.objects.create(tenant=actors.tenant, endpoint=shared, mu_per_min=10_000)
    _, replica, port = spawn_replica(procs, endpoint=shared, name="r1", speed=1.0, concurrency_limit=1)
    base = spawn_proxy(procs, max_queue=64, max_age_standard_s=60)
    assert post(base, tenant_a.raw_key, chat_body("shared-model", max_tokens=2)).status_code == 200

    # A long stream holds the only slot; tenant A queues six requests, then tenant B two.
    aborts_before = _aborts(port)
    with httpx.Client(timeout=60) as client:
        with client.stream(
            "POST",
            base + "/v1/chat/completions",
            json=chat_body("shared-model", max_tokens=1500),
            headers={"Authorization": f"Bearer {tenant_a.raw_key}"},
        ) as stream:
            assert stream.status_code == 200
            chunks = stream.iter_raw()  # keep a reference: a collected generator closes the response
            next(chunks)
            a_reqs, b_reqs = [], []
            for i in range(6):
                a_reqs.append(Fired(base, tenant_a.raw_key, chat_body("shared-model", max_tokens=4, content=f"a{i}")))
                wait_for(lambda i=i: queued(base, "shared-model", i + 1) or a_reqs[-1].response is not None)
                assert a_reqs[-1].response is None, a_reqs[-1].response.text
            for i in range(2):
                b_reqs.append(Fired(base, tenant_b.raw_key, chat_body("shared-model", max_tokens=4, content=f"b{i}")))
                wait_for(lambda i=i: queued(base, "shared-model", 7 + i))
            cut_at = time.monotonic()
    # Leaving the block closed the connection long before 1,500 tokens: the slot is freed at once...
    for f in [*a_reqs, *b_reqs]:
        assert f.join().status_code == 200
    assert min(f.finished for f in a_reqs + b_reqs) - cut_at < 2.0
    # ...and DRR served tenant B's requests between A's, not after all of them.
    order = sorted([(f.finished, "a") for f in a_reqs] + [(f.finished, "b") for f in b_reqs])
    first_four = [who for _, who in order[:4]]
    assert first_four.count("b") == 2, order
    # The replica saw the cancellation, and the cancelled request is metered as such.
    wait_for(lambda: _aborts(port) > aborts_before, timeout=5)
    cancelled = wait_for(lambda: UsageRecord.objects.filter(status="client_cancelled").first(), timeout=5)
    assert cancelled.tenant_id == tenant_a.tenant.pk and cancelled.output_tokens < 1500
    records = wait_usage(10, endpoint=shared)
    assert sorted(r.status for r in records) == ["client_cancelled"] + ["ok"] * 9


def _aborts(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return sum(
        float(v) for v in re.findall(r'vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} ([\d.]+)', text)
    )


def test_rate_limits_hold_across_two_proxy_processes(procs, clean_redis, tenant_a):
    CapacityReservation.objects.filter(tenant=tenant_a.tenant, endpoint=tenant_a.endpoint).update(rpm_limit=4)
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1", speed=20.0)
    proxies = [spawn_proxy(procs), spawn_proxy(procs)]
    body = chat_body(tenant_a.endpoint.name, max_tokens=2, stream=False)
    codes = []
    limited = None
    for i in range(8):
        r = post(proxies[i % 2], tenant_a.raw_key, body)
        codes.append(r.status_code)
        if r.status_code == 429:
            limited = r
    assert codes.count(200) == 4 and codes.count(429) == 4, codes
    err = assert_openai_error(limited, 429)
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
    assert 1 <= retry_after(limited) <= 60
    records = wait_usage(8, tenant=tenant_a.tenant)
    assert sorted(r.status for r in records) == ["ok"] * 4 + ["rate_limited"] * 4
