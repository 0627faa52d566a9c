"""The metering stage without sockets: the latencies and tokens a request is recorded with, the SLO verdict, the
usage record's fields, and what ``meter`` does for requests that got more or less far."""

import asyncio
import json

import aiohttp
import httpx
import pytest

from capacity.hardware.profiles import get_profile
from capacity.units import usage_mu
from gateway.proxy.flight import Admission, Flight, Price
from gateway.proxy.limits import Bucket, RateLimiter
from gateway.proxy.metering import Measured, engine_usage, measure, meets_slo, meter, usage_record
from gateway.proxy.relay import Outcome
from gateway.proxy.request import parse_request
from gateway.proxy.snapshot import AdapterInfo
from gateway.proxy.unfinished import needs_partial_usage, partial_usage, prompt_token_count
from gateway.routing.base import RouteRequest
from simulator.server import ThreadedReplica
from tests.proxy.snapshots import COEFFS, TENANT_A, endpoint, key

USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 11,
    "total_tokens": 111,
    "prompt_tokens_details": {"cached_tokens": 64},
}


def outcome(*, first=10.2, finished=11.2, usage=None, events=0, status="ok") -> Outcome:
    return Outcome(status=status, first_token_at=first, finished_at=finished, usage=usage, content_events=events)


def test_measure_takes_tokens_from_usage_and_times_from_arrival():
    got = measure(outcome(usage=USAGE), USAGE, t0=10.0, done_at=11.5)
    assert (got.input_tokens, got.cached_tokens, got.output_tokens) == (100, 64, 11)
    assert got.ttft_s == pytest.approx(0.2)
    assert got.tpot_s == pytest.approx(1.0 / 10)  # 10 gaps between 11 tokens, first token to the last byte
    assert got.e2e_s == pytest.approx(1.5)


def test_a_stream_broken_before_its_usage_counts_the_tokens_it_delivered():
    got = measure(outcome(events=5, finished=None), None, t0=10.0, done_at=10.6)
    assert (got.input_tokens, got.output_tokens) == (0, 5)
    assert got.tpot_s == pytest.approx(0.4 / 4)  # no finish time: up to the end of the request
    nothing = measure(None, None, t0=10.0, done_at=10.01)  # refused before any replica was asked
    assert (nothing.output_tokens, nothing.ttft_s, nothing.tpot_s) == (0, None, None)
    one_token = measure(
        outcome(usage={**USAGE, "completion_tokens": 1}), {**USAGE, "completion_tokens": 1}, t0=10, done_at=11
    )
    assert one_token.tpot_s is None


def test_slo_met_needs_an_ok_answer_within_both_latency_targets():
    ep = endpoint()  # TTFT 500 ms, TPOT 50 ms
    fast = Measured(1, 0, 10, ttft_s=0.4, tpot_s=0.04, e2e_s=1.0)
    assert meets_slo("ok", fast, ep)
    assert not meets_slo("upstream_error", fast, ep)
    assert not meets_slo("ok", Measured(1, 0, 10, ttft_s=0.6, tpot_s=0.04, e2e_s=1.0), ep)
    assert not meets_slo("ok", Measured(1, 0, 10, ttft_s=0.4, tpot_s=0.06, e2e_s=1.0), ep)
    assert meets_slo("ok", Measured(1, 0, 1, ttft_s=0.4, tpot_s=None, e2e_s=1.0), ep)
    assert not meets_slo("ok", Measured(0, 0, 0, ttft_s=None, tpot_s=None, e2e_s=1.0), ep)


class Runtime:
    def __init__(self):
        self.released = []

    def release(self, slot, route, mu_reserved, mu_done):
        self.released.append((slot, mu_reserved, mu_done))


class Slot:
    replica_id = 100


class Usage:
    def __init__(self):
        self.records = []

    def submit(self, record):
        self.records.append(record)


class Limiter:
    def __init__(self):
        self.settled = []

    async def settle(self, **kwargs):
        self.settled.append(kwargs)


class State:
    def __init__(self):
        self.usage, self.limiter, self.spawned = Usage(), Limiter(), []

    def spawn(self, coro):
        self.spawned.append(coro)


def flight(*, reached_endpoint=True, admitted=True, charged=()) -> Flight:
    f = Flight(t0=10.0, task=None)
    f.key = key()
    if reached_endpoint:
        f.endpoint = endpoint()
        f.price = Price(priority="critical", mu=3.0, tokens=300, buckets=list(charged))
        f.charged = list(charged)
    if admitted:
        route = RouteRequest(request_id=f.request_id, prompt_text="")
        f.admission = Admission(runtime=Runtime(), route=route, slot=Slot(), queue_s=0.25, mu=3.0)
        f.outcome = outcome(usage=USAGE)
    return f


