"""The proxy's per-request version choice during a rollout (EndpointRuntime with an injected rng; no sockets)."""

import itertools

from capacity.units import MUCoefficients
from gateway.proxy.config import ProxyConfig
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import EndpointInfo, ReplicaInfo
from gateway.routing.base import RouteRequest

OLD, NEW = 1, 2


def info(weights=(), limit=4, replicas=None) -> EndpointInfo:
    replicas = replicas or [
        ReplicaInfo(id=10, name="old-a", url="http://o-a", concurrency_limit=limit, version_id=OLD),
        ReplicaInfo(id=11, name="old-b", url="http://o-b", concurrency_limit=limit, version_id=OLD),
        ReplicaInfo(id=20, name="new-a", url="http://n-a", concurrency_limit=limit, version_id=NEW),
    ]
    return EndpointInfo(
        id=1,
        name="m",
        owner_tenant_id=None,
        coeffs=MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=600.0),
        routing_policy="least_request",
        scale_to_zero=False,
        concurrency_limit=64,
        ttft_slo_ms=2000,
        tpot_slo_ms=100,
        max_model_len=4096,
        created=0,
        replicas=tuple(replicas),
        version_weights=tuple(weights),
    )


def runtime(weights, draws, **kw) -> EndpointRuntime:
    it = itertools.cycle(draws)
    return EndpointRuntime(info(weights, **kw), config=ProxyConfig(), rng=lambda: next(it))


def take(rt: EndpointRuntime, n: int) -> list[int]:
    out = []
    for i in range(n):
        slot = rt.try_take(RouteRequest(request_id=f"r{i}", prompt_text="hi"), 1.0)
        out.append(slot.version_id if slot else None)
    return out


def test_requests_split_by_the_version_weights():
    # draws spread evenly over [0, 1): 10 % of them fall under the canary's weight
    rt = runtime(((OLD, 90), (NEW, 10)), [i / 100 for i in range(100)], limit=1000)
    versions = take(rt, 100)
    assert versions.count(NEW) == 10 and versions.count(OLD) == 90


def test_a_version_with_no_weight_gets_no_traffic_even_when_idle():
    # surging: the new replica is ready but not warmed up; promoting: the old ones are on their way out
    assert set(take(runtime(((OLD, 100),), [0.99]), 8)) == {OLD}
    assert set(take(runtime(((NEW, 100),), [0.0]), 4)) == {NEW}
    # and once its only version is full, requests wait rather than go to the version without weight
    assert take(runtime(((NEW, 100),), [0.0]), 5)[-1] is None


def test_a_full_version_falls_back_to_the_other_weighted_one():
    rt = runtime(((OLD, 50), (NEW, 50)), [0.99], limit=2)  # every draw picks the new version
    assert take(rt, 4) == [NEW, NEW, OLD, OLD]


def test_outside_a_rollout_every_ready_replica_is_routed():
    assert set(take(runtime((), [0.5], limit=1), 3)) == {OLD, NEW}


def test_a_new_snapshot_moves_the_split_without_touching_slots():
    rt = runtime(((OLD, 100),), [0.5], limit=1000)
    assert set(take(rt, 3)) == {OLD}
    rt.update(info(((NEW, 100),), limit=1000))
    assert set(take(rt, 3)) == {NEW}
    assert rt.slots["10"].view.in_flight + rt.slots["11"].view.in_flight == 3  # the old requests still run there
