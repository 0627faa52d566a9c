"""Prefill/decode disaggregation on the whole request path in process (``pipeline.completion`` over an in-memory
snapshot and scripted replicas, as ``test_pipeline.py``): what the prefill and the decode replica are sent, what the
client reads, how the request is metered, and what happens when the prefill is skipped, fails, stalls or its client
leaves."""

import asyncio
import dataclasses
import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from capacity.runtimes.vllm_metrics import ReplicaMetrics
from capacity.units import MUCoefficients
from config import tracing
from gateway.admission.shares import Member
from gateway.proxy import metrics as m
from gateway.proxy.caps import lower_caps
from gateway.proxy.config import ProxyConfig
from gateway.proxy.disaggregation import (
    NIXL_PREFILL_PARAMS,
    decode_request,
    prefill_payload,
    prefill_route,
    prefill_timeout_s,
    split_mu,
    split_usage,
)
from gateway.proxy.prefill_pool import PrefillPool, prefill_pool
from gateway.proxy.request import parse_request
from gateway.proxy.resume import continuation, streamed
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import ReplicaInfo
from gateway.proxy.state import ProxyState
from gateway.routing.base import RouteRequest
from tests.proxy.snapshots import COEFFS, TENANT_A, bearer, endpoint, reservation, snapshot
from tests.proxy.test_pipeline import Client, Session, State, run, silent_after
from tests.proxy.test_relay import DONE, TOKEN, Response, event

PREFILL_COEFFS = MUCoefficients(alpha=0.002, alpha_cached=0.0002, beta=0.05, gamma=0.3, mu_per_min=6000.0)
LONG = "tell me about the sea " * 40  # 880 characters: ~220 tokens by the proxy's estimate
P0, P1, D0, D1 = "http://prefill-0", "http://prefill-1", "http://decode-0", "http://decode-1"
KV_PARAMS = {"remote_engine_id": "e1", "remote_block_ids": [1, 2], "remote_host": "10.0.0.5", "remote_port": 5600}


def pd_endpoint(*, prefills=1, decodes=1, connector="shared_storage", min_uncached=64, **fields):
    """A disaggregated endpoint: ``prefills`` prefill replicas (ids 200…) and ``decodes`` decode replicas (300…)."""
    replicas = [
        ReplicaInfo(id=200 + i, name=f"p{i}", url=f"http://prefill-{i}", concurrency_limit=4, role="prefill")
        for i in range(prefills)
    ] + [
        ReplicaInfo(id=300 + i, name=f"d{i}", url=f"http://decode-{i}", concurrency_limit=4, role="decode")
        for i in range(decodes)
    ]
    return dataclasses.replace(
        endpoint(replicas=0, **fields),
        replicas=tuple(replicas),
        serving_mode="disaggregated",
        kv_connector=connector,
        pd_min_uncached_tokens=min_uncached,
        prefill_coeffs=PREFILL_COEFFS,
    )


def world(ep):
    return snapshot(endpoints=[ep], reservations={(TENANT_A, ep.id): reservation(priority="standard")})


def prefill_answer(*, prompt=220, cached=64, params=None):
    body = {
        "id": "cmpl-p",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": cached}},
    }
    if params is not None:
        body["kv_transfer_params"] = params
    return lambda: Response(body=json.dumps(body).encode())