def test_the_usage_record_names_who_what_where_and_how_it_went():
    f = flight()
    measured = Measured(100, 64, 11, ttft_s=0.2, tpot_s=0.1, e2e_s=1.5)
    record = usage_record(f, status="ok", measured=measured, mu=1.23456789, slo_met=True)
    assert record == {
        "request_id": f.request_id,
        "tenant_id": TENANT_A,
        "api_key_id": 11,
        "endpoint_id": 7,
        "replica_id": 100,
        "priority": "critical",
        "input_tokens": 100,
        "cached_tokens": 64,
        "output_tokens": 11,
        "mu": 1.234568,
        "queue_ms": 250.0,
        "ttft_ms": 200.0,
        "tpot_ms": 100.0,
        "e2e_ms": 1500.0,
        "status": "ok",
        "slo_met": True,
        "degradation": "",
        "adapter": "",
        "adapter_load_mu": 0.0,
        "platform_prompt_tokens": 0,
        "requested_endpoint_id": 7,
        "started_at": f.started_at,
        "finished_at": f.started_at + 1.5,
    }
    f.admission.slot = None  # every attempt failed: no replica answered
    assert usage_record(f, status="upstream_error", measured=measured, mu=0.0, slo_met=False)["replica_id"] is None


def test_meter_releases_the_slot_with_the_actual_cost_records_once_and_settles_what_was_charged():
    state = State()
    f = flight(charged=[Bucket("mu", 600.0, 10.0, 3.0)])
    runtime = f.admission.runtime
    meter(state, f)
    actual = usage_mu(COEFFS, prompt_tokens=100, cached_tokens=64, completion_tokens=11)
    assert runtime.released == [(f.admission.slot, 3.0, actual)]
    [record] = state.usage.records
    assert record["mu"] == round(actual, 6) and record["status"] == "ok" and record["priority"] == "critical"
    [settle] = state.spawned
    asyncio.run(settle)
    assert state.limiter.settled == [
        {
            "tenant_id": TENANT_A,
            "endpoint_id": 7,
            "buckets": f.charged,
            "actual": {"mu": actual, "best_effort_mu": actual, "tpm": 111.0},
        }
    ]


def test_meter_records_the_status_a_refusal_set_and_nothing_for_requests_refused_before_their_endpoint():
    state = State()
    rate_limited = flight(admitted=False)
    rate_limited.usage_status = "rate_limited"
    meter(state, rate_limited)
    [record] = state.usage.records
    assert (record["status"], record["replica_id"], record["ttft_ms"], record["queue_ms"]) == (
        "rate_limited",
        None,
        None,
        None,
    )
    assert state.spawned == []  # nothing charged, nothing to settle
    invalid = flight(reached_endpoint=False, admitted=False)
    meter(state, invalid)
    assert len(state.usage.records) == 1


def test_a_best_effort_bucket_is_settled_to_the_real_cost_not_left_at_the_estimate():
    # A best-effort request estimated at 1 MU that really cost 30 (no max_tokens, min_tokens far above the estimate):
    # the tenant's cap is charged the 30, so the next request waits for it to refill.
    limiter = RateLimiter(None)
    state = State()
    state.limiter = limiter
    bucket = Bucket("best_effort_mu", 20.0, 20.0 / 60, 1.0)
    assert asyncio.run(limiter.acquire(tenant_id=TENANT_A, endpoint_id=7, buckets=[bucket])) == (0.0, "")
    f = flight(charged=[bucket])
    f.outcome = outcome(usage={"prompt_tokens": 10, "completion_tokens": 3000, "total_tokens": 3010})
    meter(state, f)
    for coro in state.spawned:
        asyncio.run(coro)
    real = usage_mu(COEFFS, prompt_tokens=10, cached_tokens=0, completion_tokens=3000)
    assert real > 20  # the case means something: far above the 1 MU estimate, and the whole cap
    wait_s, name = asyncio.run(limiter.acquire(tenant_id=TENANT_A, endpoint_id=7, buckets=[bucket]))
    assert name == "best_effort_mu" and wait_s > 0


def test_only_requests_a_replica_computed_for_need_the_usage_of_what_they_delivered():
    assert needs_partial_usage(outcome(events=390), "client")  # left mid-stream
    assert needs_partial_usage(outcome(events=0), "client")  # left after dispatch, before the first token
    assert needs_partial_usage(outcome(events=12), None)  # the stream broke and was ended with an error event
    assert not needs_partial_usage(None, "client")  # left while queued: nothing was computed
    assert not needs_partial_usage(outcome(usage=USAGE, events=11), "client")  # the replica's own usage counts
    assert not needs_partial_usage(outcome(events=0), "ttft")  # the replica never started: the platform's failure
    refused = outcome(events=0, status="upstream_error")
    refused.error = "replica answered 400"
    assert not needs_partial_usage(refused, "client")
    usage = partial_usage(57, outcome(events=390))
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (57, 390, 447)


