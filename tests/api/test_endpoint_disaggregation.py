"""A disaggregated endpoint over the REST API: the mode and the prefill pool's settings are read and written like the
rest, its prefill launch options are held to the tenants' allowlist, the prefill count moves only through the
autoscaler, another tenant sees none of it, and an attached server says which pool it serves in."""

import pytest
from django.urls import reverse

from endpoints.models import Endpoint, Replica, ReplicaRole, ReplicaState
from tenants.models import AuditEntry
from tests.factories import HardwareProfileFactory, ReplicaFactory
from tests.fake_vllm import fake_server

pytestmark = pytest.mark.django_db


def detail(endpoint):
    return reverse("endpoint-detail", args=[endpoint.pk])


def test_a_tenant_makes_its_endpoint_disaggregated_and_reads_both_pools(world):
    endpoint = world.a.endpoint
    prefill_hw = HardwareProfileFactory()
    client = world.client("a_admin")
    response = client.patch(
        detail(endpoint),
        {
            "serving_mode": "disaggregated",
            "kv_connector": "nixl",
            "pd_min_uncached_tokens": 1024,
            "prefill_hardware_profile": prefill_hw.name,
            "prefill_min_replicas": 2,
            "prefill_max_replicas": 5,
            "prefill_launch_options": {"max_model_len": 8192},
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["serving_mode"], body["kv_connector"], body["pd_min_uncached_tokens"]) == (
        "disaggregated",
        "nixl",
        1024,
    )
    assert body["prefill_hardware_profile"] == prefill_hw.pk
    # The prefill count follows its new floor at once (clamped into [min, max]); the autoscaler moves it from there.
    assert (body["prefill_min_replicas"], body["prefill_max_replicas"], body["prefill_desired_replicas"]) == (2, 5, 2)
    assert body["prefill_launch_options"] == {"max_model_len": 8192}
    endpoint.refresh_from_db()
    assert endpoint.serving_mode == "disaggregated" and endpoint.prefill_desired_replicas == 2
    entry = AuditEntry.objects.filter(action="endpoint.update", object_id=str(endpoint.pk)).latest("at")
    assert entry.detail["changes"]["serving_mode"] == ["aggregated", "disaggregated"]
    # Ready replicas are counted per pool.
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role=ReplicaRole.PREFILL)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role=ReplicaRole.DECODE)
    ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role=ReplicaRole.DECODE)
    body = client.get(detail(endpoint)).json()
    assert (body["ready_replicas"], body["ready_prefill_replicas"]) == (2, 1)
    listed = client.get(reverse("endpoint-list"), {"serving_mode": "disaggregated"}).json()
    assert [e["id"] for e in listed["results"]] == [endpoint.pk]


def test_bad_pool_settings_are_field_errors(world):
    client = world.client("a_admin")
    endpoint = world.a.endpoint
    cases = [
        ({"serving_mode": "both"}, "serving_mode"),
        ({"kv_connector": "tcp://attacker:9000"}, "kv_connector"),
        ({"prefill_min_replicas": 5, "prefill_max_replicas": 2}, "prefill_min_replicas"),
        ({"pd_min_uncached_tokens": -1}, "pd_min_uncached_tokens"),
        ({"prefill_hardware_profile": "no-such-gpu"}, "prefill_hardware_profile"),
        ({"prefill_desired_replicas": 9}, None),  # read-only: ignored, not applied
    ]
    for payload, field in cases:
        response = client.patch(detail(endpoint), payload, format="json")
        if field is None:
            assert response.status_code == 200
            endpoint.refresh_from_db()
            assert endpoint.prefill_desired_replicas != 9
            continue
        assert response.status_code == 400, (payload, response.content)
        assert field in response.json(), (payload, response.json())


@pytest.mark.parametrize(
    "options",
    [
        {"kv_transfer_config": {"kv_connector": "ExampleConnector", "shared_storage_path": "/etc"}},
        {"extra_args": ["--kv-transfer-config", "{}"]},
        {"executable": "/bin/sh"},
    ],
    ids=["kv_transfer_config", "extra_args", "executable"],
)
def test_a_tenant_cannot_slip_operator_options_into_the_prefill_pool(world, options):
    endpoint = world.a.endpoint
    for who in ("a_admin", "a_write_key"):
        response = world.client(who).patch(detail(endpoint), {"prefill_launch_options": options}, format="json")
        assert response.status_code == 400, response.content
        assert "prefill_launch_options" in response.json()
    endpoint.refresh_from_db()
    assert endpoint.prefill_launch_options == {}
    # An operator runs the machines: it may.
    ok = world.client("operator").patch(detail(endpoint), {"prefill_launch_options": {"cpus": 2}}, format="json")
    assert ok.status_code == 200, ok.content


def test_another_tenant_sees_neither_the_endpoint_nor_its_prefill_pool(world):
    endpoint = world.a.endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(serving_mode="disaggregated")
    assert world.client("b_admin").get(detail(endpoint)).status_code == 404
    replica = ReplicaFactory(endpoint=endpoint, state=ReplicaState.READY, role=ReplicaRole.PREFILL)
    assert world.client("b_admin").get(reverse("replica-detail", args=[replica.pk])).status_code == 404
    own = world.client("a_admin").get(reverse("replica-list"), {"role": "prefill"}).json()
    assert [r["id"] for r in own["results"]] == [replica.pk] and own["results"][0]["role"] == "prefill"
    assert world.client("b_admin").get(reverse("replica-list"), {"role": "prefill"}).json()["results"] == []


def test_an_attached_server_joins_the_pool_it_names(world):
    endpoint = world.a.endpoint
    post = world.client("operator").post
    with fake_server("vllm", model=endpoint.name) as url:
        refused = post(
            reverse("replica-list"), {"endpoint": endpoint.pk, "url": url, "role": "prefill"}, format="json"
        )
        assert refused.status_code == 400 and "role" in refused.json()  # an aggregated endpoint has no prefill pool
        Endpoint.objects.filter(pk=endpoint.pk).update(serving_mode="disaggregated")
        created = post(
            reverse("replica-list"), {"endpoint": endpoint.pk, "url": url, "role": "prefill"}, format="json"
        )
        assert created.status_code == 201, created.content
        assert created.json()["role"] == "prefill"
    with fake_server("vllm", model=endpoint.name) as url:
        default = post(reverse("replica-list"), {"endpoint": endpoint.pk, "url": url}, format="json")
        assert default.status_code == 201 and default.json()["role"] == "decode"
    with fake_server("vllm", model=endpoint.name) as url:
        mixed = post(reverse("replica-list"), {"endpoint": endpoint.pk, "url": url, "role": "mixed"}, format="json")
        assert mixed.status_code == 400 and "role" in mixed.json()
    assert sorted(Replica.objects.filter(endpoint=endpoint).values_list("role", flat=True)) == ["decode", "prefill"]
