"""Replica failures seen through the proxy: retry once before the first byte, error event mid-stream, TTFT and
stream-idle timeouts, each metered with the right status."""

import re

import httpx
import pytest

from billing.models import UsageRecord
from tests.factories import EndpointFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, assert_openai_error, chat_body, post, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_retry_midstream_error_and_timeouts(procs, clean_redis, tenant_a):
    retry_ep = EndpointFactory(name="retry-model", owner_tenant=tenant_a.tenant, routing_policy="round_robin")
    broken_ep = EndpointFactory(name="broken-model", owner_tenant=tenant_a.tenant)
    hang_ep = EndpointFactory(name="hang-model", owner_tenant=tenant_a.tenant)
    _, bad, _ = spawn_replica(procs, endpoint=retry_ep, name="bad", speed=20, extra=["--fault", "error_rate=1.0"])
    _, good, _ = spawn_replica(procs, endpoint=retry_ep, name="good", speed=20)
    spawn_replica(procs, endpoint=broken_ep, name="b1", speed=20, extra=["--fault", "fail_after_tokens=3"])
    _, _, hang_port = spawn_replica(procs, endpoint=hang_ep, name="h1", speed=1)
    base = spawn_proxy(procs, ttft_timeout_s=1.5, idle_timeout_s=1.0)
    key = tenant_a.raw_key

    # A replica answering 500 before any byte: every request is retried once on the other replica.
    for _ in range(4):
        r = post(base, key, chat_body("retry-model", max_tokens=3))
        assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]"
    retries = re.search(
        r'infercap_proxy_upstream_retries_total\{endpoint="retry-model"\} ([\d.]+)',
        httpx.get(base + "/metrics", headers=METRICS_AUTH).text,
    )
    assert retries and float(retries.group(1)) >= 1
    ok = wait_for(
        lambda: (
            UsageRecord.objects.filter(endpoint=retry_ep).count() == 4
            and UsageRecord.objects.filter(endpoint=retry_ep)
        )
    )
    assert {r.status for r in ok} == {"ok"} and {r.replica_id for r in ok} == {good.pk}

    # A replica failing mid-stream: the client's stream ends with an error event and [DONE]; nothing is retried.
    r = post(base, key, chat_body("broken-model", max_tokens=10))
    events = sse_events(r.text)
    assert r.status_code == 200 and events[-1] == "[DONE]" and "error" in events[-2]
    broken = wait_for(lambda: UsageRecord.objects.filter(endpoint=broken_ep).first())
    assert broken.status == "upstream_error" and broken.output_tokens == 3

    # A hung replica: no first token within the TTFT timeout → 504, metered as a timeout.
    httpx.post(f"http://127.0.0.1:{hang_port}/admin/faults", json={"hang": True})
    r = post(base, key, chat_body("hang-model", max_tokens=5), timeout=10)
    err = assert_openai_error(r, 504)
    assert err["code"] == "ttft" and err["type"] == "timeout"
    # A stream that stalls after its first tokens ends after the idle timeout with an error event.
    httpx.post(f"http://127.0.0.1:{hang_port}/admin/faults", json={"hang": False})
    with httpx.stream(
        "POST",
        base + "/v1/chat/completions",
        json=chat_body("hang-model", max_tokens=1500),
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    ) as stream:
        chunks = stream.iter_text()
        received = next(chunks)
        httpx.post(f"http://127.0.0.1:{hang_port}/admin/faults", json={"hang": True})
        received += "".join(chunks)  # returns once the proxy ends the stream
    assert '"type": "timeout"' in received.replace('"type":"timeout"', '"type": "timeout"')
    hung = wait_for(
        lambda: (
            UsageRecord.objects.filter(endpoint=hang_ep).count() == 2 and UsageRecord.objects.filter(endpoint=hang_ep)
        )
    )
    assert sorted(r.status for r in hung) == ["timeout", "timeout"]
    httpx.post(f"http://127.0.0.1:{hang_port}/admin/faults", json={"hang": False})
