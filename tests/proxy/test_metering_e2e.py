"""What a tenant is metered for, through the real proxy in front of a simulated replica, when it tries not to be:
a stream left just before its usage chunk costs its prompt and every token sent, and the tenant's own reservation
pays for it, so repeating it runs into the reservation."""

import re
import time
import uuid

import httpx
import pytest

from billing.models import UsageRecord
from tenants.models import CapacityReservation
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import chat_body, post, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MAX_TOKENS = 400
# Tokens read before leaving: the usage chunk comes only after all 400, and the replica runs in real time (about
# 100 tokens a second), so a client that leaves here leaves well before it, however loaded the machine.
READ = 100


def engine_counter(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([\d.e+]+)$", text, re.M))


def stream_and_leave(base: str, key: str, body: dict, tokens: int) -> tuple[int, str, int]:
    """Stream ``body``, read ``tokens`` token chunks and close the connection: (status, request id, tokens read)."""
    read = 0
    with httpx.Client(timeout=60) as client:
        with client.stream(
            "POST", base + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            if response.status_code != 200:
                response.read()
                return response.status_code, response.headers.get("x-request-id", ""), 0
            for line in response.iter_lines():
                if line.startswith("data: {") and '"content"' in line and '"role"' not in line:
                    read += 1
                    if read >= tokens:
                        break
            return 200, response.headers["x-request-id"], read


def test_a_stream_left_before_its_usage_chunk_costs_its_prompt_and_every_token_sent(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    reservation = CapacityReservation.objects.get(tenant=tenant_a.tenant, endpoint=endpoint)
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0)
    base = spawn_proxy(procs)
    content = f"{uuid.uuid4().hex} tell me everything"  # unique: no cached prefix
    prompts_before = engine_counter(port, "vllm:prompt_tokens_total")
    status, request_id, read = stream_and_leave(
        base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=MAX_TOKENS, content=content), READ
    )
    assert status == 200 and read == READ
    row = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first(), timeout=10)
    wait_for(lambda: engine_counter(port, "vllm:num_requests_running") == 0, timeout=10)  # the abort arrived
    generated = engine_counter(port, "vllm:generation_tokens_total")  # the replica's own count
    assert row.status == "client_cancelled" and row.tenant_id == tenant_a.tenant.pk
    # The prompt as the replica counted it (its /tokenize; its own counter agrees), every token the client read.
    assert row.input_tokens == engine_counter(port, "vllm:prompt_tokens_total") - prompts_before > 0
    assert READ <= row.output_tokens <= generated
    # The same prompt answered in full with as many tokens costs the same MU: nothing is refunded below it.
    again = f"{uuid.uuid4().hex} tell me everything"
    full = post(
        base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=row.output_tokens, stream=False, content=again)
    )
    assert full.status_code == 200 and full.json()["usage"]["prompt_tokens"] == row.input_tokens
    full_row = wait_for(
        lambda: UsageRecord.objects.filter(request_id=full.headers["x-request-id"]).first(), timeout=10
    )
    assert row.mu == pytest.approx(full_row.mu) and row.mu > 0

    # Repeating it runs into the tenant's reservation: one and a half such streams per minute, refilled slowly.
    reservation.mu_per_min, reservation.burst_minutes = 1.5 * full_row.mu, 1.0
    reservation.save(update_fields=["mu_per_min", "burst_minutes"])
    time.sleep(1.0)  # the proxy's snapshot (polled every 0.1 s) carries the new reservation
    for bucket in clean_redis.scan_iter("infercap:rl:*"):
        clean_redis.delete(bucket)  # a full bucket at the new size

    def left_stream() -> int:
        body = chat_body(endpoint.name, max_tokens=MAX_TOKENS, content=f"{uuid.uuid4().hex} tell me everything")
        return stream_and_leave(base, tenant_a.raw_key, body, READ)[0]

    # The first is admitted (charged 400 tokens' worth, settled to the hundred or so it was sent); what is left of
    # the bucket is about half a full answer, less than the next one's charge, so the second is refused. Refunded to
    # nothing, the stream could be repeated forever.
    assert [left_stream(), left_stream()] == [200, 429]


def test_a_client_leaving_before_the_first_byte_is_metered_as_the_engine_counts(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1", speed=1.0)
    base = spawn_proxy(procs)
    replica = f"http://127.0.0.1:{port}"
    assert post(base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=2)).status_code == 200  # warm

    # A stream whose prompt takes seconds to prefill (every engine step 100 times slower): the client leaves during
    # the prefill. The request runs to its first token and is cancelled there: the prompt is metered as the engine
    # counted it, with what it generated by then.
    httpx.post(replica + "/admin/faults", json={"slow_factor": 100.0}, timeout=5).raise_for_status()
    before = {n: engine_counter(port, n) for n in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")}
    prompt = f"{uuid.uuid4().hex} " + "a long prompt to prefill " * 40
    body = chat_body(endpoint.name, max_tokens=300, content=prompt)
    with pytest.raises(httpx.ReadTimeout):  # no response head before the first token: the client gives up first
        post(base, tenant_a.raw_key, body, timeout=httpx.Timeout(0.3, connect=5))
    row = wait_for(lambda: UsageRecord.objects.filter(endpoint=endpoint, status="client_cancelled").first(), 30)
    httpx.post(replica + "/admin/faults", json={"slow_factor": 1.0}, timeout=5).raise_for_status()
    wait_for(lambda: engine_counter(port, "vllm:num_requests_running") == 0, timeout=10)
    prompted = engine_counter(port, "vllm:prompt_tokens_total") - before["vllm:prompt_tokens_total"]
    generated = engine_counter(port, "vllm:generation_tokens_total") - before["vllm:generation_tokens_total"]
    assert row.ttft_ms > 300  # the client had left during the prefill
    assert row.input_tokens == prompted > 100
    assert row.output_tokens <= generated < 300  # cancelled at its first token, not run to the end
    assert row.mu > 0

    # Not streaming, the first byte is the whole answer: the request runs to its end and is metered in full from the
    # replica's usage, as the engine counted it (OpenAI bills a non-streaming answer whose client left the same way).
    before = engine_counter(port, "vllm:generation_tokens_total")
    body = chat_body(endpoint.name, max_tokens=150, stream=False, content=f"{uuid.uuid4().hex} answer at length")
    sent_at = time.time()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 0.3 s and closes the connection
        post(base, tenant_a.raw_key, body, timeout=httpx.Timeout(0.3, connect=5))
    row = wait_for(
        lambda: UsageRecord.objects.filter(endpoint=endpoint, output_tokens=150, status="client_cancelled").last(),
        timeout=30,
    )
    assert row.started_at.timestamp() >= sent_at - 1
    assert engine_counter(port, "vllm:generation_tokens_total") - before == 150