def decode_stream(*, prompt=220, cached=208, out=2):
    usage = {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
             "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    return lambda: Response(chunks=[TOKEN, event({"id": "c1", "choices": [], "usage": usage}) + DONE])


def chat(ep, content=LONG, **fields):
    return {"model": ep.name, "messages": [{"role": "user", "content": content}], "stream": True, "max_tokens": 2,
            "stream_options": {"include_usage": False}, **fields}  # fmt: skip


def count(metric, *labels):
    return m.child(metric, *labels)._value.get()


async def test_a_long_prompt_is_prefilled_on_the_prefill_pool_then_streamed_from_the_decode_replica(monkeypatch):
    ep = pd_endpoint()
    session = Session({P0: prefill_answer(), D0: decode_stream()})
    state, client = State(world(ep), session), Client(chat(ep, n=1, min_tokens=2, max_completion_tokens=2))
    before = count(m.PD_REQUESTS, ep.name, "split")
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and client.body_bytes() == TOKEN + DONE, "the client's stream is the decode's"
    [(p_url, prefill, p_headers), (d_url, decode, d_headers)] = session.posted
    assert p_url == P0 + "/v1/chat/completions" and d_url == D0 + "/v1/chat/completions"
    assert (prefill["max_tokens"], prefill["stream"]) == (1, False)
    assert not {"stream_options", "max_completion_tokens", "min_tokens", "n", "kv_transfer_params"} & set(prefill)
    assert prefill["messages"] == decode["messages"] and prefill["model"] == decode["model"] == ep.name
    salt = state.cache_salts.for_tenant(TENANT_A)
    assert prefill["cache_salt"] == decode["cache_salt"] == salt and prefill["priority"] == decode["priority"] == 1
    assert (decode["max_tokens"], decode["stream"], decode["max_completion_tokens"]) == (2, True, 2)
    assert "kv_transfer_params" not in decode, "shared storage: the decode finds the KV by the prompt"
    assert p_headers["x-request-id"] == d_headers["x-request-id"]
    [record] = state.usage.records
    assert (record["pd_route"], record["prefill_replica_id"], record["replica_id"]) == ("split", 200, 300)
    # Priced by phase: the prompt as the prefill replica computed it (64 of 220 cached there) at the prefill pool's
    # coefficients, the output at the decode pool's beta; the decode's 208 "cached" (transferred) tokens are not.
    prefill_mu = 0.002 * 156 + 0.0002 * 64 + 0.3
    assert record["prefill_mu"] == pytest.approx(prefill_mu)
    assert record["mu"] == pytest.approx(prefill_mu + COEFFS.beta * 2)
    assert (record["input_tokens"], record["cached_tokens"], record["output_tokens"]) == (220, 64, 2)
    assert count(m.PD_REQUESTS, ep.name, "split") == before + 1
    pool = state.runtimes[ep.id].prefill_pool
    assert [s.view.in_flight for s in pool.slots.values()] == [0] and state.runtimes[ep.id].in_flight == 0


async def test_nixl_hands_the_prefills_transfer_params_to_the_decode(monkeypatch):
    ep = pd_endpoint(connector="nixl")
    session = Session({P0: prefill_answer(params=KV_PARAMS), D0: decode_stream()})
    state, client = State(world(ep), session), Client(chat(ep))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200
    [(_, prefill, _), (_, decode, _)] = session.posted
    assert prefill["kv_transfer_params"] == NIXL_PREFILL_PARAMS and prefill["kv_transfer_params"]["do_remote_decode"]
    assert decode["kv_transfer_params"] == KV_PARAMS


async def test_the_admission_set_is_the_decode_pool_and_a_short_prompt_skips_the_prefill(monkeypatch):
    ep = pd_endpoint()
    session = Session({P0: prefill_answer(), D0: decode_stream(prompt=3, cached=0)})
    state, client = State(world(ep), session), Client(chat(ep, content="hi"))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and [url for url, _, _ in session.posted] == [D0 + "/v1/chat/completions"]
    assert list(state.runtimes[ep.id].slots) == ["300"], "prefill replicas take no admitted request"
    [record] = state.usage.records
    assert (record["pd_route"], record["prefill_replica_id"], record["prefill_mu"]) == ("decode_only", None, 0.0)
    assert record["mu"] == pytest.approx(COEFFS.alpha * 3 + COEFFS.beta * 2 + COEFFS.gamma), "the decode pool's price"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (lambda: Response(status=503), "failed"),
        (lambda: Response(status=200, body=b"<html>"), "failed"),
        (lambda: Stalled_read(), "timeout"),
    ],
)
async def test_a_failing_or_stalled_prefill_falls_back_to_the_decode_replica(monkeypatch, answer, reason):
    ep = pd_endpoint(name=f"pd-{reason}-{id(answer)}")
    session = Session({P0: answer, D0: decode_stream(cached=0)})
    state = State(world(ep), session, ttft_timeout_s=0.4)  # the prefill may take 0.2 s (half the first-token limit)
    client = Client(chat(ep))
    before = count(m.PD_PREFILL_FALLBACKS, ep.name, reason)
    await asyncio.wait_for(run(state, client, monkeypatch=monkeypatch), 5)
    assert client.status == 200 and client.body_bytes() == TOKEN + DONE, "no error reaches the client"
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == [P0, D0]
    [record] = state.usage.records
    assert (record["pd_route"], record["prefill_replica_id"], record["status"]) == ("fallback", 200, "ok")
    assert record["mu"] == pytest.approx(COEFFS.alpha * 220 + COEFFS.beta * 2 + COEFFS.gamma)
    assert count(m.PD_PREFILL_FALLBACKS, ep.name, reason) == before + 1
    assert state.runtimes[ep.id].prefill_pool.slots["200"].view.in_flight == 0


