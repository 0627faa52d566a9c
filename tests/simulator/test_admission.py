"""The simulator admits through the proxy's admission (``gateway.admission``): overload in a discrete-event run
is answered as production answers it, with the same reasons and Retry-After."""

import asyncio
from collections import Counter

import pytest

from capacity.units import MUCoefficients
from gateway.admission import DEFAULT_MAX_AGE_S, ENGINE_PRIORITY
from gateway.proxy.config import ProxyConfig
from gateway.proxy.runtime import EndpointRuntime, Shed
from gateway.proxy.snapshot import EndpointInfo, ReplicaInfo
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import LeastRequestRouter
from simulator import workloads
from simulator.des import ProxyAdmission, Simulation
from simulator.tokens import filler_text

PROXY_REASONS = {"queue_full", "queue_age", "evicted"}  # the proxy's 429 codes (no_replica is its 503)


def mixed_load(streams, *, duration_s: float):
    """Poisson streams of (class, tenant, requests per second, output tokens), 64-token prompts, merged by arrival."""
    requests = []
    for k, (klass, tenant, rate, output_tokens) in enumerate(streams):
        for i, t in enumerate(workloads.poisson_times(rate, duration_s=duration_s, seed=k)):
            requests.append(
                workloads.SimRequest(
                    request_id=f"{klass}-{tenant}-{i}",
                    arrival_s=t,
                    prompt_parts=(filler_text(64, seed=f"{k}-{i}"),),
                    output_tokens=output_tokens,
                    priority_class=klass,
                    tenant=tenant,
                )
            )
    return sorted(requests, key=lambda r: r.arrival_s)


def one_replica(admission: ProxyAdmission) -> Simulation:
    # A "tiny" replica at 8 concurrent requests of 64 + 32 tokens completes ~36 requests/s.
    return Simulation(
        router=LeastRequestRouter(), replicas=1, profile="tiny", concurrency_limit=8, admission=admission
    )


CAPACITY_RPS = 36.0


def test_at_three_times_capacity_critical_meets_its_slo_and_sheddable_is_shed_at_its_max_age():
    # Given the reliability bench's mix at 3x one replica's capacity: critical 0.3x, standard 0.7x, sheddable 2x
    load = mixed_load(
        [
            ("critical", "a", 0.3 * CAPACITY_RPS, 32),
            ("standard", "b", 0.7 * CAPACITY_RPS, 32),
            ("sheddable", "c", 2.0 * CAPACITY_RPS, 32),
        ],
        duration_s=40.0,
    )
    # When the proxy's admission with its production defaults admits it
    result = one_replica(ProxyAdmission()).run(load)

    by_class = {
        c: [r for r in result.requests if r.priority_class == c] for c in ("critical", "standard", "sheddable")
    }
    assert len(result.requests) / len(result.completed()) > 2.8  # the replica was saturated at ~3x what it served
    # Then critical traffic goes first and meets the Endpoint default TTFT SLO; standard takes what is left
    critical = by_class["critical"]
    assert sum(r.meets(ttft_s=2.0) for r in critical) / len(critical) >= 0.99
    assert {r.status for r in critical} == {r.status for r in by_class["standard"]} == {"ok"}
    # and sheddable work is shed with the proxy's reasons: at arrival once it would wait past 3/4 of its class's
    # max queue age (``overloaded``, fair pain), else exactly at that age (the expiry timer, not the next tick),
    # with a whole-second Retry-After in the proxy's 1-60 s range
    shed = [r for r in result.requests if r.status == "rejected"]
    assert len(shed) >= 0.9 * len(by_class["sheddable"])
    assert {r.priority_class for r in shed} == {"sheddable"}
    assert {r.reason for r in shed} <= {"overloaded", "queue_age"}
    assert sum(r.reason == "overloaded" for r in shed) > 0.5 * len(shed)
    assert all(r.finish_s == pytest.approx(r.arrival_s, abs=1e-6) for r in shed if r.reason == "overloaded")
    aged = [r for r in shed if r.reason == "queue_age"]
    assert all(r.finish_s - r.arrival_s == pytest.approx(DEFAULT_MAX_AGE_S["sheddable"], abs=1e-3) for r in aged)
    assert all(isinstance(r.retry_after_s, int) and 1 <= r.retry_after_s <= 60 for r in shed)


