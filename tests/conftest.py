"""Named actors shared by every test: an operator, tenant A and tenant B with an admin, a member and keys."""

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tenants.models import ApiKey, Role, Tenant, User
from tenants.services import api_key_create
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


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user=user)
    return client