class Stalled_read(Response):  # noqa: N801 - reads like the answer it scripts
    """A prefill replica that accepted the request and never answers."""

    async def read(self):
        await asyncio.Event().wait()


async def test_a_client_leaving_during_the_prefill_aborts_it_and_sends_no_decode(monkeypatch):
    ep = pd_endpoint(name="pd-leave")
    reads = []

    class Hanging(Stalled_read):
        async def read(self):
            reads.append("started")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                reads.append("aborted")  # the connection is closed under it: vLLM aborts the request
                raise

    session = Session({P0: Hanging, D0: decode_stream()})
    state, client = State(world(ep), session), Client(chat(ep))
    task = asyncio.create_task(run(state, client, monkeypatch=monkeypatch))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if reads:
            break
    client.left.set()
    await asyncio.wait_for(task, 5)
    assert reads == ["started", "aborted"]
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == [P0], "the decode was never sent"
    [record] = state.usage.records
    assert (record["status"], record["pd_route"], record["prefill_replica_id"]) == ("client_cancelled", "split", 200)
    runtime = state.runtimes[ep.id]
    assert runtime.in_flight == 0 and runtime.prefill_pool.slots["200"].view.in_flight == 0


async def test_no_free_prefill_slot_is_a_fallback_too(monkeypatch):
    ep = pd_endpoint(name="pd-busy")
    session = Session({P0: prefill_answer(), D0: decode_stream(cached=0)})
    state = State(world(ep), session)
    runtime = state.runtime_for(ep)
    pool = prefill_pool(runtime)
    pool.slots["200"].view.in_flight = pool.slots["200"].view.concurrency_limit
    client = Client(chat(ep))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and [url.split("/v1/")[0] for url, _, _ in session.posted] == [D0]
    assert state.usage.records[0]["pd_route"] == "fallback" and state.usage.records[0]["prefill_replica_id"] is None


def test_the_prefill_pool_routes_a_shared_prefix_to_one_replica_and_spreads_load():
    ep = pd_endpoint(prefills=2)
    pool = PrefillPool(ep, stale_after_s=5.0)

    def route(i, text):
        return prefill_route(
            RouteRequest(request_id=f"r{i}", prompt_text=text, extra={"cache_salt": "s", "prompt_tokens": 500}),
            PREFILL_COEFFS,
        )

    shared = "system prompt of the team " * 60
    first = pool.take(route(0, shared + "q0"))
    pool.release(first, route(0, shared + "q0"))
    again = [pool.take(route(i, shared + f"q{i}")) for i in range(1, 3)]
    assert {s.replica_id for s in again} == {first.replica_id}, "the prompt's prefix is cached there"
    assert pool.slots[str(first.replica_id)].view.in_flight == 2
    others = {pool.take(route(i, f"unrelated prompt {i} " * 40)).replica_id for i in range(3, 6)}
    assert others - {first.replica_id}, "new prompts go where the load is lower"


