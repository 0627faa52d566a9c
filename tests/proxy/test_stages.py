"""The request path's stages one at a time, against in-memory snapshots (no sockets, no database): who is let in,
which endpoint a request reaches, what it is charged, what the router sees, how admission refuses, how a failed
replica is left for another."""

import json

import pytest

from gateway.proxy.config import ProxyConfig
from gateway.proxy.errors import ProxyError
from gateway.proxy.flight import Price
from gateway.proxy.limits import Bucket, LimiterUnavailable, RateLimiter
from gateway.proxy.request import parse_request, request_cost
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.stages import (
    admit,
    authenticate,
    charge_limits,
    move_to_another_replica,
    price_request,
    resolve_endpoint,
    routing_request,
)
from tests.proxy.snapshots import COEFFS, RAW_KEY_A, TENANT_A, TENANT_B, bearer, endpoint, key, reservation, snapshot

NOW = 1_000_000.0


def refusal(call, *args, **kwargs) -> ProxyError:
    with pytest.raises(ProxyError) as caught:
        call(*args, **kwargs)
    return caught.value


def chat(model="chat-7b", **fields):
    return parse_request(
        "chat", json.dumps({"model": model, "messages": [{"role": "user", "content": "x" * 40}], **fields}).encode()
    )


# -- authenticate ------------------------------------------------------------------------------------------------
def test_authenticate_finds_the_key_by_its_hash_and_checks_the_scope():
    snap = snapshot()
    assert authenticate(snap, bearer(), now=NOW, scope="inference") == snap.keys_by_hash[next(iter(snap.keys_by_hash))]
    assert authenticate(snap, {b"authorization": f"bearer  {RAW_KEY_A} ".encode()}, now=NOW).tenant_id == TENANT_A
    err = refusal(authenticate, snapshot(keys={RAW_KEY_A: key(scopes=("api",))}), bearer(), now=NOW, scope="inference")
    assert (err.status, err.code, err.type) == (403, "insufficient_scope", "permission_error")
    # Listing models needs no particular scope.
    assert authenticate(snapshot(keys={RAW_KEY_A: key(scopes=("api",))}), bearer(), now=NOW).id == 11


def test_unknown_and_expired_keys_get_the_same_answer_and_malformed_headers_their_own():
    unknown = refusal(authenticate, snapshot(), bearer("ic-nobody"), now=NOW)
    expired = refusal(authenticate, snapshot(keys={RAW_KEY_A: key(expires_at=NOW)}), bearer(), now=NOW)
    assert (unknown.status, unknown.code, unknown.message) == (expired.status, expired.code, expired.message)
    assert unknown.status == 401 and unknown.code == "invalid_api_key"
    # Expiry is read from the clock it is given: a second earlier the same key was good.
    assert authenticate(snapshot(keys={RAW_KEY_A: key(expires_at=NOW)}), bearer(), now=NOW - 1).id == 11
    assert refusal(authenticate, snapshot(), {}, now=NOW).code == "missing_api_key"
    for header in (b"Basic abc", b"Bearer ", b"Bearer"):
        err = refusal(authenticate, snapshot(), {b"authorization": header}, now=NOW)
        assert (err.status, err.code) == (401, "invalid_api_key") and "Malformed" in err.message


# -- parse: the endpoint ---------------------------------------------------------------------------------------
def test_another_tenants_private_endpoint_is_as_missing_as_an_unknown_one():
    private_b = endpoint(name="b-private", owner=TENANT_B)
    snap = snapshot(endpoints=[endpoint(), private_b, endpoint(id=8, name="a-private", owner=TENANT_A)])
    assert resolve_endpoint(snap, key(), chat("chat-7b")).id == 7
    assert resolve_endpoint(snap, key(), chat("a-private")).id == 8
    hidden = refusal(resolve_endpoint, snap, key(), chat("b-private"))
    missing = refusal(resolve_endpoint, snap, key(), chat("no-such-model"))
    assert (hidden.status, hidden.code, hidden.param) == (missing.status, missing.code, missing.param)
    assert hidden.status == 404 and hidden.code == "model_not_found"
    assert hidden.message.replace("b-private", "?") == missing.message.replace("no-such-model", "?")


