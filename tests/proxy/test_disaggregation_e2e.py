"""A disaggregated endpoint through real sockets: a proxy worker (uvicorn on ``config.asgi``) over the test database,
one simulated prefill replica and one simulated decode replica. What each replica is asked for, what the client
reads, how the request is metered (once, priced by phase), and what a short prompt, a client that leaves during
the prefill and a prefill replica that is gone do."""

import re
import threading
import time

import httpx
import pytest

from billing.models import UsageRecord
from capacity.models import CapacityBenchmark
from capacity.runtimes.vllm import kv_transfer_config
from endpoints.models import Replica
from gateway.proxy.snapshot_loader import read_snapshot
from tests.factories import HardwareProfileFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, assert_openai_error, chat_body, post, sse_events, wait_for, wait_usage
from tests.proxy.test_shared_slots_e2e import _held_on

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LONG = "tell me about the sea and the ships on it " * 24  # ~1,000 characters: ~250 tokens by the proxy's estimate
PREFILL = {"alpha": 0.004, "alpha_cached": 0.0004, "beta": 0.5, "gamma": 0.7, "mu_per_min": 600.0}


def received(port: int) -> list[dict]:
    """What the simulated engine was asked for (its /admin/received), oldest first."""
    return httpx.get(f"http://127.0.0.1:{port}/admin/received", timeout=5).json()["received"]


def engine_counter(port: int, name: str, label: str = "") -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    pattern = rf"^{re.escape(name)}(?:{{[^}}]*{re.escape(label)}[^}}]*}})? ([\d.e+]+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def proxy_counter(base: str, name: str, **labels) -> float:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH, timeout=10).text
    found = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            found += float(line.rsplit(" ", 1)[1])
    return found


def kv_config(role: str, directory, connector: str = "shared_storage") -> list[str]:
    """The launch flag the actuators give a replica of ``role`` (``vllm.kv_transfer_config``; docs/disaggregation.md)."""
    return ["--kv-transfer-config", kv_transfer_config(role, connector, storage_path=str(directory))]


def disaggregated(procs, tenant_a, kv_dir, *, ttft_slo_ms=2000):
    """Tenant A's endpoint split in two pools, each one simulated replica over one KV directory; the prefill pool on
    its own hardware profile with a benchmark of its own (its coefficients differ from the decode pool's profile
    defaults)."""
    endpoint = tenant_a.endpoint
    prefill_hw = HardwareProfileFactory(name="prefill-hw", memory_bandwidth_gbps=3350)
    CapacityBenchmark.objects.create(
        model_profile=endpoint.model_profile,
        hardware_profile=prefill_hw,
        version=1,
        status=CapacityBenchmark.Status.SUCCEEDED,
        **PREFILL,
    )
    endpoint.serving_mode, endpoint.kv_connector, endpoint.pd_min_uncached_tokens = (
        "disaggregated",
        "shared_storage",
        64,
    )
    endpoint.prefill_hardware_profile, endpoint.ttft_slo_ms = prefill_hw, ttft_slo_ms
    endpoint.save()
    producer, consumer = kv_config("prefill", kv_dir), kv_config("decode", kv_dir)
    prefill_proc, prefill, p_port = spawn_replica(procs, endpoint=endpoint, name="p0", speed=1.0, extra=producer)
    Replica.objects.filter(pk=prefill.pk).update(role="prefill", hardware_profile=prefill_hw)
    _, decode, d_port = spawn_replica(procs, endpoint=endpoint, name="d0", extra=consumer)
    Replica.objects.filter(pk=decode.pk).update(role="decode")
    return endpoint, (prefill_proc, prefill, p_port), (decode, d_port)


