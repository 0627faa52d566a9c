# ruff: noqa: F811 - the fixtures imported from the other Kubernetes tests are parameters here
"""Room on Kubernetes per endpoint: against an API server double with mixed nodes (two GPU models, a tainted node, a
cordoned one, a GKE GPU taint, a preference taint), each endpoint counts only the nodes its pods may be bound to,
one computation per distinct requirement set; the pod templates the actuator emits carry the requirements the room
used (placement/node_requirements.py, docs/placement.md "In the ledger")."""

import kubernetes_validate
import pytest
from django.urls import reverse

from capacity.autoscaling.actuators.free_gpus import free_gpus
from capacity.autoscaling.actuators.kubernetes_objects import launch_requirements
from capacity.autoscaling.actuators.kubernetes_room import refresh_room
from capacity.autoscaling.services import pool_endpoint
from capacity.ledger import capacity_ledger
from capacity.models import HardwareProfile
from endpoints.models import Endpoint
from placement.node_requirements import GPU_PRODUCT_LABEL, Room, carries
from tests.autoscaling.test_kubernetes_gang import (
    DEPLOY,
    LWS_PATH,
    actuator,
    gang,  # noqa: F401 - a fixture
    gang_endpoint,
)
from tests.autoscaling.test_kubernetes_gang import ApiServer as DeploymentServer
from tests.autoscaling.test_kubernetes_room import ApiServer, api, node, pod, room_store  # noqa: F401
from tests.autoscaling.test_kubernetes_versions import cluster, endpoint, k8s, spot_pool  # noqa: F401 - fixtures
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory

H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
TEAM_X = {"key": "dedicated", "value": "team-x", "effect": "NoSchedule"}
LEDGER_URL = "/api/v1/capacity/ledger"


def gpu_node(name: str, product: str, *, taints: list | None = None, labels: dict | None = None, **kw) -> dict:
    body = node(name, 8, labels={GPU_PRODUCT_LABEL: product, **(labels or {})}, **kw)
    if taints:
        body["spec"]["taints"] = taints
    return body


@pytest.fixture
def mixed_cluster() -> ApiServer:
    """Six 8-GPU nodes: h100-a (4 held), h100-team-x (tainted for another team), h100-cordoned, h100-gke (GKE's GPU
    taint), h100-batch (a preference taint, labelled pool=batch), l40s-a (2 held)."""
    nodes = [
        gpu_node("h100-a", H100),
        gpu_node("h100-team-x", H100, taints=[TEAM_X]),
        gpu_node("h100-cordoned", H100, cordoned=True),
        gpu_node("h100-gke", H100, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        gpu_node(
            "h100-batch",
            H100,
            taints=[{"key": "batch", "effect": "PreferNoSchedule"}],
            labels={"pool": "batch"},
        ),
        gpu_node("l40s-a", L40S),
    ]
    return ApiServer(nodes, [pod("vllm-a", "h100-a", 4), pod("embed", "l40s-a", 2)])


@pytest.fixture
def endpoints(settings, tenant_a) -> dict[str, Endpoint]:
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_ACTUATOR": "kubernetes"}
    h100 = HardwareProfileFactory(name="h100-tp4", gpus_per_replica=4, gpu_product=H100)
    l40s = HardwareProfileFactory(name="l40s-tp1", gpus_per_replica=1, gpu_product=L40S)
    any_gpu = HardwareProfileFactory(name="any-tp4", gpus_per_replica=4)  # no product: any GPU node

    def make(name: str, hardware: HardwareProfile, options: dict | None = None) -> Endpoint:
        return EndpointFactory(
            name=name, owner_tenant=tenant_a.tenant, hardware_profile=hardware, launch_options=options or {}
        )

    return {
        "h100": make("h100", h100),
        "l40s": make("l40s", l40s),
        "any": make("any", any_gpu),
        "team-x": make(
            "team-x", h100, {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "team-x"}]}
        ),
        "batch": make("batch", h100, {"node_selector": {"pool": "batch"}}),
    }


def rows(endpoints: dict[str, Endpoint], room) -> dict[str, int | None]:
    ids = [e.pk for e in endpoints.values()]
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk__in=ids), free_gpus=room)
    return {row.endpoint: row.whole_replicas_free for row in ledger.endpoints}


def test_each_endpoint_has_room_only_on_the_nodes_its_pods_may_use(db, room_store, mixed_cluster, endpoints):
    published = refresh_room(api=api(mixed_cluster))
    assert published["label_keys"] == [GPU_PRODUCT_LABEL, "pool"], "only the labels the requirements select on"
    room = free_gpus()
    assert isinstance(room, Room) and room.free_count() == 4 + 8 + 8 + 8 + 6, "the cordoned node has none"
    assert rows(endpoints, room) == {
        # h100-a's 4 free, h100-gke's 8, h100-batch's 8; not team-x's node, not the L40S one
        "h100": 1 + 2 + 2,
        # only the L40S node, 6 free
        "l40s": 6,
        # any GPU node a pod without tolerations may use: h100-a, h100-gke, h100-batch and l40s-a (6 free)
        "any": 1 + 2 + 2 + 1,
        # the tolerating endpoint gets team-x's node too
        "team-x": 1 + 2 + 2 + 2,
        # its node selector: h100-batch only
        "batch": 2,
    }


