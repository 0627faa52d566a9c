"""Named actors shared by every test: an operator, tenant A and tenant B with an admin, a member and keys."""

from dataclasses import dataclass

import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from capacity.runtimes.processes import ProcessGroup
from tenants.models import ApiKey, Role, Tenant, User
from tenants.services import api_key_create
from tests.adapter_artifacts import lora_root  # noqa: F401 - a fixture: an empty LoRA storage root per test
from tests.factories import EndpointFactory, OperatorFactory, ReservationFactory, TenantFactory, UserFactory


@dataclass
class TenantActors:
    tenant: Tenant
    admin: User
    member: User
    key: ApiKey
    raw_key: str
    endpoint: object


@pytest.fixture
def operator(db) -> User:
    return OperatorFactory(username="operator")


def _tenant_actors(slug: str) -> TenantActors:
    tenant = TenantFactory(name=f"Tenant {slug.upper()}", slug=f"tenant-{slug}")
    admin = UserFactory(username=f"{slug}-admin", tenant=tenant, role=Role.TENANT_ADMIN)
    member = UserFactory(username=f"{slug}-member", tenant=tenant, role=Role.TENANT_MEMBER)
    key, raw = api_key_create(tenant=tenant, name=f"{slug} key", scopes=["inference", "read", "write"])
    endpoint = EndpointFactory(name=f"{slug}-model", owner_tenant=tenant)
    ReservationFactory(tenant=tenant, endpoint=endpoint)
    return TenantActors(tenant=tenant, admin=admin, member=member, key=key, raw_key=raw, endpoint=endpoint)


@pytest.fixture
def tenant_a(db) -> TenantActors:
    return _tenant_actors("a")


@pytest.fixture
def tenant_b(db) -> TenantActors:
    return _tenant_actors("b")


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


@pytest.fixture
def procs():
    """Real processes (replicas, proxies) started by the test; every one is killed on teardown."""
    group = ProcessGroup()
    yield group
    group.kill_all()


@pytest.fixture
def clean_redis():
    """The test's Redis database without infercap's keys (rate buckets, demand, membership, config version)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter("infercap:*"):
        client.delete(key)
    yield client
    client.close()


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client