def test_max_tokens_over_the_context_is_refused_before_anything_is_charged():
    snap = snapshot(endpoints=[endpoint(max_model_len=1024)])
    assert resolve_endpoint(snap, key(), chat(max_tokens=1024)).max_model_len == 1024
    err = refusal(resolve_endpoint, snap, key(), chat(max_tokens=1025))
    assert (err.status, err.param, err.code) == (400, "max_tokens", "invalid_value")
    assert err.usage_status is None  # not metered


# -- price --------------------------------------------------------------------------------------------------------
def test_price_takes_the_reservations_class_capped_by_the_key_and_lowered_by_the_header():
    ep = endpoint()
    snap = snapshot(endpoints=[ep], reservations={(TENANT_A, ep.id): reservation(priority="critical", rpm=60)})
    req = chat(max_tokens=100)

    def price(k=None, requested=None, s=snap):
        return price_request(
            s, key=k or key(), endpoint=ep, req=req, requested=requested, best_effort_mu_per_min=1000.0
        )

    assert price().priority == "critical"
    assert price(k=key(max_priority="standard")).priority == "standard"
    assert price(requested="sheddable").priority == "sheddable"
    assert price(requested="critical", k=key(max_priority="standard")).priority == "standard"
    cost = request_cost(req, COEFFS, max_model_len=ep.max_model_len)
    mu, tokens = cost.charge_mu, cost.charge_tokens
    reserved = price()
    assert (reserved.mu, reserved.tokens) == (cost.mu, tokens) and reserved.mu > 0
    assert [(b.name, b.cost) for b in reserved.buckets] == [("mu", mu), ("rpm", 1.0)]
    # Without a reservation: best effort, sheddable, under the per-tenant best-effort cap.
    best_effort = price(s=snapshot(endpoints=[ep]))
    assert best_effort.priority == "sheddable"
    assert [(b.name, b.capacity, b.cost) for b in best_effort.buckets] == [("best_effort_mu", 1000.0, mu)]