def test_a_full_queue_evicts_the_newest_sheddable_request_for_more_important_ones():
    load = mixed_load(
        [
            ("critical", "a", 0.3 * CAPACITY_RPS, 32),
            ("standard", "b", 0.7 * CAPACITY_RPS, 32),
            ("sheddable", "c", 2.0 * CAPACITY_RPS, 32),
        ],
        duration_s=20.0,
    )
    # (without fair pain, which would refuse most sheddable arrivals before the queue fills)
    result = one_replica(ProxyAdmission(max_queue=64, fair_pain=False)).run(load)

    reasons = Counter((r.priority_class, r.reason) for r in result.requests if r.status == "rejected")
    # the queue fills with sheddable work, which critical and standard arrivals push out; a sheddable arrival
    # finding the queue full is refused
    assert reasons[("sheddable", "evicted")] > 0 and reasons[("sheddable", "queue_full")] > 0
    assert {reason for _, reason in reasons} <= PROXY_REASONS
    assert not [key for key in reasons if key[1] == "evicted" and key[0] != "sheddable"]


def test_tenants_of_one_class_get_equal_model_units_whatever_they_send():
    # Given two standard tenants both over their share: "big" sends twice the requests, each ~1.8x the MU
    load = mixed_load(
        [("standard", "big", 2.0 * CAPACITY_RPS, 64), ("standard", "small", 1.0 * CAPACITY_RPS, 32)], duration_s=40.0
    )
    # When admitted with a queue large enough that only queue age sheds
    result = one_replica(ProxyAdmission(max_queue=10_000, fair_pain=False)).run(load)

    # Then, once both are backlogged, deficit round robin serves them equal MU (FIFO would give "big" ~3.7x)
    served = Counter()
    for r in result.requests:
        if r.dispatch_s is not None and 10.0 <= r.dispatch_s < 40.0:
            served[r.tenant] += r.mu
    assert served["big"] == pytest.approx(served["small"], rel=0.05)
    assert {r.reason for r in result.requests if r.status == "rejected"} == {"queue_age"}


def test_the_engine_gets_the_class_priority_not_the_clients():
    sent = []

    class Spy(LeastRequestRouter):
        def on_routed(self, request, replica_id, now):
            sent.append((request.extra["priority_class"], request.extra["priority"]))
            super().on_routed(request, replica_id, now)

    load = [
        workloads.SimRequest(f"r{i}", 0.0, ("x" * 64,), 4, priority=-100, priority_class=klass)
        for i, klass in enumerate(("critical", "standard", "sheddable"))
    ]
    Simulation(router=Spy(), replicas=1, profile="tiny", admission=ProxyAdmission()).run(load)
    assert sorted(sent) == sorted(ENGINE_PRIORITY.items())


def view(in_flight=0, limit=2, healthy=True, draining=False, in_flight_mu=0.0):
    return ReplicaView(
        replica_id="r",
        in_flight=in_flight,
        concurrency_limit=limit,
        healthy=healthy,
        draining=draining,
        in_flight_mu=in_flight_mu,
        mu_capacity=10.0,
    )


def route(rid, priority="standard", mu=1.0):
    return RouteRequest(request_id=rid, prompt_text="hi", mu=mu, extra={"priority_class": priority, "tenant": "t"})


def test_only_healthy_serving_replicas_take_work_and_none_at_all_is_a_503_unless_scaling_from_zero():
    admission = ProxyAdmission()
    assert admission.offer(route("a"), [view(1)], now=0.0).dispatch  # a free slot, nobody waiting
    assert not admission.offer(route("b"), [view(2)], now=0.1).dispatch  # full: queued
    assert not admission.offer(route("c"), [view(1)], now=0.2).dispatch  # a slot is free, but b waits: no overtaking
    assert not admission.poll([view(0, draining=True), view(0, healthy=False)], now=0.3).dispatch
    assert [r.request_id for r in admission.poll([view(0)], now=0.4).dispatch] == ["b", "c"]

    refused = admission.offer(route("d"), [view(0, draining=True)], now=1.0).reject
    assert [(r.reason, r.retry_after_s) for r in refused] == [("no_replica", 1)]
    waits = ProxyAdmission(scale_to_zero=True).offer(route("e"), [], now=1.0)
    assert not waits.dispatch and not waits.reject


