"""The demand a proxy process reports to the autoscaler is priced at the expected cost, not admission's bound."""

import pytest

from gateway.proxy.config import ProxyConfig
from gateway.proxy.runtime import MAX_COST_RATIO, EndpointRuntime
from gateway.routing.base import RouteRequest
from tests.rollouts.test_traffic_split import info


def runtime() -> EndpointRuntime:
    return EndpointRuntime(info(limit=1000), config=ProxyConfig(), clock=lambda: 0.0)


def finish(rt: EndpointRuntime, n: int, *, reserved: float, done: float) -> None:
    for i in range(n):
        route = RouteRequest(request_id=f"f{reserved}-{done}-{i}", prompt_text="hi")
        slot = rt.try_take(route, reserved)
        rt.release(slot, route, reserved, done)


def test_demand_follows_what_requests_actually_cost():
    rt = runtime()
    for i in range(10):  # ten requests in flight, each reserved at 41.5 MU (max_tokens 4096)
        rt.try_take(RouteRequest(request_id=f"r{i}", prompt_text="hi"), 41.5)
    assert rt.demand()["in_flight_mu"] == pytest.approx(415.0)  # nothing finished yet: the reserved bound
    finish(rt, 200, reserved=41.5, done=3.55)  # answers of ~300 tokens
    demand = rt.demand()
    assert demand["in_flight_mu_reserved"] == pytest.approx(415.0)
    assert demand["cost_ratio"] == pytest.approx(3.55 / 41.5, rel=0.01)
    assert demand["in_flight_mu"] == pytest.approx(35.5, rel=0.01)


def test_failed_requests_do_not_teach_a_zero_cost_and_overruns_are_capped():
    rt = runtime()
    finish(rt, 100, reserved=10.0, done=0.0)  # upstream errors, refusals: no cost observed
    assert rt.cost_ratio == 1.0
    finish(rt, 500, reserved=1.0, done=100.0)  # far past the typical output it was charged for
    assert rt.cost_ratio == pytest.approx(MAX_COST_RATIO, rel=0.01)


async def test_every_request_that_reaches_admission_is_counted_as_an_arrival():
    rt = runtime()
    for i in range(3):
        slot, waited = await rt.acquire(
            RouteRequest(request_id=f"a{i}", prompt_text="hi"), tenant="t", priority="standard", mu=2.0
        )
        assert waited == 0.0
    demand = rt.demand()
    assert (demand["arrived"], demand["arrived_mu"]) == (3, pytest.approx(6.0))
    rt.release(slot, RouteRequest(request_id="a2", prompt_text="hi"), 2.0, 2.0)
    assert rt.demand()["arrived"] == 3  # cumulative: the sampler takes the differences
