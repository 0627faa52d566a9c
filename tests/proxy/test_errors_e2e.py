"""Bad keys and bad input: OpenAI-shaped 4xx, never a 500 or a hang; a revocation reaches the proxy within a second."""

import json
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from billing.models import UsageRecord
from tenants.services import api_key_create, api_key_revoke
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import assert_openai_error, chat_body, post, wait_for, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_auth_failures_and_bad_input_are_clean_4xx(procs, clean_redis, tenant_a, tenant_b):
    spawn_replica(procs, endpoint=tenant_a.endpoint, name="r1")
    base = spawn_proxy(procs)
    model = tenant_a.endpoint.name
    good = chat_body(model, max_tokens=2, stream=False)
    assert post(base, tenant_a.raw_key, good).status_code == 200

    # 401: missing, malformed, unknown, expired, revoked (the revocation arrives through the snapshot).
    assert assert_openai_error(post(base, None, good), 401)["type"] == "authentication_error"
    r = httpx.post(base + "/v1/chat/completions", json=good, headers={"Authorization": "Basic abc"})
    assert_openai_error(r, 401)
    assert_openai_error(post(base, "ick_not-a-real-key-at-all-0000000000", good), 401)
    _, expired_raw = api_key_create(
        tenant=tenant_a.tenant, name="old", expires_at=timezone.now() - timedelta(seconds=1)
    )
    revoked_key, revoked_raw = api_key_create(tenant=tenant_a.tenant, name="soon revoked")
    wait_for(lambda: post(base, revoked_raw, good).status_code == 200, timeout=3)
    assert_openai_error(post(base, expired_raw, good), 401)
    api_key_revoke(api_key=revoked_key)
    revoked_at = time.monotonic()
    wait_for(lambda: post(base, revoked_raw, good).status_code == 401, timeout=3, interval=0.02)
    assert time.monotonic() - revoked_at < 1.0, "a revoked key must stop working within a second"

    # A key without the inference scope.
    _, read_only = api_key_create(tenant=tenant_a.tenant, name="reader", scopes=["read"])
    wait_for(lambda: post(base, read_only, good).status_code == 403, timeout=3)

    # Bad input: every case a 4xx in OpenAI's error shape.
    key = tenant_a.raw_key
    assert assert_openai_error(post(base, key, b"{not json"), 400)["type"] == "invalid_request_error"
    assert_openai_error(post(base, key, b"[1, 2]"), 400)
    assert (
        assert_openai_error(post(base, key, {"messages": [{"role": "user", "content": "x"}]}), 400)["param"] == "model"
    )
    assert assert_openai_error(post(base, key, {"model": model}), 400)["param"] == "messages"
    assert_openai_error(post(base, key, {"model": model, "messages": "hi"}), 400)
    assert_openai_error(post(base, key, {"model": model, "messages": [{"content": "no role"}]}), 400)
    assert assert_openai_error(post(base, key, {**good, "max_tokens": "12"}), 400)["param"] == "max_tokens"
    assert_openai_error(post(base, key, {**good, "max_tokens": -1}), 400)
    # More than the model's context: refused by the proxy, not dispatched (so not metered below).
    assert assert_openai_error(post(base, key, {**good, "max_tokens": 10**12}), 400)["param"] == "max_tokens"
    assert_openai_error(post(base, key, {**good, "stream": "yes"}), 400)
    assert_openai_error(post(base, key, {**good, "stream_options": {"include_usage": True}}), 400)
    assert_openai_error(post(base, key, {"model": model, "prompt": 42}, path="/v1/completions"), 400)
    assert_openai_error(post(base, key, {**good, "model": 7}), 400)
    assert_openai_error(post(base, key, good, headers={"x-infercap-priority": "urgent"}), 400)
    huge = json.dumps({**good, "messages": [{"role": "user", "content": "x" * (10 * 1024 * 1024)}]}).encode()
    assert assert_openai_error(post(base, key, huge), 413)["code"] == "body_too_large"
    err = assert_openai_error(post(base, key, {**good, "model": "no-such-model"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    # Another tenant's endpoint is indistinguishable from a missing one.
    assert_openai_error(post(base, key, {**good, "model": tenant_b.endpoint.name}), 404)
    assert_openai_error(httpx.get(base + "/v1/chat/completions"), 405)
    assert_openai_error(httpx.get(base + "/v1/nothing-here"), 404)
    # An OpenAI endpoint this proxy does not serve is told what it does serve, OpenAI-shaped.
    err = assert_openai_error(post(base, key, {"model": model, "input": "hi"}, path="/v1/responses"), 404)
    assert err["code"] == "not_found" and "POST /v1/chat/completions" in err["message"]
    assert_openai_error(httpx.get(base + "/v1/models"), 401)

    # Only authenticated, admitted requests are metered: 1 + the revoked key's successes, all served by the
    # replica (a request refused as invalid once its endpoint was known was once metered as "ok" too).
    assert len(wait_usage(2, status="ok")) >= 2
    assert not UsageRecord.objects.exclude(status="ok").exists()
    assert not UsageRecord.objects.filter(replica__isnull=True).exists()


def test_proxy_without_its_database_answers_503_not_500(procs, clean_redis, tenant_a):
    from tests.proxy.conftest import free_port

    base = spawn_proxy(procs, db_url=f"postgres://postgres@127.0.0.1:{free_port()}/nowhere")
    r = post(base, tenant_a.raw_key, chat_body(tenant_a.endpoint.name, max_tokens=2))
    err = assert_openai_error(r, 503)
    assert err["code"] == "proxy_unavailable" and r.headers["retry-after"] == "1"