# -- the same decisions as the live proxy --------------------------------------------------------------------------
ENDPOINT = EndpointInfo(
    id=1,
    name="m",
    owner_tenant_id=None,
    coeffs=MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=600.0),  # 10 MU/s
    routing_policy="least_request",
    scale_to_zero=False,
    concurrency_limit=64,
    ttft_slo_ms=2000,
    tpot_slo_ms=100,
    max_model_len=4096,
    created=0,
    replicas=(ReplicaInfo(id=10, name="r", url="http://r", concurrency_limit=1),),
)
# (time, action, request id, class, MU): one slot, a queue of 3
SCRIPT = [
    (0.0, "arrive", "r0", "standard", 1.0),  # takes the slot
    (0.1, "arrive", "r1", "sheddable", 2.0),
    (0.2, "arrive", "r2", "standard", 3.0),
    (0.3, "arrive", "r3", "sheddable", 4.0),  # the queue is full
    (0.4, "arrive", "r4", "critical", 5.0),  # evicts r3, the newest sheddable
    (0.5, "arrive", "r5", "sheddable", 6.0),  # refused: queue_full
    (2.2, "tick", "", "", 0.0),  # r1 is over the sheddable max age
    (2.5, "finish", "r0", "", 0.0),  # critical r4 goes before standard r2
    (3.0, "finish", "r4", "", 0.0),
    (3.1, "arrive", "r6", "sheddable", 1.5),
    (3.2, "arrive", "r7", "standard", 2.5),
    (3.3, "arrive", "r8", "critical", 3.5),
    (3.4, "arrive", "r9", "sheddable", 4.5),  # full again: Retry-After now from the measured drain rate
]


def run_on_the_proxy() -> tuple[dict, list]:
    async def main():
        now = [0.0]
        runtime = EndpointRuntime(ENDPOINT, config=ProxyConfig(max_queue=3), clock=lambda: now[0])
        outcomes, order, held = {}, [], {}

        async def arrive(rid, klass, mu):
            request = RouteRequest(request_id=rid, prompt_text="hi", mu=mu)
            try:
                slot, _ = await runtime.acquire(request, tenant="t", priority=klass, mu=mu)
            except Shed as shed:
                outcomes[rid] = (shed.reason, shed.retry_after)
                return
            outcomes[rid] = ("dispatched", now[0])
            order.append(rid)
            held[rid] = (slot, request, mu)

        for at, action, rid, klass, mu in SCRIPT:
            now[0] = at
            if action == "arrive":
                asyncio.get_running_loop().create_task(arrive(rid, klass, mu))
            elif action == "tick":
                runtime.pump()
            else:
                slot, request, reserved = held.pop(rid)
                runtime.release(slot, request, reserved, reserved)
            for _ in range(5):  # let the woken requests record what happened to them
                await asyncio.sleep(0)
        return outcomes, order

    return asyncio.run(main())


def run_in_the_simulator() -> tuple[dict, list]:
    admission = ProxyAdmission(max_queue=3)
    running: dict[str, RouteRequest] = {}
    outcomes, order = {}, []

    def views():
        return [view(len(running), limit=1, in_flight_mu=sum(r.mu for r in running.values()))]

    def apply(verdict, now):
        for rejection in verdict.reject:
            outcomes[rejection.request.request_id] = (rejection.reason, rejection.retry_after_s)
        for request in verdict.dispatch:
            outcomes[request.request_id] = ("dispatched", now)
            order.append(request.request_id)
            running[request.request_id] = request

    for at, action, rid, klass, mu in SCRIPT:
        if action == "arrive":
            apply(admission.offer(route(rid, klass, mu), views(), at), at)
        elif action == "tick":
            apply(admission.poll(views(), at), at)
        else:
            admission.on_finished(running.pop(rid), "r", at)
            apply(admission.poll(views(), at), at)
    return outcomes, order


def test_refusals_and_retry_after_match_the_live_proxys_runtime():
    proxy_outcomes, proxy_order = run_on_the_proxy()
    sim_outcomes, sim_order = run_in_the_simulator()

    assert sim_outcomes == proxy_outcomes and sim_order == proxy_order
    assert proxy_order == ["r0", "r4", "r2"]
    assert {rid: o[0] for rid, o in proxy_outcomes.items() if o[0] != "dispatched"} == {
        "r1": "queue_age",
        "r3": "evicted",
        # a sheddable arrival that would have waited past 3/4 of its max age (fair pain; proxy and simulator alike)
        "r5": "overloaded",
        "r9": "queue_full",
    }
