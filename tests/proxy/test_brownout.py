"""Graceful degradation on the request path, in process (``pipeline.completion`` over an in-memory snapshot and
scripted replicas): the fallback serves when the named endpoint has no ready replica, fails, or would shed the
request, and in no other case; the chain is guarded against loops, depth and other tenants' endpoints; the answer
is metered at the fallback's MU and marked; a degraded request is capped, charged less and marked; under overload
the slot share keeps slots free for critical work, and the requests served under it are marked."""

import asyncio
import dataclasses

from capacity.units import MUCoefficients, usage_mu
from gateway.proxy.brownout import capped_request, fallback_for
from gateway.proxy.config import ProxyConfig
from gateway.proxy.request import parse_request
from gateway.proxy.runtime import SLOT_SHARE_KEY, EndpointRuntime
from gateway.proxy.snapshot import ReplicaInfo
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import RAW_KEY_A, TENANT_A, TENANT_B, endpoint, key, reservation, snapshot
from tests.proxy.test_pipeline import Client, Session, Stalled, State, ok_stream, run
from tests.proxy.test_relay import DONE, TOKEN, Response
from tests.waiting import wait_for_async

SMALL = MUCoefficients(alpha=0.0005, alpha_cached=0.00005, beta=0.002, gamma=0.05, mu_per_min=60000.0)


def opted_in_key(**fields):
    return dataclasses.replace(key(**fields), accepts_fallback=True)


def fallback_endpoint(*, id=8, name="chat-1b", owner=None, replicas=1):
    base = endpoint(id=id, name=name, owner=owner, replicas=0)
    return dataclasses.replace(
        base,
        coeffs=SMALL,
        replicas=tuple(
            ReplicaInfo(id=200 + id * 10 + i, name=f"fb{i}", url=f"http://{name}-{i}", concurrency_limit=4)
            for i in range(replicas)
        ),
    )


def primary(*, replicas=1, limit=2, fallback="chat-1b", classes=("standard", "sheddable"), **fields):
    return endpoint(
        replicas=replicas, limit=limit, fallback_name=fallback, fallback_classes=frozenset(classes), **fields
    )


def world(*endpoints, accepts=True, max_priority="sheddable"):
    info = opted_in_key(max_priority=max_priority) if accepts else key(max_priority=max_priority)
    return snapshot(keys={RAW_KEY_A: info}, endpoints=list(endpoints))


def chat(model="chat-7b", **fields):
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": True, **fields}


def headers_of(client):
    return dict(client.sent[0]["headers"])


def fails():
    return Response(status=503)


def answers_from(*prefixes):
    return {f"http://{p}": ok_stream for p in prefixes}


