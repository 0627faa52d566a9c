"""A mixed fleet behind the live proxy, balanced by infercap's load in model units: a replica on hardware with twice
its endpoint's memory bandwidth carries twice the endpoint's MU capacity (the config snapshot's speed,
``capacity.unit_resolver.hardware_speeds``), so it is given about twice the streams. Through real sockets, on
simulated replicas (docs/algorithms.md#routing)."""

import re
import uuid

import httpx
import pytest

from tenants.models import CapacityReservation
from tests.factories import EndpointFactory, HardwareProfileFactory
from tests.proxy.conftest import spawn_proxy, spawn_replica
from tests.proxy.helpers import METRICS_AUTH, Held, chat_body, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STREAMS = 12


def in_flight(base: str, endpoint: str) -> dict[str, int]:
    text = httpx.get(base + "/metrics", headers=METRICS_AUTH).text
    pattern = rf'infercap_proxy_in_flight\{{endpoint="{re.escape(endpoint)}",replica="([^"]+)"\}} ([\d.]+)'
    return {name: int(float(value)) for name, value in re.findall(pattern, text)}


def test_a_replica_on_hardware_twice_as_fast_is_given_about_twice_the_streams(procs, clean_redis, tenant_a):
    endpoint = EndpointFactory(name="mixed-speeds", owner_tenant=tenant_a.tenant, routing_policy="infercap")
    CapacityReservation.objects.create(tenant=tenant_a.tenant, endpoint=endpoint, mu_per_min=1e9)
    # No benchmark of either pair: the speed is decode's roofline, memory bandwidth × GPUs per replica.
    bandwidth = endpoint.hardware_profile.memory_bandwidth_gbps
    twice = HardwareProfileFactory(name="twice-the-bandwidth", gpu_type="H200", memory_bandwidth_gbps=2 * bandwidth)
    _, fast, _ = spawn_replica(procs, endpoint=endpoint, name="fast", speed=1.0)
    fast.hardware_profile = twice
    fast.save(update_fields=["hardware_profile"])
    spawn_replica(procs, endpoint=endpoint, name="slow", speed=1.0)
    # Staleness is not what this test is about: a loaded CI host's scrapes may lag.
    base = spawn_proxy(procs, metrics_stale_s=30, member_interval_s=0.1)
    held = []
    try:
        # One at a time (each is streaming before the next is sent), alike in length and sharing no prefix: only
        # the load in model units over each replica's capacity tells the replicas apart.
        for i in range(STREAMS):
            content = f"{uuid.uuid4().hex} stream {i:02d}"
            held.append(Held(base, tenant_a.raw_key, chat_body(endpoint.name, max_tokens=1500, content=content)))
        wait_for(lambda: sum(in_flight(base, endpoint.name).values()) == STREAMS, 10)
        counts = in_flight(base, endpoint.name)
    finally:
        for stream in held:
            stream.release()
    # Equal loads at twice the capacity: 8 and 4 (equal speeds would give 6 and 6).
    assert counts["fast"] >= 7 and counts["fast"] + counts["slow"] == STREAMS, counts