def test_phase_pricing_and_the_prefill_payload_are_pure():
    ep = pd_endpoint()
    usage = split_usage(
        type("PD", (), {"prefill_usage": {"prompt_tokens_details": {"cached_tokens": 500}}})(),
        {"prompt_tokens": 100, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}},
    )
    assert usage["prompt_tokens_details"]["cached_tokens"] == 100, "never more cached than the prompt"
    mu, prefill_mu = split_mu(ep, usage)
    assert prefill_mu == pytest.approx(0.0002 * 100 + 0.3) and mu == pytest.approx(prefill_mu + 0.01 * 10)
    req = parse_request("completions", json.dumps({"model": ep.name, "prompt": "abc", "max_tokens": 9}).encode())
    body = json.loads(prefill_payload(req, cache_salt="s", engine_priority=None, engine_model="m", kv_connector="x"))
    assert body == {"model": "m", "prompt": "abc", "max_tokens": 1, "stream": False, "cache_salt": "s"}
    assert prefill_timeout_s(60.0, ep) == 1.0 and prefill_timeout_s(1.0, ep) == 0.5


def test_a_resumed_nixl_stream_does_not_replay_the_kv_hand_over():
    req = parse_request("chat", json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode())
    decode = decode_request(req, {"kv_transfer_params": KV_PARAMS}, "nixl")
    assert decode.body["kv_transfer_params"] == KV_PARAMS and "kv_transfer_params" not in req.body
    assert decode_request(req, {"kv_transfer_params": KV_PARAMS}, "shared_storage") is req
    relayed = [b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}\n\n']
    assert "kv_transfer_params" not in continuation(decode, streamed(relayed, "chat")).body


def first_by_id(route, views, now):
    return min(v.replica_id for v in views)


async def test_a_failing_prefill_replica_cools_down_and_another_prefills(monkeypatch):
    ep = pd_endpoint(name="pd-two", prefills=2)
    session = Session({P0: lambda: Response(status=503), P1: prefill_answer(), D0: decode_stream()})
    state = State(world(ep), session)
    pool = prefill_pool(state.runtime_for(ep))
    pool.router.pick = first_by_id  # prefill-0 first whenever it is offered
    for _ in range(2):
        client = Client(chat(ep))
        await run(state, client, monkeypatch=monkeypatch)
        assert client.status == 200
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == [P0, P1, D0, P1, D0], "prefill-0 cools down"
    assert [(r["pd_route"], r["prefill_replica_id"]) for r in state.usage.records] == [("split", 201)] * 2
    pool.slots["200"].cool_until = 0.0  # the cooldown over: it is tried again
    session.by_url[P0] = lambda: Response(status=400, body=b'{"error": {"message": "bad"}}')
    refused = Client(chat(ep))
    before = count(m.PD_PREFILL_FALLBACKS, ep.name, "refused")
    await run(state, refused, monkeypatch=monkeypatch)
    assert refused.status == 200 and [url.split("/v1/")[0] for url, _, _ in session.posted][-2:] == [P0, D0]
    assert state.usage.records[-1]["pd_route"] == "fallback"
    assert count(m.PD_PREFILL_FALLBACKS, ep.name, "refused") == before + 1
    assert pool.slots["200"].cool_until == 0.0, "a request the engine refuses says nothing of the replica"
    session.by_url[P0] = lambda: Response(status=404, body=b'{"error": {"message": "model not found"}}')
    await run(state, Client(chat(ep)), monkeypatch=monkeypatch)
    assert state.usage.records[-1]["pd_route"] == "split", "prefill-1 answered it"
    assert pool.slots["200"].cool_until > 0.0, "a replica that does not serve the model is cooled down"


async def test_a_nixl_decode_retried_on_another_replica_prefills_there(monkeypatch):
    ep = pd_endpoint(name="pd-nixl-retry", decodes=2, connector="nixl")
    session = Session({P0: prefill_answer(params=KV_PARAMS), D0: lambda: Response(status=503), D1: decode_stream()})
    state = State(world(ep), session)
    state.runtime_for(ep).router.pick = first_by_id  # decode-0 first
    client = Client(chat(ep))
    await run(state, client, monkeypatch=monkeypatch)
    assert client.status == 200 and client.body_bytes() == TOKEN + DONE
    [(_, _, _), (d0, first, _), (d1, second, _)] = session.posted
    assert (d0.split("/v1/")[0], d1.split("/v1/")[0]) == (D0, D1)
    assert first["kv_transfer_params"] == KV_PARAMS and "kv_transfer_params" not in second


