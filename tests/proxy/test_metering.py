"""The metering stage without sockets: the latencies and tokens a request is recorded with, the SLO verdict, the
usage record's fields, and what ``meter`` does for requests that got more or less far."""

import asyncio

import pytest

from capacity.units import usage_mu
from endpoints.proxy.flight import Admission, Flight, Price
from endpoints.proxy.limits import Bucket
from endpoints.proxy.metering import Measured, measure, meets_slo, meter, usage_record
from endpoints.proxy.relay import Outcome
from endpoints.routing.base import RouteRequest
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
        {"tenant_id": TENANT_A, "endpoint_id": 7, "buckets": f.charged, "actual": {"mu": actual, "tpm": 111.0}}
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
