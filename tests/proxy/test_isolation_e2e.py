"""Tenant isolation at the replica, through the real proxy and simulated vLLM replicas: the prefix cache is salted
per tenant, the engine priority is the admitted class's, refused fields never reach the engine, /metrics needs
its token, and best-effort traffic has a per-tenant cap."""

import httpx
import pytest

from endpoints.health import PROBE_PRIORITY
from endpoints.models import Endpoint
from gateway.admission import ENGINE_PRIORITY
from simulator.tokens import filler_text
from tenants.models import CapacityReservation
from tenants.services import api_key_create
from tests.factories import EndpointFactory, TenantFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, assert_openai_error, chat_body, post, sse_events, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SYSTEM_PROMPT = filler_text(512, seed="tenant-a-secret-system-prompt")  # 32 full KV blocks


def received(port: int) -> list[dict]:
    """What the replica's engine was asked for (the simulator's /admin/received), oldest first."""
    return httpx.get(f"http://127.0.0.1:{port}/admin/received", timeout=5).json()["received"]


def cached_tokens(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def ask(base: str, key: str, model: str, question: str, **extra) -> httpx.Response:
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    return post(base, key, chat_body(model, max_tokens=2, stream=False, messages=messages, **extra))


def test_prefix_cache_is_salted_per_tenant(procs, clean_redis, tenant_a, tenant_b):
    shared = EndpointFactory(name="shared-model")  # no owner: every tenant may use it
    _, c = api_key_create(tenant=TenantFactory(slug="tenant-c"), name="c key", scopes=["inference"])
    _, _, port = spawn_replica(procs, endpoint=shared, name="r1")
    base = spawn_proxy(procs)
    a, b = tenant_a.raw_key, tenant_b.raw_key

    assert cached_tokens(ask(base, a, shared.name, "first question")) == 0  # cold
    assert cached_tokens(ask(base, a, shared.name, "second question")) >= 500  # tenant A hits its own cache
    # Tenant B probing with A's system prompt learns nothing: no block of A's is reachable under B's salt.
    assert cached_tokens(ask(base, b, shared.name, "probe")) == 0
    # Streamed, from a third tenant: the same.
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "probe"}]
    # vLLM 0.32 streams usage only when asked (stream_options.include_usage defaults to false).
    options = {"include_usage": True}
    streamed = post(base, c, chat_body(shared.name, max_tokens=2, messages=messages, stream_options=options))
    assert streamed.status_code == 200, streamed.text
    usage = [e for e in sse_events(streamed.text) if isinstance(e, dict) and e.get("usage")][-1]["usage"]
    assert usage["prompt_tokens"] >= 512 and not (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    # A salt the client sends is replaced: B naming A's salt (or any value) still gets B's own.
    seen = received(port)
    salt_a, salt_b = seen[0]["cache_salt"], seen[2]["cache_salt"]
    assert salt_a and salt_b and salt_a != salt_b and seen[1]["cache_salt"] == salt_a
    assert cached_tokens(ask(base, b, shared.name, "probe", cache_salt=salt_a)) >= 500  # B's own blocks now
    assert received(port)[-1]["cache_salt"] == salt_b
    assert cached_tokens(ask(base, a, shared.name, "third question", cache_salt="anything")) >= 500
    assert received(port)[-1]["cache_salt"] == salt_a
    # Completions too.
    completion = post(
        base, b, {"model": shared.name, "prompt": SYSTEM_PROMPT, "max_tokens": 2}, path="/v1/completions"
    )
    assert completion.status_code == 200 and received(port)[-1]["cache_salt"] == salt_b


def test_engine_priority_is_the_admitted_class(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    CapacityReservation.objects.filter(tenant=tenant_a.tenant, endpoint=endpoint).update(priority="standard")
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1")
    base = spawn_proxy(procs)
    key = tenant_a.raw_key
    assert min(ENGINE_PRIORITY.values()) > PROBE_PRIORITY  # health probes still outrank every class

    # A sheddable-at-best client claiming the front of the engine's queue gets its class's value instead.
    assert post(base, key, chat_body(endpoint.name, priority=-(2**62))).status_code == 200
    assert received(port)[-1]["priority"] == ENGINE_PRIORITY["standard"]
    lowered = post(
        base, key, chat_body(endpoint.name, stream=False, priority=-5), headers={"x-infercap-priority": "sheddable"}
    )
    assert lowered.status_code == 200
    assert received(port)[-1]["priority"] == ENGINE_PRIORITY["sheddable"]
    assert post(base, key, chat_body(endpoint.name, stream=False)).status_code == 200  # no priority sent: set anyway
    assert received(port)[-1]["priority"] == ENGINE_PRIORITY["standard"]


def test_fcfs_replicas_get_no_priority(procs, clean_redis, tenant_a, tenant_b):
    # Declared fcfs in the launch options: the field is removed before the first request.
    declared = tenant_a.endpoint
    Endpoint.objects.filter(pk=declared.pk).update(launch_options={"scheduling_policy": "fcfs"})
    _, _, port_a = spawn_replica(procs, endpoint=declared, name="fcfs-declared", extra=["--scheduling-policy", "fcfs"])
    # Hand-registered fcfs replica with default options: its 400 naming priority is learned, the request resent.
    hidden = tenant_b.endpoint
    _, _, port_b = spawn_replica(procs, endpoint=hidden, name="fcfs-hidden", extra=["--scheduling-policy", "fcfs"])
    base = spawn_proxy(procs)

    for stream in (True, False):
        assert post(base, tenant_a.raw_key, chat_body(declared.name, stream=stream, priority=3)).status_code == 200
        assert post(base, tenant_b.raw_key, chat_body(hidden.name, stream=stream, priority=3)).status_code == 200
    assert [r["priority"] for r in received(port_a)] == [0, 0]
    assert all("priority" not in r["fields"] for r in received(port_a))
    assert [r["priority"] for r in received(port_b)] == [0, 0]  # refused requests are not logged by the replica


def test_engine_internal_fields_are_refused_or_stripped(procs, clean_redis, tenant_a):
    endpoint = tenant_a.endpoint
    _, _, port = spawn_replica(procs, endpoint=endpoint, name="r1")
    base = spawn_proxy(procs)
    key = tenant_a.raw_key
    hostile = {
        "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "other", "remote_block_ids": [1, 2]},
        "vllm_xargs": {"x": 1},
        "logits_processors": ["os.system"],
        "stop": ["x"] * 100,
        "logit_bias": {str(i): 1 for i in range(5000)},
        "guided_regex": "(a|a)*" * 10_000,
        "n": 64,
    }
    for name, value in hostile.items():
        err = assert_openai_error(post(base, key, chat_body(endpoint.name, **{name: value})), 400)
        assert err["param"] == name
    assert received(port) == []  # none reached the engine
    assert post(base, key, chat_body(endpoint.name, request_id="victim-request-id")).status_code == 200
    (seen,) = received(port)
    assert seen["request_id"] != "victim-request-id" and "request_id" not in seen["fields"]


def test_metrics_need_the_token(procs, clean_redis, tenant_a):
    base = spawn_proxy(procs)
    assert post(base, tenant_a.raw_key, chat_body(tenant_a.endpoint.name)).status_code in (200, 503)
    assert httpx.get(base + "/metrics", timeout=5).status_code == 404
    assert httpx.get(base + "/metrics", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 404
    assert httpx.get(base + "/metrics", headers={"Authorization": "test-metrics-token"}, timeout=5).status_code == 404
    ok = httpx.get(base + "/metrics", headers=METRICS_AUTH, timeout=5)
    assert ok.status_code == 200 and "infercap_proxy_requests_total" in ok.text
    # No token configured (production without INFERCAP_METRICS_TOKEN): nobody scrapes the serving port.
    closed = spawn_proxy(procs, metrics_token="")
    assert httpx.get(closed + "/metrics", headers=METRICS_AUTH, timeout=5).status_code == 404


def test_best_effort_traffic_is_capped_per_tenant(procs, clean_redis, tenant_a, tenant_b):
    shared = EndpointFactory(name="shared-model")
    spawn_replica(procs, endpoint=shared, name="r1")
    # A tiny cap: a full bucket admits one request (it may go into debt), the next waits for the refill.
    base = spawn_proxy(procs, best_effort_mu_per_min=0.01)
    body = chat_body(shared.name, max_tokens=4, stream=False)
    assert post(base, tenant_a.raw_key, body).status_code == 200
    refused = post(base, tenant_a.raw_key, body)
    assert assert_openai_error(refused, 429)["code"] == "rate_limit_exceeded"
    assert "best_effort_mu" in refused.json()["error"]["message"] and refused.headers["retry-after"].isdigit()
    # Another tenant's best effort is its own bucket; a reservation is not capped by it.
    assert post(base, tenant_b.raw_key, body).status_code == 200
    CapacityReservation.objects.create(tenant=tenant_a.tenant, endpoint=shared, mu_per_min=10_000)
    wait_for(lambda: post(base, tenant_a.raw_key, body).status_code == 200, timeout=10)
