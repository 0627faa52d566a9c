"""The capacity app's read-only REST resources without a case elsewhere, declared once; the checks come from
APIResourceCase: autoscaler decisions (scoped to the endpoints a tenant sees) and capacity benchmarks (catalogue
data, read by every tenant)."""

from datetime import UTC, datetime, timedelta

import pytest

from capacity.models import AutoscalerDecision, CapacityBenchmark
from tests.api.base import APIResourceCase, unique
from tests.factories import HardwareProfileFactory, ModelProfileFactory

# A fixed moment, so nothing depends on today's date.
MOMENT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def side_of(world, side):
    return world.a if side == "a" else world.b


class TestAutoscalerDecisions(APIResourceCase):
    basename = "autoscaler-decision"
    model = AutoscalerDecision
    write_access = None

    def make(self, world, side):
        return AutoscalerDecision.objects.create(
            endpoint=side_of(world, side).endpoint,
            at=MOMENT,
            axis=AutoscalerDecision.Axis.HORIZONTAL,
            current=1,
            desired=2,
            reason="queue above target",
            inputs={"in_flight": 40, "actions": ["launched 1"]},
            applied=True,
            tick=unique("h"),
        )

    def tenant_of(self, obj):
        return obj.endpoint.owner_tenant_id


class TestCapacityBenchmarks(APIResourceCase):
    basename = "capacity-benchmark"
    model = CapacityBenchmark
    write_access = None
    tenant_scoped = False

    def make(self, world, side):
        return CapacityBenchmark.objects.create(
            model_profile=ModelProfileFactory(name=unique("qwen")),
            hardware_profile=HardwareProfileFactory(name=unique("h100")),
            version=1,
            status=CapacityBenchmark.Status.SUCCEEDED,
            created_at=MOMENT,
            finished_at=MOMENT + timedelta(minutes=12),
            b_max=64,
            mu_per_min=900.0,
            throughput_table=[{"batch": 1, "tokens_per_s": 40.0}],
        )

    def run_url(self) -> str:
        return self.list_url() + "run/"

    @pytest.mark.parametrize("who", ["a_admin", "a_write_key", "a_member", "a_read_key"])
    def test_only_operators_run_a_benchmark(self, world, who):
        response = world.client(who).post(self.run_url(), {"endpoint": world.a.endpoint.pk}, format="json")
        assert response.status_code == 403, response.content

    def test_a_run_for_a_replica_of_another_endpoint_is_a_field_error(self, world):
        from tests.factories import ReplicaFactory

        replica = ReplicaFactory(endpoint=world.b.endpoint)
        client = world.client("operator")
        response = client.post(self.run_url(), {"endpoint": world.a.endpoint.pk, "replica": replica.pk}, format="json")
        assert response.status_code == 400 and "replica" in response.json(), response.content
        assert client.post(self.run_url(), {"endpoint": 10**9}, format="json").json().keys() == {"endpoint"}


def test_hardware_profiles_say_their_shape_and_refuse_an_impossible_one(world):
    from django.urls import reverse

    url = reverse("hardware-profile-list")
    body = {
        "name": "nvl72-b200",
        "gpu_type": "B200",
        "gpus_per_replica": 16,
        "gpu_memory_gb": 180,
        "memory_bandwidth_gbps": 8000,
        "gpus_per_node": 4,
        "interconnect_domain_gpus": 72,
        "domain_node_label": "nvidia.com/gpu.clique",
    }
    created = world.client("operator").post(url, body, format="json")
    assert created.status_code == 201, created.content
    fit = created.json()["replica_fit"]
    assert fit["fits"] is True and fit["nodes"] == 4  # 16 GPUs as equal shares of four 4-GPU nodes in the rack
    bad = world.client("operator").post(
        url, {**body, "name": "odd", "gpus_per_node": 8, "interconnect_domain_gpus": 3}, format="json"
    )
    assert bad.status_code == 400 and "interconnect_domain_gpus" in bad.json()
    assert world.client("a_admin").post(url, {**body, "name": "mine"}, format="json").status_code == 403