def test_the_api_keeps_its_fields_and_a_bad_or_unread_requirement_is_unknown(
    db, room_store, mixed_cluster, endpoints, operator
):
    refresh_room(api=api(mixed_cluster))
    Endpoint.objects.filter(pk=endpoints["batch"].pk).update(launch_options={"node_selector": {"zone": "eu-1a"}})
    Endpoint.objects.filter(pk=endpoints["team-x"].pk).update(launch_options={"tolerations": "all of them"})
    response = client_for(operator).get(LEDGER_URL)
    assert response.status_code == 200
    body = {row["endpoint"]: row for row in response.json()["endpoints"]}
    assert body["h100"]["whole_replicas_free"] == 5 and body["h100"]["replica_gpus"] == 4
    # zone was not a label the last read kept: unknown until the next one, never a wrong 0
    assert body["batch"]["whole_replicas_free"] is None
    assert body["team-x"]["whole_replicas_free"] is None, "options the launch would refuse: unknown, not a 500"
    assert response.json()["total"]["free_gpus"] == 34
    refresh_room(api=api(mixed_cluster))
    assert rows({"batch": endpoints["batch"]}, free_gpus()) == {"batch": 0}, "read now: no node in that zone"


def test_a_thousand_endpoints_on_three_profiles_cost_three_computations(db, room_store, mixed_cluster, endpoints):
    tenant = endpoints["h100"].owner_tenant
    profiles = [endpoints[name].hardware_profile for name in ("h100", "l40s", "any")]
    Endpoint.objects.filter(pk__in=[endpoints["team-x"].pk, endpoints["batch"].pk]).delete()
    Endpoint.objects.exclude(pk__in=[e.pk for e in endpoints.values()]).update(hardware_profile=profiles[1])
    model = endpoints["h100"].model_profile
    Endpoint.objects.bulk_create(
        EndpointFactory.build(
            name=f"ep-{i}", owner_tenant=tenant, model_profile=model, hardware_profile=profiles[i % 3]
        )
        for i in range(1000)
    )
    refresh_room(api=api(mixed_cluster))
    room = free_gpus()
    ledger = capacity_ledger(free_gpus=room)
    assert len(ledger.endpoints) == 1004 and room.computations == 3
    by_profile = {}
    for row in ledger.endpoints:
        by_profile.setdefault(row.replica_gpus, set()).add(row.whole_replicas_free)
    assert by_profile == {4: {5, 6}, 1: {6}}


