"""The proxy's disaggregated path over simulated replicas that move the KV as vLLM's connectors do (simulator/
kv_transfer.py): with the shared-storage connector the decode replica loads what the prefill replica stored; with
NIXL the proxy asks the prefill for ``do_remote_decode`` and hands its ``kv_transfer_params`` to the decode replica,
which pulls the blocks from the prefill replica once. Either way the request is metered once, its prompt priced as
the prefill replica computed it (not as the decode replica's load reports it)."""

import json
import re

import httpx
import pytest

from endpoints.models import Replica
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import chat_body, post, sse_events, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LONG = "tell me about the sea and the ships on it " * 40  # ~420 simulated tokens


def counter(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([\d.e+]+)$", text, re.M))


def disaggregated(procs, tenant, connector: str, configs: dict[str, dict]):
    endpoint = tenant.endpoint
    endpoint.serving_mode, endpoint.kv_connector, endpoint.pd_min_uncached_tokens = "disaggregated", connector, 64
    endpoint.ttft_slo_ms = 10_000
    endpoint.save()
    ports = {}
    for role in ("prefill", "decode"):
        extra = ["--kv-transfer-config", json.dumps(configs[role])]
        _, replica, ports[role] = spawn_replica(procs, endpoint=endpoint, name=role, speed=5.0, extra=extra)
        Replica.objects.filter(pk=replica.pk).update(role=role)
    return endpoint, ports


def answered(response: httpx.Response, tokens: int) -> dict:
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == tokens
    return events[-2]["usage"]


def test_shared_storage_the_decode_replica_loads_what_the_prefill_replica_stored(
    procs, clean_redis, tenant_a, tmp_path
):
    extra = {"shared_storage_path": str(tmp_path)}
    configs = {
        "prefill": {"kv_connector": "ExampleConnector", "kv_role": "kv_producer", "kv_connector_extra_config": extra},
        "decode": {"kv_connector": "ExampleConnector", "kv_role": "kv_consumer", "kv_connector_extra_config": extra},
    }
    endpoint, ports = disaggregated(procs, tenant_a, "shared_storage", configs)
    base = spawn_proxy(procs)
    body = chat_body(endpoint.name, max_tokens=4, content=LONG, stream_options={"include_usage": True})
    answered(post(base, tenant_a.raw_key, body), 4)
    loaded = counter(ports["decode"], "vllm:external_prefix_cache_hits_total")
    assert loaded > 0 and len(list(tmp_path.iterdir())) == 1, "the prefill stored the prompt, the decode loaded it"
    assert counter(ports["prefill"], "vllm:external_prefix_cache_hits_total") == 0
    [record] = wait_usage(1, tenant=tenant_a.tenant, status="ok")
    assert record.pd_route == "split" and record.output_tokens == 4
    assert record.cached_tokens == 0, "the prompt was computed on the prefill replica: priced uncached"


def test_nixl_the_proxy_hands_the_prefills_kv_params_to_the_decode_replica(procs, clean_redis, tenant_a):
    nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    endpoint, ports = disaggregated(procs, tenant_a, "nixl", {"prefill": nixl, "decode": nixl})
    base = spawn_proxy(procs)
    for n in range(2):
        body = chat_body(endpoint.name, max_tokens=3, content=f"{n} {LONG}")
        answered(post(base, tenant_a.raw_key, body | {"stream_options": {"include_usage": True}}), 3)
    # each decode pulled its prefill's blocks from the prefill replica (a pull fails once they are taken)
    assert counter(ports["decode"], "vllm:external_prefix_cache_hits_total") > 0
    assert counter(ports["prefill"], "vllm:external_prefix_cache_hits_total") == 0
    records = wait_usage(2, tenant=tenant_a.tenant, status="ok")
    assert [r.pd_route for r in records] == ["split", "split"]
    assert all(r.cached_tokens == 0 for r in records)