def test_the_prefill_replica_prefills_and_the_decode_replica_streams_metered_once_by_phase(
    procs, clean_redis, tenant_a, tmp_path
):
    endpoint, (_, prefill, p_port), (decode, d_port) = disaggregated(procs, tenant_a, tmp_path)
    base = spawn_proxy(procs)
    key = tenant_a.raw_key

    smuggled = post(base, key, chat_body(endpoint.name, content=LONG, kv_transfer_params={"do_remote_prefill": True}))
    assert assert_openai_error(smuggled, 400)["param"] == "kv_transfer_params", "tenants never steer the KV transfer"

    streamed = post(base, key, chat_body(endpoint.name, max_tokens=6, content=LONG, stream_options={"include_usage": True}))  # fmt: skip
    assert streamed.status_code == 200, streamed.text
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 6
    assert sum(1 for e in events[:-2] if e["choices"] and e["choices"][0]["delta"].get("content")) == 6
    [p_seen], [d_seen] = received(p_port), received(d_port)
    assert p_seen["cache_salt"] == d_seen["cache_salt"] and p_seen["priority"] == d_seen["priority"]
    assert "stream_options" not in p_seen["fields"] and "stream_options" in d_seen["fields"]
    assert engine_counter(p_port, "vllm:generation_tokens_total") == 1, "the prefill asks one token"
    assert engine_counter(d_port, "vllm:generation_tokens_total") == 6
    # The decode replica loaded the prompt the prefill replica stored, and says so as the engine does: as cached.
    loaded = events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert loaded > 0 and engine_counter(d_port, "vllm:external_prefix_cache_hits_total") == loaded

    [record] = wait_usage(1, tenant=tenant_a.tenant, status="ok")
    assert (record.pd_route, record.prefill_replica_id, record.replica_id) == ("split", prefill.pk, decode.pk)
    assert record.request_id == streamed.headers["x-request-id"] and record.output_tokens == 6
    decode_beta = read_snapshot().endpoints_by_name[endpoint.name].coeffs.beta
    uncached, cached = record.input_tokens - record.cached_tokens, record.cached_tokens
    prefill_mu = PREFILL["alpha"] * uncached + PREFILL["alpha_cached"] * cached + PREFILL["gamma"]
    assert record.cached_tokens == 0, "billed as the prefill replica computed it: the transfer is no cache hit"
    assert record.input_tokens > 64 and record.prefill_mu == pytest.approx(prefill_mu, rel=1e-4)
    assert record.mu == pytest.approx(prefill_mu + decode_beta * 6, rel=1e-4)

    short = post(base, key, chat_body(endpoint.name, max_tokens=3, content="hi", stream=False))
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 3
    assert len(received(p_port)) == 1 and len(received(d_port)) == 2, "a short prompt skips the prefill pool"
    records = wait_usage(2, tenant=tenant_a.tenant, status="ok")
    assert [(r.pd_route, r.prefill_replica_id) for r in records] == [("split", prefill.pk), ("decode_only", None)]
    assert proxy_counter(base, "infercap_proxy_pd_requests_total", endpoint=endpoint.name) == 2


def test_a_client_leaving_aborts_the_prefill_and_a_dead_prefill_replica_falls_back(
    procs, clean_redis, tenant_a, tmp_path
):
    endpoint, (prefill_proc, prefill, p_port), (decode, d_port) = disaggregated(
        procs, tenant_a, tmp_path, ttft_slo_ms=10_000
    )
    base = spawn_proxy(procs)
    key = tenant_a.raw_key
    # A slow prefill replica (each engine step 500 times longer): the client gives up while it prefills.
    httpx.post(f"http://127.0.0.1:{p_port}/admin/faults", json={"slow_factor": 500}, timeout=5).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        post(base, key, chat_body(endpoint.name, content=LONG), timeout=1.5)
    wait_for(lambda: engine_counter(p_port, "vllm:request_success_total", 'finished_reason="abort"') == 1, timeout=10)
    left = wait_for(lambda: UsageRecord.objects.filter(status="client_cancelled").first(), timeout=10)
    assert (left.pd_route, left.prefill_replica_id, left.output_tokens) == ("split", prefill.pk, 0)
    assert received(d_port) == [], "no decode was sent for it"

    prefill_proc.kill()
    prefill_proc.wait(timeout=10)
    # Another prompt: the decode router counts the first one as cached on the decode replica, where it was routed.
    answered = post(base, key, chat_body(endpoint.name, max_tokens=4, content=LONG.upper()))
    assert answered.status_code == 200 and sse_events(answered.text)[-1] == "[DONE]", answered.text
    [record] = wait_usage(1, tenant=tenant_a.tenant, status="ok")
    assert (record.pd_route, record.prefill_replica_id, record.replica_id) == ("fallback", prefill.pk, decode.pk)
    assert record.prefill_mu == 0.0 and record.output_tokens == 4
    assert (
        proxy_counter(base, "infercap_proxy_pd_prefill_fallbacks_total", endpoint=endpoint.name, reason="failed") == 1
    )