# -- limit --------------------------------------------------------------------------------------------------------
class Limiter:
    def __init__(self, answer=(0.0, ""), error=None):
        self.answer, self.error, self.calls = answer, error, []

    async def acquire(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return self.answer


def priced(*buckets: Bucket) -> Price:
    return Price(priority="standard", mu=2.0, tokens=100, buckets=list(buckets))


async def test_limits_charge_all_buckets_or_refuse_with_the_wait_and_nothing_charged():
    mu = Bucket("mu", 10.0, 1.0, 2.0)
    assert await charge_limits(Limiter(), key=key(), endpoint=endpoint(), price=priced()) == []
    limiter = Limiter()
    assert await charge_limits(limiter, key=key(), endpoint=endpoint(), price=priced(mu)) == [mu]
    assert limiter.calls == [{"tenant_id": TENANT_A, "endpoint_id": 7, "buckets": [mu]}]
    with pytest.raises(ProxyError) as caught:
        await charge_limits(Limiter(answer=(2.2, "mu")), key=key(), endpoint=endpoint(), price=priced(mu))
    err = caught.value
    assert (err.status, err.code, err.retry_after, err.usage_status) == (429, "rate_limit_exceeded", 3, "rate_limited")
    assert "(mu)" in err.message
    with pytest.raises(ProxyError) as caught:
        await charge_limits(
            Limiter(error=LimiterUnavailable("down")), key=key(), endpoint=endpoint(), price=priced(mu)
        )
    assert (caught.value.status, caught.value.code, caught.value.retry_after) == (503, "limiter_unavailable", 1)


async def test_limits_through_the_real_limiter_refuse_once_the_bucket_is_spent():
    limiter = RateLimiter(None)  # in-process buckets, as without Redis
    rpm = Bucket("rpm", 2.0, 2 / 60, 1.0)
    for _ in range(2):
        assert await charge_limits(limiter, key=key(), endpoint=endpoint(), price=priced(rpm)) == [rpm]
    with pytest.raises(ProxyError) as caught:
        await charge_limits(limiter, key=key(), endpoint=endpoint(), price=priced(rpm))
    assert caught.value.status == 429 and 1 <= caught.value.retry_after <= 30


# -- admit and route ------------------------------------------------------------------------------------------------
def test_the_router_sees_sessions_and_prompts_per_tenant():
    req = chat(user="alice")
    a = routing_request("req-1", key=key(), req=req, headers={}, mu=1.5, cache_salt="salt-a")
    b = routing_request("req-2", key=key(tenant_id=TENANT_B), req=req, headers={}, mu=1.5, cache_salt="salt-b")
    assert (a.request_id, a.mu, a.extra["cache_salt"]) == ("req-1", 1.5, "salt-a")
    assert a.extra["max_tokens"] == req.max_tokens  # with the prompt's length, its size for the cost-aware router
    assert a.session_id == f"{TENANT_A}:alice" and b.session_id == f"{TENANT_B}:alice"
    assert a.prompt_text == b.prompt_text and "x" * 40 in a.prompt_text
    by_header = routing_request("r", key=key(), req=req, headers={b"x-session-id": b"s-9"}, mu=1, cache_salt="s")
    assert by_header.session_id == f"{TENANT_A}:s-9"
    assert routing_request("r", key=key(), req=chat(), headers={}, mu=1, cache_salt="s").session_id is None
    # Its size for the cost-aware router: 40 characters are ~10 tokens; a prompt of 3,000 token ids is 3,000 tokens
    # (its text is empty: by the text alone it would look like a one-token chat and go to the cheap replicas).
    assert a.extra["prompt_tokens"] == 10
    ids = parse_request("completion", json.dumps({"model": "m", "prompt": [7] * 3000, "max_tokens": 5}).encode())
    by_ids = routing_request("r", key=key(), req=ids, headers={}, mu=1, cache_salt="s")
    assert by_ids.prompt_text == "" and by_ids.extra["prompt_tokens"] == 3000


def runtime_for(ep, **config) -> EndpointRuntime:
    return EndpointRuntime(ep, config=ProxyConfig(**config))


async def test_admission_holds_a_routed_slot_or_refuses_with_retry_after():
    ep = endpoint(replicas=1, limit=1)
    runtime = runtime_for(ep, max_queue=1)
    price = Price(priority="sheddable", mu=1.0, tokens=10, buckets=[])
    route = routing_request("r1", key=key(), req=chat(), headers={}, mu=1.0, cache_salt="s")
    admission = await admit(runtime, route, key=key(), endpoint=ep, price=price)
    assert admission.slot.replica_id == 100 and admission.queue_s == 0.0 and admission.mu == 1.0
    assert runtime.in_flight == 1
    empty = endpoint(name="empty", replicas=0)
    with pytest.raises(ProxyError) as caught:
        await admit(runtime_for(empty), route, key=key(), endpoint=empty, price=price)
    err = caught.value
    assert (err.status, err.code, err.usage_status, err.type) == (503, "no_replica", "shed", "server_error")
    assert err.retry_after >= 1 and "`empty` has no ready replica" in err.message


async def test_a_failed_replica_is_left_for_one_other_and_its_slot_given_back():
    ep = endpoint(replicas=2, limit=1)
    runtime = runtime_for(ep)
    price = Price(priority="standard", mu=1.0, tokens=10, buckets=[])
    route = routing_request("r1", key=key(), req=chat(), headers={}, mu=1.0, cache_salt="s")
    admission = await admit(runtime, route, key=key(), endpoint=ep, price=price)
    first = admission.slot
    tried = {first.view.replica_id}
    assert move_to_another_replica(admission, tried, allowed=True)
    assert admission.slot is not first and first.view.in_flight == 0 and admission.slot.view.in_flight == 1
    # The second failure: no more retries; the slot goes back and the admission holds none.
    tried.add(admission.slot.view.replica_id)
    second = admission.slot
    assert not move_to_another_replica(admission, tried, allowed=False)
    assert admission.slot is None and second.view.in_flight == 0 and runtime.in_flight == 0
