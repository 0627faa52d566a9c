"""The API tests' world: the shared actors plus a read-only key, and clients for each kind of principal."""

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tenants.models import User
from tenants.services import api_key_create
from tests.conftest import TenantActors


@dataclass
class World:
    operator: User
    a: TenantActors
    b: TenantActors
    a_read_key_raw: str

    def client(self, who: str) -> APIClient:
        """who: operator, a_admin, a_member, a_write_key, a_read_key, b_admin, b_member, anonymous."""
        client = APIClient()
        users = {
            "operator": self.operator,
            "a_admin": self.a.admin,
            "a_member": self.a.member,
            "b_admin": self.b.admin,
            "b_member": self.b.member,
        }
        if who in users:
            client.force_authenticate(user=users[who])
        elif who == "a_write_key":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.a.raw_key}")
        elif who == "a_read_key":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.a_read_key_raw}")
        elif who != "anonymous":
            raise ValueError(who)
        return client


@pytest.fixture
def world(operator, tenant_a, tenant_b) -> World:
    _, raw = api_key_create(tenant=tenant_a.tenant, name="a read-only", scopes=["read"])
    return World(operator=operator, a=tenant_a, b=tenant_b, a_read_key_raw=raw)