def test_nixl_the_decode_replica_pulls_what_the_prefill_replica_holds_for_it(procs, clean_redis, tenant_a, tmp_path):
    endpoint = tenant_a.endpoint
    endpoint.serving_mode, endpoint.kv_connector, endpoint.pd_min_uncached_tokens = "disaggregated", "nixl", 64
    endpoint.save()
    _, prefill, p_port = spawn_replica(
        procs, endpoint=endpoint, name="p0", extra=kv_config("prefill", tmp_path, "nixl")
    )
    _, decode, d_port = spawn_replica(procs, endpoint=endpoint, name="d0", extra=kv_config("decode", tmp_path, "nixl"))
    Replica.objects.filter(pk=prefill.pk).update(role="prefill")
    Replica.objects.filter(pk=decode.pk).update(role="decode")
    base = spawn_proxy(procs)

    answer = post(base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=5, content=LONG, stream=False))
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert usage["completion_tokens"] == 5 and answer.json().get("kv_transfer_params") is None, "no peer named"
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0, "the decode replica pulled the prompt's blocks"
    assert (
        engine_counter(d_port, "vllm:external_prefix_cache_hits_total")
        == usage["prompt_tokens_details"]["cached_tokens"]
    )
    [p_seen], [d_seen] = received(p_port), received(d_port)
    assert "kv_transfer_params" in p_seen["fields"] and "kv_transfer_params" in d_seen["fields"]
    [record] = wait_usage(1, tenant=tenant_a.tenant)
    assert (record.status, record.pd_route, record.prefill_replica_id) == ("ok", "split", prefill.pk)


def test_two_proxy_processes_never_send_a_prefill_replica_more_than_its_limit(procs, clean_redis, tenant_a, tmp_path):
    endpoint = tenant_a.endpoint
    endpoint.serving_mode, endpoint.pd_min_uncached_tokens, endpoint.ttft_slo_ms = "disaggregated", 64, 10_000
    endpoint.save()
    producer, consumer = kv_config("prefill", tmp_path), kv_config("decode", tmp_path)
    _, prefill, p_port = spawn_replica(
        procs, endpoint=endpoint, name="p0", speed=1.0, concurrency_limit=2, extra=producer
    )
    spawn_replica(procs, endpoint=endpoint, name="d0", concurrency_limit=16, extra=consumer)
    Replica.objects.filter(pk=prefill.pk).update(role="prefill")
    Replica.objects.exclude(pk=prefill.pk).filter(endpoint=endpoint).update(role="decode")
    bases = [spawn_proxy(procs), spawn_proxy(procs)]
    for base in bases:  # each process joins the group on its first request (short: no prefill)
        assert post(base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=2, content="hi")).status_code == 200
    rid = str(prefill.pk)
    wait_for(lambda: sorted(_held_on(clean_redis, rid)) == [1, 1], timeout=10)
    httpx.post(f"http://127.0.0.1:{p_port}/admin/faults", json={"slow_factor": 50}, timeout=5).raise_for_status()

    peak, results, stop = [0], [], threading.Event()

    def watch():
        while not stop.is_set():
            running = engine_counter(p_port, "vllm:num_requests_running")
            peak[0] = max(peak[0], int(running + engine_counter(p_port, "vllm:num_requests_waiting")))
            time.sleep(0.01)

    def fire(i):
        body = chat_body(endpoint.name, max_tokens=2, content=f"question {i}: " + LONG)
        results.append(post(bases[i % 2], tenant_a.raw_key, body, timeout=60).status_code)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=fire, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    watcher.join(5)
    assert results == [200] * 8, "past the prefill replica's limit the decode replica prefills: no client error"
    assert peak[0] == 2, peak[0]  # each process alone would send it 2: together they stay within its limit
    records = wait_usage(10, tenant=tenant_a.tenant, status="ok")
    routes = sorted(r.pd_route for r in records if r.pd_route != "decode_only")
    assert len(routes) == 8 and 1 <= routes.count("split") <= 8
    fallbacks = sum(
        proxy_counter(base, "infercap_proxy_pd_prefill_fallbacks_total", reason="no_prefill_slot") for base in bases
    )
    assert fallbacks == routes.count("fallback")