async def test_no_ready_replica_falls_back_marked_and_metered_at_the_fallbacks_mu(monkeypatch):
    fb = fallback_endpoint()
    session = Session(answers_from("chat-1b-0"))
    state, client = State(world(primary(replicas=0), fb), session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and client.body_bytes() == TOKEN + DONE
    assert headers_of(client)[b"x-infercap-fallback-from"] == b"chat-7b"
    [(url, sent, _)] = session.posted
    assert url.startswith("http://chat-1b-0/") and sent["model"] == "chat-1b"  # the engine, and the answer, say so
    [record] = state.usage.records
    assert (record["endpoint_id"], record["requested_endpoint_id"], record["degradation"]) == (8, 7, "fallback")
    assert record["status"] == "ok" and record["replica_id"] == 280
    assert record["mu"] == round(usage_mu(SMALL, prompt_tokens=3, cached_tokens=0, completion_tokens=2), 6)
    assert state.runtimes[fb.id].in_flight == 0


async def test_a_failing_primary_falls_back_after_its_retry(monkeypatch):
    session = Session({"http://replica-0": fails, "http://replica-1": fails, **answers_from("chat-1b-0")})
    state, client = State(world(primary(replicas=2), fallback_endpoint()), session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and headers_of(client)[b"x-infercap-fallback-from"] == b"chat-7b"
    assert [u.split("/v1/")[0] for u, _, _ in session.posted][-1] == "http://chat-1b-0"
    assert len(session.posted) == 3  # both primary replicas (one retry), then the fallback
    assert state.usage.records[-1]["status"] == "ok" and state.runtimes[7].in_flight == 0


async def test_a_request_the_primary_would_shed_goes_to_the_fallback_at_once(monkeypatch):
    # One slot, held by a stalled stream; a 1 MU/s replica: a second request would wait past 3/4 of sheddable's
    # 2 s max age, so admission refuses it at arrival ("overloaded") and the fallback serves it
    slow = primary(replicas=1, limit=1)
    slow = dataclasses.replace(slow, coeffs=dataclasses.replace(slow.coeffs, mu_per_min=60.0))
    stalled = Response()
    stalled.content = Stalled([TOKEN])
    session = Session({"http://replica-0": lambda: stalled, **answers_from("chat-1b-0")})
    state = State(world(slow, fallback_endpoint()), session, ttft_timeout_s=30.0, idle_timeout_s=30.0)
    holder = Client(chat())
    holding = asyncio.create_task(run(state, holder, monkeypatch=monkeypatch))
    await asyncio.wait_for(_holding_its_slot(state), 5)
    client = Client(chat())
    await asyncio.wait_for(run(state, client, monkeypatch=monkeypatch), 5)
    assert client.status == 200 and headers_of(client)[b"x-infercap-fallback-from"] == b"chat-7b"
    assert headers_of(client)[b"x-infercap-degradation-level"] in (b"0", b"1", b"2", b"3")
    holder.left.set()
    await asyncio.wait_for(holding, 5)


async def _holding_its_slot(state):
    while state.runtimes.get(7) is None or state.runtimes[7].in_flight == 0:
        await asyncio.sleep(0.01)


async def test_no_fallback_without_the_tenants_opt_in_or_for_a_class_not_listed(monkeypatch):
    session = Session(answers_from("chat-1b-0"))
    refused = Client(chat())
    await run(
        State(world(primary(replicas=0), fallback_endpoint(), accepts=False), session),
        refused,
        monkeypatch=monkeypatch,
    )
    assert refused.status == 503 and refused.error()["code"] == "no_replica"
    not_listed = Client(chat())
    only_standard = primary(replicas=0, classes=("standard",))  # the key is sheddable
    state = State(world(only_standard, fallback_endpoint()), session)
    await run(state, not_listed, monkeypatch=monkeypatch)
    assert not_listed.status == 503 and session.posted == []
    [record] = state.usage.records
    assert (record["endpoint_id"], record["status"], record["degradation"]) == (7, "shed", "")


async def test_the_fallback_charges_the_tenants_limits_there(monkeypatch):
    # A reservation on the primary (its limits are far away); none on the fallback: best effort there, under a cap
    # of one request's worth. The first overflow is served (a full bucket admits one request however large); the
    # next one is refused by the fallback's own limit, not served past it, and the client gets the refusal of the
    # endpoint it named (``fall_back``: with no further fallback the first refusal stands).
    snap = dataclasses.replace(
        world(primary(replicas=0), fallback_endpoint()),
        reservations={(TENANT_A, 7): reservation(priority="sheddable", mu_per_min=60000.0)},
    )
    session = Session(answers_from("chat-1b-0"))
    state = State(snap, session, best_effort_mu_per_min=0.001)
    first, second = Client(chat()), Client(chat())
    await run(state, first, monkeypatch=monkeypatch)
    await run(state, second, monkeypatch=monkeypatch)
    assert first.status == 200 and headers_of(first)[b"x-infercap-fallback-from"] == b"chat-7b"
    assert second.status == 503 and second.error()["code"] == "no_replica"
    assert len(session.posted) == 1  # the refused one never reached the fallback's replica
    assert [(r["endpoint_id"], r["degradation"]) for r in state.usage.records] == [(8, "fallback"), (7, "")]
    # without the cap the same second request is served by the fallback: it was the fallback's limit that refused it
    served = State(snap, Session(answers_from("chat-1b-0")), best_effort_mu_per_min=60000.0)
    for client in (Client(chat()), Client(chat())):
        await run(served, client, monkeypatch=monkeypatch)
        assert client.status == 200


async def test_a_healthy_primary_serves_itself(monkeypatch):
    session = Session({"http://replica-0": ok_stream, **answers_from("chat-1b-0")})
    state, client = State(world(primary(replicas=1), fallback_endpoint()), session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and b"x-infercap-fallback-from" not in headers_of(client)
    assert headers_of(client)[b"x-infercap-degradation-level"] == b"0"
    assert [u.split("/v1/")[0] for u, _, _ in session.posted] == ["http://replica-0"]
    assert state.usage.records[0]["degradation"] == ""


async def test_another_tenants_endpoint_is_never_reached_as_a_fallback(monkeypatch):
    theirs = fallback_endpoint(owner=TENANT_B)
    session = Session(answers_from("chat-1b-0"))
    state, client = State(world(primary(replicas=0), theirs), session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 503 and client.error()["code"] == "no_replica" and session.posted == []
    assert b"chat-1b" not in client.body_bytes()
    assert fallback_for(state.snapshot, opted_in_key(), primary(), "sheddable", {7}) is None
    assert fallback_for(state.snapshot, opted_in_key(tenant_id=TENANT_B), primary(), "sheddable", {7}) is theirs


async def test_a_loop_or_a_long_chain_stops_at_the_bound(monkeypatch):
    # Written past the service's checks (it refuses both): the proxy still stops
    a = primary(replicas=0, fallback="b")
    b = primary(id=20, name="b", replicas=0, fallback="chat-7b")
    session = Session({})
    state, client = State(world(a, b), session), Client(chat())
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 503 and client.error()["message"].startswith("`chat-7b`")  # the named endpoint's refusal
    assert state.usage.records[0]["endpoint_id"] == 7
    chain = [
        primary(replicas=0, fallback="c1"),
        primary(id=21, name="c1", replicas=0, fallback="c2"),
        primary(id=22, name="c2", replicas=0, fallback="c3"),
        fallback_endpoint(id=23, name="c3"),
    ]
    session = Session(answers_from("c3-0"))
    deep = Client(chat())
    await run(State(world(*chain), session), deep, monkeypatch=monkeypatch)
    assert deep.status == 503 and session.posted == []  # c3 is three steps away; at most two are taken


async def test_a_degraded_request_is_capped_charged_less_and_marked(monkeypatch):
    session = Session({"http://replica-0": ok_stream})
    ep = primary(replicas=1, fallback=None, degrade_max_tokens=8)
    state = State(world(ep), session)
    runtime = state.runtime_for(ep)
    monkeypatch.setattr(runtime.admission, "level", lambda **_: 2)  # overloaded: standard and sheddable degrade
    charged = []
    monkeypatch.setattr(runtime, "acquire", _spy(runtime.acquire, charged))
    client = Client(chat(max_tokens=200))
    await run(state, client, monkeypatch=monkeypatch)
    headers = headers_of(client)
    assert client.status == 200 and headers[b"x-infercap-degraded"] == b"max_tokens=8"
    assert headers[b"x-infercap-degradation-level"] == b"2"
    [(_, sent, _)] = session.posted
    assert sent["max_tokens"] == 8
    [mu] = charged
    asked = runtime.admission.pain.tenants[str(TENANT_A)].offered_mu
    assert mu < asked / 10  # admitted at the capped cost; fair pain counts what was asked for
    assert state.usage.records[0]["degradation"] == "degraded"
    # at level 0 nothing is degraded
    monkeypatch.setattr(runtime.admission, "level", lambda **_: 0)
    plain = Client(chat(max_tokens=200))
    await run(state, plain, monkeypatch=monkeypatch)
    assert b"x-infercap-degraded" not in headers_of(plain) and session.posted[-1][1]["max_tokens"] == 200


def _spy(acquire, seen):
    async def spying(route, **kw):
        seen.append(kw["mu"])
        return await acquire(route, **kw)

    return spying


def test_capping_keeps_a_smaller_max_tokens_and_rewrites_both_spellings():
    req = parse_request("chat", b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":99}')
    capped = capped_request(req, 10)
    assert (capped.max_tokens, capped.body["max_tokens"], capped.body["max_completion_tokens"]) == (10, 10, 10)
    assert capped.controlled and req.body.get("max_tokens") is None  # the original is left alone


def share_runtime(monkeypatch, level):
    rt = EndpointRuntime(
        primary(replicas=1, limit=4, fallback=None, degrade_slot_share=0.5), config=ProxyConfig(), clock=lambda: 0.0
    )
    monkeypatch.setattr(rt.admission, "level", lambda **_: level)
    return rt


async def take(rt, priority, name):
    route = RouteRequest(request_id=name, prompt_text="hi")
    slot, _ = await rt.acquire(route, tenant=priority, priority=priority, mu=0.1)
    return slot, route


async def test_under_overload_a_half_slot_share_keeps_half_the_slots_for_critical(monkeypatch):
    rt = share_runtime(monkeypatch, level=1)
    first = [await take(rt, "sheddable", f"s{i}") for i in range(2)]
    assert all(route.extra[SLOT_SHARE_KEY] == 0.5 for _, route in first)  # taken under the share: degraded
    third = asyncio.create_task(take(rt, "sheddable", "s2"))
    await wait_for_async(lambda: len(rt.queue) == 1)  # the other two slots are not for it
    # they are critical's, at once: it queues ahead of the held-back request and is handed a free slot (not after
    # the 2 s expiry timer would next pump the queue)
    critical = [await asyncio.wait_for(take(rt, "critical", f"c{i}"), 1) for i in range(2)]
    assert rt.in_flight == 4 and all(SLOT_SHARE_KEY not in route.extra for _, route in critical)
    rt.release(*critical[0], 0.1, 0.1)
    assert len(rt.queue) == 1  # a freed slot outside the share stays free for critical (the pump ran at release)
    rt.release(*first[0], 0.1, 0.1)
    slot, route = await asyncio.wait_for(third, 2)  # one inside it goes to the waiting sheddable request
    assert route.extra[SLOT_SHARE_KEY] == 0.5 and rt.in_flight == 3


async def test_without_overload_the_slot_share_holds_nobody_back(monkeypatch):
    rt = share_runtime(monkeypatch, level=0)
    taken = [await take(rt, "sheddable", f"s{i}") for i in range(4)]
    assert rt.in_flight == 4 and all(SLOT_SHARE_KEY not in route.extra for _, route in taken)


async def test_a_request_served_under_the_slot_share_says_so(monkeypatch):
    session = Session({"http://replica-0": ok_stream})
    ep = primary(replicas=1, fallback=None, degrade_slot_share=0.5)
    state = State(world(ep), session)
    monkeypatch.setattr(state.runtime_for(ep).admission, "level", lambda **_: 1)
    client = Client(chat(max_tokens=20))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and headers_of(client)[b"x-infercap-degraded"] == b"slot_share=0.5"
    assert session.posted[0][1]["max_tokens"] == 20  # not capped: only its share of the slots was
    assert state.usage.records[0]["degradation"] == "degraded"