class OneScraped:
    """The scraper's read side: prefill replica 200 was scraped just now, the other never (it does not answer)."""

    def latest(self, replica_id: str):
        return ReplicaMetrics(scraped_at=100.0, num_waiting=3) if replica_id == "200" else None

    def note(self, replica_ids) -> None:
        pass


def test_the_runtime_holds_the_prefill_pool_scrapes_it_and_routes_away_from_a_silent_replica():
    ep = pd_endpoint(name="pd-scraped", prefills=2)
    runtime = EndpointRuntime(ep, config=ProxyConfig(), scraper=OneScraped(), clock=lambda: 100.0)
    assert set(runtime.slots) == {"300"}, "admission is over the decode pool"
    assert runtime.scrape_targets() == {"300": D0, "200": P0, "201": P1}, "both pools' engines are scraped"
    pool = runtime.prefill_pool
    pool.clock = lambda: 100.0
    pool.router.pick = lambda route, views, now: max(v.replica_id for v in views if v.metrics_age_s < 2.0)
    taken = pool.take(prefill_route(RouteRequest(request_id="r", prompt_text=LONG), PREFILL_COEFFS))
    assert taken.replica_id == 200 and taken.view.num_waiting == 3
    assert pool.slots["201"].view.metrics_age_s == float("inf")
    runtime.update(dataclasses.replace(ep, serving_mode="aggregated"))
    assert runtime.prefill_pool is pool, "kept while a prefill it sent runs"
    pool.release(taken, RouteRequest(request_id="r", prompt_text=LONG, mu=taken.view.in_flight_mu))
    assert pool.slots == {}, "an aggregated endpoint's replicas are no prefill pool's"
    runtime.update(dataclasses.replace(ep, serving_mode="aggregated"))
    assert runtime.prefill_pool is None and set(runtime.slots) == {"200", "201", "300"}


async def test_the_prefill_phase_is_a_span_between_admission_and_the_decode(monkeypatch):
    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False, service_name="test")
    try:
        ep = pd_endpoint(name="pd-traced")
        session = Session({P0: prefill_answer(), D0: decode_stream()})
        await run(State(world(ep), session), Client(chat(ep)), monkeypatch=monkeypatch)
    finally:
        tracing.disable()
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time)
    names = [s.name for s in spans if s.name in ("proxy.admit", "proxy.prefill", "proxy.upstream")]
    assert names == ["proxy.admit", "proxy.prefill", "proxy.upstream"]
    prefill = next(s for s in spans if s.name == "proxy.prefill")
    assert prefill.attributes["infercap.pd.route"] == "split"
    assert prefill.attributes["infercap.pd.prefill_replica.id"] == "200"
    [(_, _, p_headers), (_, _, d_headers)] = session.posted
    assert "traceparent" in d_headers and "traceparent" not in p_headers


async def test_admission_holds_for_the_pair_a_shed_request_costs_no_prefill(monkeypatch):
    ep = pd_endpoint(name="pd-shed", limit=1)  # one decode slot
    session = Session({P0: prefill_answer(), D0: silent_after(TOKEN)})  # the first stream holds the slot
    state = State(world(ep), session, max_age_sheddable_s=0.2, idle_timeout_s=30.0)
    holder = Client(chat(ep))
    held = asyncio.create_task(run(state, holder, monkeypatch=monkeypatch))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(session.posted) == 2:
            break
    shed = Client(chat(ep))
    headers = {**bearer(), b"x-infercap-priority": b"sheddable"}
    await asyncio.wait_for(run(state, shed, headers=headers, monkeypatch=monkeypatch), 5)
    assert shed.status == 429 and shed.error()["code"] in ("queue_age", "overloaded")
    assert int(dict(shed.sent[0]["headers"])[b"retry-after"]) >= 1
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == [P0, D0], "no prefill for a shed request"
    holder.left.set()
    await asyncio.wait_for(held, 5)
    assert [r["status"] for r in state.usage.records] == ["shed", "client_cancelled"]
    assert state.runtimes[ep.id].in_flight == 0