def test_the_emitted_pod_template_carries_the_requirements_the_room_used(db, room_store, tenant_a, gang, monkeypatch):
    gang("none")
    served = gang_endpoint(tenant_a, gpus=1, per_node=8, domain=8, label="kubernetes.io/hostname")
    HardwareProfile.objects.filter(pk=served.hardware_profile_id).update(gpu_product=H100)
    team_x = {"key": "dedicated", "operator": "Equal", "value": "team-x", "effect": "NoSchedule"}
    options = {**served.launch_options, "node_selector": {"pool": "inference"}, "tolerations": [team_x]}
    Endpoint.objects.filter(pk=served.pk).update(launch_options=options)
    served.refresh_from_db()
    used = []
    counted = Room.whole_groups
    monkeypatch.setattr(
        Room, "whole_groups", lambda self, needs, size: used.append(needs) or counted(self, needs, size)
    )
    nodes = [gpu_node("h100-a", H100, labels={"pool": "inference"}, taints=[TEAM_X]), gpu_node("l40s-a", L40S)]
    refresh_room(api=api(ApiServer(nodes, [])))
    assert rows({"ep": served}, free_gpus()) == {served.name: 8}
    server = DeploymentServer(served.pk)
    actuator(server).launch(served, 1)
    deployment = server.deployments[DEPLOY]
    kubernetes_validate.validate(deployment, "1.32", strict=True)
    template = deployment["spec"]["template"]
    (needs,) = used
    assert needs == launch_requirements(served) and carries(template, needs)
    assert template["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: H100, "pool": "inference"}
    assert template["spec"]["tolerations"] == [team_x]
    # Launched again from zero, the template already carries them: not written twice.
    patches = len(server.sent("PATCH", f"/apis/apps/v1/namespaces/infer/deployments/{DEPLOY}"))
    deployment["spec"]["replicas"] = 0
    actuator(server).launch(served, 1)
    assert len(server.sent("PATCH", f"/apis/apps/v1/namespaces/infer/deployments/{DEPLOY}")) == patches


def test_a_replica_larger_than_a_node_carries_them_on_the_leader_and_the_workers(db, tenant_a, gang):
    gang("kueue")
    served = gang_endpoint(tenant_a, gpus=8)  # 4-GPU trays of a 72-GPU rack: two pods
    HardwareProfile.objects.filter(pk=served.hardware_profile_id).update(gpu_product="NVIDIA-GB200")
    Endpoint.objects.filter(pk=served.pk).update(
        launch_options={**served.launch_options, "tolerations": [{"key": "rack", "operator": "Exists"}]}
    )
    served.refresh_from_db()
    server = DeploymentServer(served.pk)
    actuator(server).launch(served, 1)
    (lws,) = server.sent("POST", LWS_PATH)
    needs = launch_requirements(served)
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"][role]
        assert carries(template, needs) and template["spec"]["nodeSelector"][GPU_PRODUCT_LABEL] == "NVIDIA-GB200"


def test_a_spot_pool_carries_its_own_profiles_model_and_the_spot_selector(
    db, clean_store, cluster, k8s, endpoint, spot_pool
):
    HardwareProfile.objects.filter(pk=endpoint.hardware_profile_id).update(gpu_product=H100)
    HardwareProfile.objects.filter(pk=spot_pool.pk).update(gpu_product=L40S)
    endpoint.refresh_from_db()
    k8s.launch(pool_endpoint(endpoint, spot_pool), 1)
    created = next(body for method, _, body in cluster.requests if method == "POST")
    template = created["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {GPU_PRODUCT_LABEL: L40S, "karpenter.sh/capacity-type": "spot"}
    assert template["spec"]["tolerations"][-1] == {"key": "spot", "operator": "Exists"}
    assert carries(template, launch_requirements(pool_endpoint(endpoint, spot_pool)))
    assert launch_requirements(endpoint) != launch_requirements(pool_endpoint(endpoint, spot_pool))


def test_an_endpoints_other_pools_have_room_on_their_own_profiles_and_nodes(
    db, room_store, mixed_cluster, endpoints, operator, client
):
    """A disaggregated endpoint's prefill pool (its own profile, its launch options laid over the endpoint's), its
    spot pool (the spot profile and the default spot selector) and its fallback profile each count the nodes their
    pods may use, in their own group size; the decode row keeps its own."""
    spot_node = gpu_node("h100-spot", H100, labels={"karpenter.sh/capacity-type": "spot"})
    mixed_cluster.items["/api/v1/nodes"].append(spot_node)
    decode = endpoints["h100"]
    tp2 = HardwareProfileFactory(name="h100-tp2", gpus_per_replica=2, gpu_product=H100)
    l40s = endpoints["l40s"].hardware_profile
    Endpoint.objects.filter(pk=decode.pk).update(
        serving_mode="disaggregated",
        kv_connector="nixl",
        prefill_hardware_profile=tp2,
        prefill_launch_options={"node_selector": {"pool": "batch"}},  # the prefill pool's own nodes
        spot_hardware_profile=HardwareProfileFactory(name="h100-spot-tp4", gpus_per_replica=4, gpu_product=H100),
        fallback_hardware_profile=l40s,
    )
    published = refresh_room(api=api(mixed_cluster))
    assert "karpenter.sh/capacity-type" in published["label_keys"], "a spot pool selects on the default label"
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk=decode.pk), free_gpus=free_gpus())
    row = ledger.endpoints[0]
    # decode: h100-a's 4 free, h100-gke's 8, h100-batch's 8, h100-spot's 8 in TP-4
    assert (row.replica_gpus, row.whole_replicas_free) == (4, 1 + 2 + 2 + 2)
    pools = {pool.pool: (pool.hardware_profile, pool.replica_gpus, pool.whole_replicas_free) for pool in row.pools}
    assert pools == {
        "prefill": ("h100-tp2", 2, 4),  # h100-batch only, in TP-2
        "spot": ("h100-spot-tp4", 4, 2),  # h100-spot only
        "fallback": ("l40s-tp1", 1, 6),  # the L40S node's 6 free
    }
    body = client_for(operator).get(LEDGER_URL, {"endpoint": decode.pk}).json()
    assert {p["pool"]: p["whole_replicas_free"] for p in body["endpoints"][0]["pools"]} == {
        "prefill": 4,
        "spot": 2,
        "fallback": 6,
    }
    # The pools' requirements are the ones their launches write into their pods.
    prefill_view = pool_endpoint(Endpoint.objects.get(pk=decode.pk), None, role="prefill")
    assert dict(launch_requirements(prefill_view, spot=False).node_selector) == {
        "pool": "batch",
        GPU_PRODUCT_LABEL: H100,
    }
    client.force_login(operator)
    detail = client.get(reverse("console:endpoint", args=[decode.pk])).content.decode()
    assert 'data-pool-room="prefill">4 more whole TP-2 replicas on h100-tp2<' in detail
