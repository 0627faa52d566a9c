"""Every REST resource, declared once; the checks come from APIResourceCase."""

import pytest

from billing.models import SLO, UsageRecord
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint, Replica
from tenants.models import ApiKey, AuditEntry, CapacityReservation, Tenant, User
from tenants.services import api_key_create
from tests.api.base import APIResourceCase, unique
from tests.factories import (
    EndpointFactory,
    HardwareProfileFactory,
    ModelProfileFactory,
    ReplicaFactory,
    ReservationFactory,
    SLOFactory,
    TenantFactory,
    UsageRecordFactory,
    UserFactory,
)
from tests.fake_vllm import fake_server


def side_of(world, side):
    return world.a if side == "a" else world.b


class TestTenants(APIResourceCase):
    basename = "tenant"
    model = Tenant
    write_access = "operators"

    def make(self, world, side):
        return side_of(world, side).tenant

    def make_many(self, world, n):
        TenantFactory.create_batch(n)

    def tenant_of(self, obj):
        return obj.pk

    def create_payload(self, world):
        name = unique("Acme")
        return {"name": name, "slug": name.lower()}

    def invalid_payloads(self, world):
        return [
            ({"slug": "no-name"}, "name"),
            ({"name": "Bad slug", "slug": "not a slug!"}, "slug"),
            ({"name": world.a.tenant.name, "slug": unique("dup")}, "name"),
        ]

    def update_payload(self, world, obj):
        return {"is_active": False}


class TestUsers(APIResourceCase):
    basename = "user"
    model = User

    def make(self, world, side):
        return UserFactory(username=unique(f"{side}-user"), tenant=side_of(world, side).tenant)

    def create_payload(self, world):
        return {"username": unique("newcomer"), "password": "a-Strong-pass-9876", "role": "tenant_member"}

    def invalid_payloads(self, world):
        return [
            ({"username": ""}, "username"),
            ({"username": "bad name!"}, "username"),
            ({"username": unique("x"), "role": "chief"}, "role"),
            ({"username": unique("x"), "role": "operator"}, "role"),
            ({"username": unique("x"), "password": "123"}, "password"),
            ({"username": unique("x"), "tenant": world.b.tenant.pk}, "tenant"),
            ({"username": world.a.admin.username}, "username"),
        ]

    def update_payload(self, world, obj):
        # Not the email: only its owner or an operator changes that (tests/api/test_email_and_password_lockout.py).
        return {"first_name": "Changed", "role": "tenant_admin"}

    def writers(self):
        return ["a_admin"]  # people only: API keys never manage accounts

    def tenant_readonly(self):
        return ["a_member", "a_read_key", "a_write_key"]