async def test_a_prefill_replica_on_fcfs_is_sent_no_priority_after_its_first_refusal(monkeypatch):
    ep = pd_endpoint(name="pd-fcfs")
    refusal = b'{"error": {"message": "priority scheduling is not enabled", "code": 400}}'
    answers = iter([Response(status=400, body=refusal), prefill_answer()(), prefill_answer()()])
    session = Session({P0: lambda: next(answers), D0: decode_stream()})
    state = State(world(ep), session)
    for _ in range(2):
        client = Client(chat(ep))
        await run(state, client, monkeypatch=monkeypatch)
        assert client.status == 200
    prefills = [body for url, body, _ in session.posted if url.startswith(P0)]
    assert ["priority" in body for body in prefills] == [True, False, False], "refused once, then never sent"
    assert [r["pd_route"] for r in state.usage.records] == ["split", "split"]
    assert all("priority" in body for url, body, _ in session.posted if url.startswith(D0)), "the decode's own"


def test_the_heartbeat_shares_the_prefill_replicas_limits_between_proxy_processes():
    state = ProxyState(ProxyConfig())
    ep = pd_endpoint(name="pd-shared")  # prefill replica 200 and decode replica 300, each a limit of 4
    rt = state.runtimes[ep.id] = EndpointRuntime(ep, config=ProxyConfig(), clock=lambda: 0.0)
    pool = rt.prefill_pool
    assert [p.replica_limits() for p in state._slot_pools()] == [{"300": 4}, {"200": 4}], "both pools are shared"
    state.members = {
        state.process_id: Member(joined=0.0, seen_at=1.0, holdings={"300": 2, "200": 1}),
        "other": Member(joined=0.0, seen_at=1.0, holdings={"200": 3}),
    }
    state._book.allocation = {"200": 1, "300": 2}
    state._apply_caps()
    assert (rt.caps, pool.caps) == ({"300": 2}, {"200": 1})

    def route(i, klass):
        extra = {"prompt_tokens": 300, "priority_class": klass}
        return prefill_route(RouteRequest(request_id=f"r{i}", prompt_text=LONG, extra=extra), PREFILL_COEFFS)

    first = pool.take(route(0, 0))
    assert first is not None and pool.take(route(1, 0)) is None, "the other process holds the rest"
    assert pool.demand_by_replica() == {"200": (1, 0, 0)} and pool.in_flight_by_replica() == {"200": 1}
    lower_caps(pool, {"200": 0})
    pool.release(first, route(0, 0))
    assert pool.demand_by_replica() == {} and pool.take(route(2, 1)) is None


async def test_after_a_split_the_decode_router_counts_no_prefill_waiting_on_the_decode_replica(monkeypatch):
    ep = dataclasses.replace(pd_endpoint(name="pd-pending"), routing_policy="infercap")
    session = Session({P0: prefill_answer(), D0: silent_after()})  # the decode has not answered yet
    state = State(world(ep), session, ttft_timeout_s=1.0)  # then the watchdog ends the silent decode
    client = Client(chat(ep))
    task = asyncio.create_task(run(state, client, monkeypatch=monkeypatch))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if len(session.posted) == 2:
            break
    runtime = state.runtimes[ep.id]
    assert [url.split("/v1/")[0] for url, _, _ in session.posted] == [P0, D0]
    assert runtime.in_flight == 1 and runtime.router.pending_prefill.tokens("300") == 0
    await asyncio.wait_for(task, 5)
    assert client.status == 504 and runtime.in_flight == 0


async def test_a_split_request_of_n_sequences_pays_its_prompt_once(monkeypatch):
    ep = pd_endpoint(name="pd-n")
    session = Session({P0: prefill_answer(), D0: decode_stream(out=4)})
    state = State(world(ep), session)
    await run(state, Client(chat(ep, n=2, max_tokens=2)), monkeypatch=monkeypatch)
    [(_, prefill, _), (_, decode, _)] = session.posted
    assert "n" not in prefill and decode["n"] == 2
    [record] = state.usage.records
    assert (record["input_tokens"], record["cached_tokens"], record["output_tokens"]) == (220, 64, 4)
    assert record["mu"] == pytest.approx(0.002 * 156 + 0.0002 * 64 + 0.3 + COEFFS.beta * 4)
