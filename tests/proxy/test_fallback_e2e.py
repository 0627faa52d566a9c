"""A fallback endpoint through real sockets: a proxy worker (uvicorn on ``config.asgi``) over the test database and
a simulated vLLM replica. The endpoint the client names has no ready replica, so its fallback answers: marked by a
header and the ``model`` field, metered once at the fallback, and only while the tenant accepts fallbacks."""

import json

import pytest

from endpoints.services import endpoint_update
from tenants.models import Tenant
from tests.factories import EndpointFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import assert_openai_error, chat_body, post, wait_for, wait_usage

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_fallback_answers_for_an_endpoint_without_replicas(procs, clean_redis, tenant_a):
    primary = tenant_a.endpoint  # no replica at all
    fallback = EndpointFactory(name="a-small", owner_tenant=tenant_a.tenant)
    endpoint_update(endpoint=primary, fallback=fallback, fallback_classes=["critical", "standard", "sheddable"])
    tenant_a.tenant.accepts_fallback = True
    tenant_a.tenant.save(update_fields=["accepts_fallback"])
    spawn_replica(procs, endpoint=fallback, name="small-1")
    base = spawn_proxy(procs)

    plain = post(base, tenant_a.raw_key, chat_body(primary.name, max_tokens=3, stream=False))
    assert plain.status_code == 200, plain.text
    assert plain.headers["x-infercap-fallback-from"] == primary.name
    assert plain.json()["model"] == "a-small"
    streamed = post(base, tenant_a.raw_key, chat_body(primary.name, max_tokens=3))
    assert streamed.status_code == 200 and streamed.headers["x-infercap-fallback-from"] == primary.name
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events and {e["model"] for e in events} == {"a-small"}

    records = wait_usage(2, tenant=tenant_a.tenant)
    assert {(r.endpoint_id, r.requested_endpoint_id, r.degradation, r.status) for r in records} == {
        (fallback.pk, primary.pk, "fallback", "ok")
    }
    assert [r.request_id for r in records] == [plain.headers["x-request-id"], streamed.headers["x-request-id"]]

    # Without the tenant's opt-in the named endpoint's own refusal comes back
    tenant = Tenant.objects.get(pk=tenant_a.tenant.pk)
    tenant.accepts_fallback = False
    tenant.save(update_fields=["accepts_fallback"])
    body = chat_body(primary.name, max_tokens=3, stream=False)
    wait_for(lambda: post(base, tenant_a.raw_key, body).status_code == 503, timeout=5)
    refused = post(base, tenant_a.raw_key, body)
    assert assert_openai_error(refused, 503)["code"] == "no_replica"
    assert "x-infercap-fallback-from" not in refused.headers and refused.headers["retry-after"]
