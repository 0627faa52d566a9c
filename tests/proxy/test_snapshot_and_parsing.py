"""The proxy's config snapshot (what the hot path may see) and request parsing (no processes needed)."""

import json
from dataclasses import replace

import pytest

from endpoints.models import ReplicaState
from gateway.proxy.config import ProxyConfig
from gateway.proxy.errors import ProxyError
from gateway.proxy.request import parse_request, upstream_payload
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot_loader import read_snapshot
from tenants.keys import hash_key
from tenants.services import api_key_create, api_key_revoke
from tests.factories import HardwareProfileFactory, ReplicaFactory


@pytest.mark.django_db
def test_snapshot_holds_only_usable_keys_and_ready_replicas(tenant_a, tenant_b, django_assert_max_num_queries):
    revoked, revoked_raw = api_key_create(tenant=tenant_a.tenant, name="revoked")
    api_key_revoke(api_key=revoked)
    tenant_b.tenant.is_active = False
    tenant_b.tenant.save()
    ready = ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY, concurrency_limit=8)
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.STARTING)
    ReplicaFactory(endpoint=tenant_a.endpoint, state=ReplicaState.READY, is_standby=True)
    with django_assert_max_num_queries(10):  # one more: the LoRA adapters; one more: the clock the keys are read at
        snap = read_snapshot("7")
    assert snap.version == "7"
    assert hash_key(tenant_a.raw_key) in snap.keys_by_hash
    assert hash_key(revoked_raw) not in snap.keys_by_hash
    assert hash_key(tenant_b.raw_key) not in snap.keys_by_hash, "keys of an inactive tenant do not authenticate"
    info = snap.endpoints_by_name[tenant_a.endpoint.name]
    assert [r.id for r in info.replicas] == [ready.pk] and info.replicas[0].concurrency_limit == 8
    assert info.visible_to(tenant_a.tenant.pk) and not info.visible_to(tenant_b.tenant.pk)
    assert info.coeffs.beta > 0
    res = snap.reservations[(tenant_a.tenant.pk, tenant_a.endpoint.pk)]
    assert res.mu_per_min == 100.0 and res.priority == "standard"


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", b"", None),
        ("chat", b"null", None),
        ("chat", b"[" * 100_000 + b"]" * 100_000, None),
        ("chat", json.dumps({"model": "m", "messages": []}).encode(), "messages"),
        (
            "chat",
            json.dumps({"model": "m", "messages": [{"role": "user", "content": 5}]}).encode(),
            "messages[0].content",
        ),
        (
            "chat",
            json.dumps({"model": "m", "messages": [{"role": "user"}], "max_tokens": True}).encode(),
            "max_tokens",
        ),
        (
            "chat",
            json.dumps({"model": "m", "messages": [{"role": "user"}], "max_completion_tokens": 0}).encode(),
            "max_completion_tokens",
        ),
        ("completions", json.dumps({"model": "m", "prompt": []}).encode(), "prompt"),
        ("completions", json.dumps({"model": "m", "prompt": [1, "a"]}).encode(), "prompt"),
        ("completions", json.dumps({"model": "", "prompt": "x"}).encode(), "model"),
        (
            "completions",
            json.dumps({"model": "m", "prompt": "x", "stream": True, "stream_options": []}).encode(),
            "stream_options",
        ),
    ],
)
def test_bad_requests_are_400_with_the_offending_param(kind, body, param):
    with pytest.raises(ProxyError) as exc:
        parse_request(kind, body)
    assert exc.value.status == 400 and exc.value.param == param
    assert set(json.loads(exc.value.body())["error"]) == {"message", "type", "param", "code"}


PROXY_SET = {"cache_salt": "tenant-salt", "priority": 1}


def upstream(req) -> dict:
    return json.loads(upstream_payload(req, cache_salt="tenant-salt", engine_priority=1))


def test_usage_is_always_requested_upstream_but_only_forwarded_when_asked():
    plain = parse_request(
        "chat", json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    )
    assert not plain.client_wants_usage
    assert upstream(plain)["stream_options"] == {"include_usage": True}
    asked = parse_request(
        "completions",
        json.dumps({"model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}).encode(),
    )
    assert asked.client_wants_usage and upstream(asked) == {**asked.body, **PROXY_SET}
    refused = parse_request(
        "completions",
        json.dumps(
            {
                "model": "m",
                "prompt": "hi",
                "stream": True,
                "stream_options": {"include_usage": False, "continuous_usage_stats": True},
            }
        ).encode(),
    )
    assert not refused.client_wants_usage
    assert upstream(refused)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    # An empty stream_options asks vLLM 0.32 for no usage: the client gets none, the engine is still asked for it.
    empty = parse_request(
        "completions", json.dumps({"model": "m", "prompt": "hi", "stream": True, "stream_options": {}}).encode()
    )
    assert not empty.client_wants_usage
    assert upstream(empty)["stream_options"] == {"include_usage": True}
    unary = parse_request("completions", json.dumps({"model": "m", "prompt": ["a", "b"]}).encode())
    assert unary.max_tokens == 16 and upstream(unary) == {**unary.body, **PROXY_SET} and unary.prompt_chars == 2


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "prompt": "a}", "stream": true, "n": 1}\n  ',
        '{"model":"m","prompt":"caf\u00e9 }","stream":true}'.encode(),
        json.dumps({"model": "m", "prompt": "x", "stream": True}).encode("utf-16"),
    ],
)
def test_usage_option_added_without_losing_or_corrupting_fields(raw):
    req = parse_request("completions", raw)
    assert upstream(req) == {**req.body, "stream_options": {"include_usage": True}, **PROXY_SET}


@pytest.mark.django_db
def test_a_replica_on_faster_hardware_than_its_endpoints_carries_its_speed_into_the_routers_view(
    tenant_a, django_assert_max_num_queries
):
    endpoint = tenant_a.endpoint  # on the factory's A100 profile: 2,039 GB/s, one GPU
    fast = HardwareProfileFactory(name="h100-80g", gpu_type="H100", memory_bandwidth_gbps=3350)
    own = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, concurrency_limit=8)
    faster = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, concurrency_limit=8, hardware_profile=fast)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, concurrency_limit=8, hardware_profile=fast)
    with django_assert_max_num_queries(12):  # two more than without a mixed fleet, whatever its size
        info = read_snapshot("8").endpoints_by_name[endpoint.name]
    speeds = {r.id: r.speed for r in info.replicas}
    assert speeds[own.pk] == 1.0 and speeds[faster.pk] == pytest.approx(3350 / 2039)
    runtime = EndpointRuntime(replace(info, routing_policy="infercap"), config=ProxyConfig())
    capacity = {slot.replica_id: slot.view.mu_capacity for slot in runtime.slots.values()}
    assert capacity[faster.pk] == pytest.approx(capacity[own.pk] * 3350 / 2039)
    assert capacity[own.pk] == pytest.approx(info.coeffs.mu_per_min / 60)
    runtime.update(
        replace(info, routing_policy="infercap", replicas=tuple(replace(r, speed=1.0) for r in info.replicas))
    )
    assert runtime.slots[str(faster.pk)].view.mu_capacity == pytest.approx(capacity[own.pk])  # a new snapshot's speed
