"""Per-key controls and dollar budgets through two real proxy processes sharing Redis (docs/security.md, "Per-key
controls" and "Budgets"): a key's RPM limit holds across both processes and endpoints, on top of its tenant's
reservation; its allowlist refuses other models; a spent key or tenant budget refuses on both proxies with 429
budget_exceeded, and every refusal is OpenAI-shaped."""

import time

import pytest

from billing.models import UsageRecord
from endpoints.models import Endpoint
from tenants.models import ApiKey, Tenant
from tenants.services import api_key_create
from tests.factories import EndpointFactory, ReservationFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import assert_openai_error, chat_body, post, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _key(tenant, **controls):
    key, raw = api_key_create(tenant=tenant, name="controlled", scopes=["inference"])
    ApiKey.objects.filter(pk=key.pk).update(**controls)
    return key, raw


def _serving(procs, tenant_a):
    endpoint = tenant_a.endpoint
    spawn_replica(procs, endpoint=endpoint, name="r1")
    other = EndpointFactory(name="a-second-model", owner_tenant=tenant_a.tenant)
    ReservationFactory(tenant=tenant_a.tenant, endpoint=other)
    spawn_replica(procs, endpoint=other, name="r2")
    return endpoint, other, [spawn_proxy(procs), spawn_proxy(procs)]


def _ok_on(base, raw, model) -> bool:
    return post(base, raw, chat_body(model, max_tokens=2)).status_code == 200


def _refused_on(base, raw, model):
    """The answer when it is a 429, else None (for ``wait_for``)."""
    answer = post(base, raw, chat_body(model, max_tokens=2))
    return answer if answer.status_code == 429 else None


def test_a_keys_rpm_limit_holds_across_proxies_and_endpoints(procs, clean_redis, tenant_a):
    endpoint, other, bases = _serving(procs, tenant_a)
    _, raw = _key(tenant_a.tenant, rpm_limit=3)
    wait_for(lambda: _ok_on(bases[0], raw, endpoint.name), timeout=30, message="the key in the snapshot")
    answers = [
        post(bases[1], raw, chat_body(other.name, max_tokens=2)),
        post(bases[0], raw, chat_body(endpoint.name, max_tokens=2)),
        post(bases[1], raw, chat_body(other.name, max_tokens=2)),
    ]
    assert [a.status_code for a in answers[:2]] == [200, 200]
    refused = assert_openai_error(answers[2], 429)
    assert refused["code"] == "rate_limit_exceeded" and "this API key (key rpm)" in refused["message"]
    assert int(answers[2].headers["retry-after"]) >= 1
    # The tenant's own key has no such limit: the tenant's reservation alone applies to it.
    assert _ok_on(bases[1], tenant_a.raw_key, other.name)


def test_a_keys_allowlist_refuses_other_models(procs, clean_redis, tenant_a):
    endpoint, other, bases = _serving(procs, tenant_a)
    _, raw = _key(tenant_a.tenant, allowed_models=[other.name])
    wait_for(lambda: _ok_on(bases[0], raw, other.name), timeout=30, message="the key in the snapshot")
    refused = assert_openai_error(post(bases[1], raw, chat_body(endpoint.name, max_tokens=2)), 403)
    assert refused["code"] == "model_not_allowed" and refused["param"] == "model"
    # Another tenant's model stays a 404, allowlisted name or not.
    assert_openai_error(post(bases[1], raw, chat_body("b-model", max_tokens=2)), 404)


def test_a_spent_key_budget_refuses_on_every_proxy_until_raised(procs, clean_redis, tenant_a):
    endpoint, _, bases = _serving(procs, tenant_a)
    key, raw = _key(tenant_a.tenant, budget_usd=1e-9, budget_period="day")
    wait_for(lambda: _ok_on(bases[0], raw, endpoint.name), timeout=30, message="the key in the snapshot")
    spent = wait_for(lambda: clean_redis.keys("infercap:spend:key:*") or None, message="the spend counter")
    assert len(spent) == 1 and str(key.pk) in spent[0].decode()

    for base in bases:  # each process reads the shared counter within a second or two
        answer = wait_for(lambda b=base: _refused_on(b, raw, endpoint.name), timeout=15, message="the refusal")
        body = assert_openai_error(answer, 429)
        assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
        assert 1 <= int(answer.headers["retry-after"]) <= 86400
    wait_for(
        lambda: UsageRecord.objects.filter(api_key=key, status="rate_limited").exists(),
        message="the refusal's usage record",
    )
    ApiKey.objects.filter(pk=key.pk).update(budget_usd=1000.0)
    Endpoint.objects.get(pk=endpoint.pk).save()  # any change republishes the snapshot; the key's is one
    wait_for(lambda: _ok_on(bases[1], raw, endpoint.name), timeout=30, message="requests after the raise")


def test_a_tenants_hard_stop_budget_stops_all_its_keys(procs, clean_redis, tenant_a, tenant_b):
    endpoint, _, bases = _serving(procs, tenant_a)
    Tenant.objects.filter(pk=tenant_a.tenant.pk).update(budget_usd=1e-9, budget_hard_stop=True)
    _, raw = _key(tenant_a.tenant)
    deadline = time.time() + 30
    while time.time() < deadline and not clean_redis.keys("infercap:spend:tenant:*"):
        post(bases[0], tenant_a.raw_key, chat_body(endpoint.name, max_tokens=2))
        time.sleep(0.2)
    for who in (tenant_a.raw_key, raw):
        answer = wait_for(
            lambda k=who: _refused_on(bases[1], k, endpoint.name), timeout=15, message="the tenant budget refusal"
        )
        assert assert_openai_error(answer, 429)["code"] == "budget_exceeded"
    # Another tenant is untouched.
    spawn_replica(procs, endpoint=tenant_b.endpoint, name="rb")
    wait_for(lambda: _ok_on(bases[1], tenant_b.raw_key, tenant_b.endpoint.name), timeout=30, message="tenant B")
