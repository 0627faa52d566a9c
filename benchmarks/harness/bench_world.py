"""The world a live bench sends traffic through: its tenant with an unlimited reservation, its endpoint on the
simulated profiles, the replicas it started, and a fresh inference key."""

from __future__ import annotations

import time

from capacity.services import simulated_profiles_get_or_create
from endpoints.models import Endpoint, Replica, ReplicaState
from tenants.models import CapacityReservation, Tenant
from tenants.services import api_key_create


def bench_world_create(
    *,
    tenant_slug: str,
    tenant_name: str,
    endpoint_name: str,
    replica_urls: list[str],
    concurrency_limit: int,
    routing_policy: str,
    replica_concurrency_limit: int | None = None,
    key_name: str,
) -> str:
    """Create or update the bench's tenant, endpoint and reservation, replace the endpoint's replicas with
    ``replica_urls`` (ready; ``replica_concurrency_limit`` each, else the model's default), and return the raw key
    of a new API key named ``key_name`` and the time."""
    tenant, _ = Tenant.objects.get_or_create(slug=tenant_slug, defaults={"name": tenant_name})
    hw, mp = simulated_profiles_get_or_create()
    endpoint, _ = Endpoint.objects.update_or_create(
        name=endpoint_name,
        defaults={
            "owner_tenant": tenant,
            "model_profile": mp,
            "hardware_profile": hw,
            "concurrency_limit": concurrency_limit,
            "concurrency_max": 1024,
            "routing_policy": routing_policy,
        },
    )
    CapacityReservation.objects.update_or_create(
        tenant=tenant, endpoint=endpoint, defaults={"mu_per_min": 1e9, "priority": "standard"}
    )
    Replica.objects.filter(endpoint=endpoint).delete()
    limit = {} if replica_concurrency_limit is None else {"concurrency_limit": replica_concurrency_limit}
    for i, url in enumerate(replica_urls):
        Replica.objects.create(endpoint=endpoint, name=f"bench-r{i}", url=url, state=ReplicaState.READY, **limit)
    _, raw = api_key_create(tenant=tenant, name=f"{key_name} {time.time():.0f}")
    return raw