def test_a_client_leaving_mid_stream_is_metered_for_its_prompt_and_what_it_was_sent():
    state = State()
    f = flight(charged=[Bucket("mu", 600.0, 10.0, 3.0)])
    f.outcome = outcome(events=390)
    f.outcome.usage = partial_usage(57, f.outcome)
    f.usage_status = "client_cancelled"
    meter(state, f)
    for coro in state.spawned:
        asyncio.run(coro)
    [record] = state.usage.records
    mu = usage_mu(COEFFS, prompt_tokens=57, cached_tokens=0, completion_tokens=390)
    assert record["status"] == "client_cancelled" and (record["input_tokens"], record["output_tokens"]) == (57, 390)
    assert record["mu"] == round(mu, 6) > 0
    assert f.admission.runtime.released == [(f.admission.slot, 3.0, mu)]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello " * 30}]},
        {"prompt": "a completion prompt of some length " * 5},
        {"prompt": ["first of a batch", "and the second, a little longer"]},
        {"prompt": [5, 6, 7, 8, 9]},
    ],
)
def test_the_prompt_of_an_unfinished_request_is_counted_as_the_replica_counts_it(body):
    with ThreadedReplica(get_profile("tiny"), speed=50.0) as replica:
        kind = "chat" if "messages" in body else "completions"
        model = replica.server.model
        req = parse_request(kind, json.dumps({"model": model, "max_tokens": 2, **body}).encode())

        async def count() -> int:
            async with aiohttp.ClientSession() as session:
                return await prompt_token_count(session, replica.url, req)

        counted = asyncio.run(count())
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        served = httpx.post(replica.url + path, json={"model": model, "max_tokens": 2, **body}, timeout=10)
        assert served.status_code == 200, served.text
        assert counted == served.json()["usage"]["prompt_tokens"]
    # No replica to ask (it is gone): the proxy's estimate.
    assert asyncio.run(prompt_token_count(None, None, req)) > 0


def test_an_adapter_request_is_metered_its_factor_and_the_load_it_caused():
    state = State()
    f = flight(charged=[Bucket("mu", 600.0, 10.0, 3.0)])
    f.adapter = AdapterInfo(
        name="ft", owner_tenant_id=TENANT_A, endpoint_name="m", rank=8, path="/x", created=0, mu_factor=1.25
    )
    f.adapter_load_mu = 4.5  # the replica's MU per second over the load's seconds (stages.load_adapter)
    meter(state, f)
    for coro in state.spawned:
        asyncio.run(coro)
    [record] = state.usage.records
    served = usage_mu(COEFFS, prompt_tokens=100, cached_tokens=64, completion_tokens=11) * 1.25
    assert record["mu"] == round(served + 4.5, 6) and record["adapter"] == "ft" and record["adapter_load_mu"] == 4.5
    assert state.limiter.settled[0]["actual"]["mu"] == pytest.approx(served + 4.5)


def test_a_request_of_n_sequences_is_metered_for_n_prefills_as_the_engine_counts_them():
    # vLLM 0.32 measured: a 613-token prompt with n=4 made the engine count 2,452 prompt tokens and 1,536 cache hits
    # (each later sequence found the first one's 512 full-block tokens), while the usage block said 613 and 512.
    usage = {"prompt_tokens": 613, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 512}}
    counted = engine_usage(usage, 4)
    assert counted["prompt_tokens"] == 2452 and counted["prompt_tokens_details"]["cached_tokens"] == 1536
    assert counted["total_tokens"] == 2472 and counted["completion_tokens"] == 20
    assert (
        engine_usage(usage, 1) is usage and engine_usage(usage, None) is usage and engine_usage(usage, True) is usage
    )
    # A stream's usage reports the first sequence's cached tokens (0 for a new prompt): each later one is given the
    # prompt's full blocks (measured: a 457-token chat stream with n=3, 128-token blocks, 768 engine hits).
    streamed = {"prompt_tokens": 457, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0}}
    counted = engine_usage(streamed, 3, streamed_block_size=128)
    assert (counted["prompt_tokens"], counted["prompt_tokens_details"]["cached_tokens"]) == (1371, 768)
    whole_blocks = engine_usage({**streamed, "prompt_tokens": 384}, 2, streamed_block_size=128)
    assert whole_blocks["prompt_tokens_details"]["cached_tokens"] == 256  # its last token is computed: not hit
    state = State()
    f = flight()
    f.req = parse_request("completions", json.dumps({"model": "m", "prompt": "x", "n": 4}).encode())
    f.outcome = outcome(usage=usage)
    meter(state, f)
    [record] = state.usage.records
    assert (record["input_tokens"], record["cached_tokens"]) == (2452, 1536)
    assert record["mu"] == round(usage_mu(COEFFS, prompt_tokens=2452, cached_tokens=1536, completion_tokens=20), 6)


def test_a_stream_resumed_elsewhere_records_the_prefill_the_platform_did_again():
    # Resumed twice, after 40 and then 90 streamed tokens: each continuation prefilled the prompt and the text sent.
    state = State()
    f = flight()
    f.resumed_after = [40, 90]
    meter(state, f)
    [record] = state.usage.records
    assert record["platform_prompt_tokens"] == (100 + 40) + (100 + 90)
    assert record["mu"] == round(usage_mu(COEFFS, prompt_tokens=100, cached_tokens=64, completion_tokens=11), 6)