class TestApiKeys(APIResourceCase):
    basename = "api-key"
    model = ApiKey
    supports_delete = False  # keys are revoked, never deleted: usage keeps pointing at them

    def make(self, world, side):
        return api_key_create(tenant=side_of(world, side).tenant, name=unique("key"))[0]

    def create_payload(self, world):
        return {"name": unique("ci"), "scopes": ["inference", "read"], "max_priority": "standard"}

    def invalid_payloads(self, world):
        return [
            ({"scopes": ["inference"]}, "name"),
            ({"name": "x", "scopes": ["root"]}, "scopes"),
            ({"name": "x", "scopes": []}, "scopes"),
            ({"name": "x", "scopes": "read"}, "scopes"),
            ({"name": "x", "max_priority": "urgent"}, "max_priority"),
            ({"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
            ({"name": "x", "expires_at": "next tuesday"}, "expires_at"),
            ({"name": "x", "tenant": world.b.tenant.pk}, "tenant"),
        ]

    def update_payload(self, world, obj):
        return {"name": "renamed", "max_priority": "sheddable"}


class TestReservations(APIResourceCase):
    basename = "reservation"
    model = CapacityReservation
    write_access = "operators"

    def make(self, world, side):
        return ReservationFactory(tenant=side_of(world, side).tenant, endpoint=EndpointFactory())

    def create_payload(self, world):
        endpoint = EndpointFactory()
        ReplicaFactory.create_batch(2, endpoint=endpoint)  # capacity to sell from, whatever the overcommit rule
        return {"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": 50.0, "priority": "critical"}

    def invalid_payloads(self, world):
        endpoint = EndpointFactory()
        return [
            ({"endpoint": endpoint.pk, "mu_per_min": 10}, "tenant"),
            ({"tenant": world.a.tenant.pk, "mu_per_min": 10}, "endpoint"),
            ({"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": -5}, "mu_per_min"),
            ({"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": "many"}, "mu_per_min"),
            ({"tenant": world.a.tenant.pk, "endpoint": endpoint.pk, "mu_per_min": 1, "priority": "vip"}, "priority"),
            ({"tenant": world.a.tenant.pk, "endpoint": 10**9, "mu_per_min": 1}, "endpoint"),
            # Tenant A already holds one on its own endpoint.
            ({"tenant": world.a.tenant.pk, "endpoint": world.a.endpoint.pk, "mu_per_min": 1}, "endpoint"),
        ]

    def update_payload(self, world, obj):
        return {"burst_minutes": 2.5, "rpm_limit": 600}


class TestEndpoints(APIResourceCase):
    basename = "endpoint"
    model = Endpoint

    def make(self, world, side):
        return EndpointFactory(owner_tenant=side_of(world, side).tenant)

    def tenant_of(self, obj):
        return obj.owner_tenant_id

    def create_payload(self, world):
        return {
            "name": unique("llama-13b-chat"),
            "model_profile": ModelProfileFactory().pk,
            "hardware_profile": HardwareProfileFactory().pk,
            "runtime": "sim",
            "min_replicas": 1,
            "max_replicas": 3,
            "launch_options": {"speed": 10},
        }

    def invalid_payloads(self, world):
        good = self.create_payload(world)
        return [
            ({**good, "name": "has spaces"}, "name"),
            ({**good, "name": world.a.endpoint.name}, "name"),
            ({key: value for key, value in good.items() if key != "model_profile"}, "model_profile"),
            ({**good, "hardware_profile": 10**9}, "hardware_profile"),
            ({**good, "runtime": "docker"}, "runtime"),
            ({**good, "min_replicas": 5, "max_replicas": 2}, "min_replicas"),
            ({**good, "min_replicas": -1}, "min_replicas"),
            ({**good, "concurrency_min": 8, "concurrency_max": 16, "concurrency_limit": 64}, "concurrency_limit"),
            ({**good, "launch_options": ["--tp", "2"]}, "launch_options"),
            ({**good, "launch_options": {"actuator": "teleport"}}, "launch_options"),
            ({**good, "routing_policy": "random"}, "routing_policy"),
            ({**good, "ttft_slo_ms": 0}, "ttft_slo_ms"),
        ]

    def update_payload(self, world, obj):
        return {"max_replicas": 6, "routing_policy": "least_request", "ttft_slo_ms": 1500}

    @pytest.mark.parametrize(
        "options",
        [
            {"actuator": "kubernetes", "deployment": "tenant-b-llama"},
            {"namespace": "kube-system"},
            {"cpus": 64},
            {"extra_args": ["--trust-remote-code"]},
        ],
    )
    def test_tenant_cannot_set_placement_launch_options(self, world, options):
        """Where and how replicas run is the operators' call: a tenant naming another tenant's Deployment would scale it."""
        mine = self.make(world, "a")
        before = dict(mine.launch_options)
        for who in ("a_admin", "a_write_key"):
            client = world.client(who)
            response = client.patch(self.detail_url(mine), {"launch_options": {**before, **options}}, format="json")
            assert response.status_code == 400, (who, response.content)
            assert "only operators may set" in str(response.json()["launch_options"])
            created = client.post(
                self.list_url(), {**self.create_payload(world), "launch_options": options}, format="json"
            )
            assert created.status_code == 400, (who, created.content)
        mine.refresh_from_db()
        assert mine.launch_options == before
        # The operator may; and a tenant may resend the options it has, or change the ones it owns (speed).
        operator = world.client("operator").patch(
            self.detail_url(mine), {"launch_options": {**before, "cpus": 2}}, format="json"
        )
        assert operator.status_code == 200, operator.content
        placed = operator.json()["launch_options"]
        again = world.client("a_admin").patch(self.detail_url(mine), {"launch_options": placed}, format="json")
        assert again.status_code == 200, again.content
        changed = world.client("a_admin").patch(
            self.detail_url(mine), {"launch_options": {**placed, "speed": 5}}, format="json"
        )
        assert changed.status_code == 200, changed.content


class TestReplicas(APIResourceCase):
    """Operators attach a running vLLM server; nobody edits or deletes a replica over the API (the actuators and
    the lifecycle do). The attach checks themselves: tests/api/test_replica_attach.py."""

    basename = "replica"
    model = Replica
    write_access = "operators"
    supports_delete = False
    test_writer_updates = test_reader_cannot_update = test_other_tenants_object_cannot_be_changed = None

    @pytest.fixture(autouse=True)
    def _vllm_server(self):
        with fake_server("vllm", model="a-model") as url:
            self.vllm_url = url
            yield

    def create_payload(self, world):
        return {"endpoint": world.a.endpoint.pk, "url": self.vllm_url}

    def invalid_payloads(self, world):
        endpoint = world.a.endpoint.pk
        return [
            ({"endpoint": endpoint}, "url"),
            ({"url": self.vllm_url}, "endpoint"),
            ({"endpoint": endpoint, "url": "ftp://127.0.0.1/"}, "url"),
            ({"endpoint": world.b.endpoint.pk, "url": self.vllm_url}, "url"),  # serves a-model, not b-model
            ({"endpoint": endpoint, "url": self.vllm_url, "concurrency_limit": 0}, "concurrency_limit"),
        ]

    def make(self, world, side):
        return ReplicaFactory(endpoint=side_of(world, side).endpoint)

    def tenant_of(self, obj):
        return obj.endpoint.owner_tenant_id


class TestHardwareProfiles(APIResourceCase):
    basename = "hardware-profile"
    model = HardwareProfile
    write_access = "operators"
    tenant_scoped = False

    def make(self, world, side):
        return HardwareProfileFactory(name=unique("h100"))

    def make_many(self, world, n):
        for _ in range(n):
            self.make(world, "a")

    def create_payload(self, world):
        return {
            "name": unique("h100-sxm"),
            "gpu_type": "H100-80GB",
            "gpus_per_replica": 2,
            "gpu_memory_gb": 80,
            "memory_bandwidth_gbps": 3350,
            "usd_per_gpu_hour": 4.0,
        }

    def invalid_payloads(self, world):
        good = self.create_payload(world)
        return [
            ({**good, "name": ""}, "name"),
            ({**good, "gpus_per_replica": 0}, "gpus_per_replica"),
            ({**good, "gpu_memory_gb": "lots"}, "gpu_memory_gb"),
            ({**good, "usd_per_gpu_hour": -1}, "usd_per_gpu_hour"),
            ({key: value for key, value in good.items() if key != "gpu_type"}, "gpu_type"),
        ]

    def update_payload(self, world, obj):
        return {"usd_per_gpu_hour": 3.25}


class TestModelProfiles(APIResourceCase):
    basename = "model-profile"
    model = ModelProfile
    write_access = "operators"
    tenant_scoped = False

    def make(self, world, side):
        return ModelProfileFactory(name=unique("qwen"))

    def create_payload(self, world):
        return {
            "name": unique("qwen3-32b"),
            "parameters_b": 32,
            "n_layers": 64,
            "n_kv_heads": 8,
            "d_head": 128,
            "dtype_bytes": 2,
            "weights_gb": 64,
            "alpha": 0.001,
            "beta": 0.004,
            "gamma": 0.02,
            "mu_per_min": 900,
        }

    def invalid_payloads(self, world):
        good = self.create_payload(world)
        return [
            ({**good, "name": ModelProfileFactory().name}, "name"),
            ({**good, "n_layers": 0}, "n_layers"),
            ({**good, "beta": -0.1}, "beta"),
            ({**good, "weights_gb": None}, "weights_gb"),
            ({key: value for key, value in good.items() if key != "d_head"}, "d_head"),
        ]

    def update_payload(self, world, obj):
        return {"alpha": 0.002, "mu_per_min": 1200.0}


class TestSLOs(APIResourceCase):
    basename = "slo"
    model = SLO

    def make(self, world, side):
        actors = side_of(world, side)
        return SLOFactory(endpoint=actors.endpoint, tenant=actors.tenant)

    def create_payload(self, world):
        return {
            "name": unique("ttft-p99"),
            "endpoint": world.a.endpoint.pk,
            "tenant": world.a.tenant.pk,
            "sli": "ttft",
            "objective": 0.99,
            "ttft_ms": 1500,
        }

    def invalid_payloads(self, world):
        good = self.create_payload(world)
        return [
            ({**good, "name": ""}, "name"),
            ({**good, "objective": 1.5}, "objective"),
            ({**good, "sli": "vibes"}, "sli"),
            ({**good, "period_days": 0}, "period_days"),
            ({**good, "endpoint": world.b.endpoint.pk}, "endpoint"),
            ({**good, "tenant": world.b.tenant.pk}, "tenant"),
            ({**good, "tenant": None}, "tenant"),  # endpoint-wide SLOs are the operators'
        ]

    def update_payload(self, world, obj):
        return {"objective": 0.995, "enabled": False}


class TestUsage(APIResourceCase):
    basename = "usage-record"
    model = UsageRecord
    write_access = None

    def make(self, world, side):
        actors = side_of(world, side)
        return UsageRecordFactory(tenant=actors.tenant, endpoint=actors.endpoint, api_key=actors.key)


class TestAudit(APIResourceCase):
    basename = "audit-entry"
    model = AuditEntry
    write_access = None

    def make(self, world, side):
        tenant = side_of(world, side).tenant
        return AuditEntry.objects.create(
            tenant=tenant, action="test.touch", object_type="tenant", object_id=str(tenant.pk)
        )
