"""Room in whole replicas on Kubernetes: the room task reads the GPU nodes and the live pods' GPU requests through the
actuator's API client (against an API server double that pages its listings and honours the field selector),
publishes them, and the ledger, its API and the console count whole TP groups in them; a refused read is unknown."""

import copy
import json
import logging
from pathlib import Path

import httpx
import pytest
import yaml
from celery.exceptions import SoftTimeLimitExceeded
from django.urls import reverse

from capacity.autoscaling import store
from capacity.autoscaling.actuators import kubernetes_room
from capacity.autoscaling.actuators.free_gpus import free_gpus
from capacity.autoscaling.actuators.kubernetes_api import KubernetesApi
from capacity.autoscaling.actuators.kubernetes_room import ROOM_KEY, refresh_room
from capacity.ledger import capacity_ledger
from endpoints.models import Endpoint
from tests.conftest import client_for
from tests.factories import EndpointFactory, HardwareProfileFactory
from workers.schedule import beat_schedule
from workers.tasks.room import room_refresh

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "kubernetes.json").read_text())
LEDGER_URL = "/api/v1/capacity/ledger"
CLIQUE = "nvidia.com/gpu.clique"


def node(name: str, gpus: int, *, labels: dict | None = None, ready: bool = True, cordoned: bool = False) -> dict:
    body = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "allocatable": {"cpu": "190", "memory": "2000Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    return body


def pod(name: str, node_name: str | None, gpus: int, *, phase: str = "Running", init_gpus: int = 0) -> dict:
    body = copy.deepcopy(CONTRACT["pod"])
    body["metadata"]["name"] = name
    body["spec"]["nodeName"] = node_name
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    if init_gpus:
        body["spec"]["initContainers"] = [{"name": "warm", "resources": {"requests": {"nvidia.com/gpu": init_gpus}}}]
    body["status"]["phase"] = phase
    return body


class ApiServer:
    """Nodes and pods of every namespace, one item a page (so the client must follow ``continue``); pods filtered by
    the ``status.phase!=`` field selector as the API server does; ``forbid`` answers 403 as a Role without nodes."""

    def __init__(self, nodes: list[dict], pods: list[dict]):
        self.items = {"/api/v1/nodes": nodes, "/api/v1/pods": pods}
        self.requests: list[httpx.Request] = []
        self.forbid = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert request.method == "GET" and request.headers["Authorization"] == "Bearer test-token"
        if self.forbid:
            message = 'nodes is forbidden: User "system:serviceaccount:infercap:infercap-autoscaler" cannot list'
            return httpx.Response(403, json={**CONTRACT["forbidden"], "message": message})
        items = list(self.items.get(request.url.path, []))
        for term in filter(None, request.url.params.get("fieldSelector", "").split(",")):
            field, _, value = term.partition("!=")
            assert field == "status.phase"
            items = [i for i in items if i["status"].get("phase") != value]
        start = int(request.url.params.get("continue") or 0)
        token = str(start + 1) if start + 1 < len(items) else ""
        return httpx.Response(200, json={"kind": "List", "metadata": {"continue": token}, "items": items[start:][:1]})


def api(server: ApiServer) -> KubernetesApi:
    return KubernetesApi(api_url="https://k8s.test", token="test-token", transport=httpx.MockTransport(server.handle))


@pytest.fixture
def room_store(clean_store):
    """A clean store, and no published room left for the tests after this one."""
    yield clean_store
    clean_store.delete(ROOM_KEY)


@pytest.fixture
def two_nodes() -> ApiServer:
    """Two 8-GPU nodes: gpu-a holds 5 (a TP-4 pod and a one-GPU one), gpu-b 4, and what must not count: a finished
    4-GPU pod on gpu-b, a pending pod on no node, a CPU node, a cordoned and a not-ready GPU node."""
    nodes = [node("gpu-a", 8), node("gpu-b", 8), node("cpu-1", 0), node("gpu-c", 8, cordoned=True),
             node("gpu-d", 8, ready=False)]  # fmt: skip
    pods = [pod("vllm-a", "gpu-a", 4), pod("embed-a", "gpu-a", 1), pod("vllm-b", "gpu-b", 2, init_gpus=4),
            pod("done-b", "gpu-b", 4, phase="Succeeded"), pod("waiting", None, 4, phase="Pending"),
            pod("web", "cpu-1", 0)]  # fmt: skip
    return ApiServer(nodes, pods)


@pytest.fixture
def on_kubernetes(settings, tenant_a):
    """Endpoints run on Kubernetes; tenant A's replicas are TP-4 pods, another endpoint's TP-1 (its launch option
    ``tensor_parallel_size`` does not make a pod ask for GPUs: the profile's count is what it requests)."""
    settings.INFERCAP = {**settings.INFERCAP, "AUTOSCALE_ACTUATOR": "kubernetes"}
    tp4 = HardwareProfileFactory(name="h100-tp4", gpus_per_replica=4)
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        hardware_profile=tp4, launch_options={"tensor_parallel_size": 2}
    )
    tp1 = EndpointFactory(name="tp1-model", owner_tenant=tenant_a.tenant,
                          hardware_profile=HardwareProfileFactory(name="l4", gpus_per_replica=1))  # fmt: skip
    return tenant_a.endpoint, tp1


def test_two_nodes_with_partial_holdings_count_whole_groups(db, room_store, two_nodes, on_kubernetes):
    tp4, tp1 = on_kubernetes
    room = refresh_room(api=api(two_nodes))
    assert room["held"] == {"gpu-a": 5, "gpu-b": 4}, "an init container's 4 GPUs are what vllm-b holds"
    assert [n["name"] for n in room["nodes"]] == ["gpu-a", "gpu-b"]
    assert sum(r.url.path == "/api/v1/nodes" for r in two_nodes.requests) == 5, "one node a page, every page read"
    cluster = free_gpus()
    assert cluster.free_count() == 7
    ledger = capacity_ledger(endpoints=Endpoint.objects.filter(pk__in=[tp4.pk, tp1.pk]), free_gpus=cluster)
    rows = {row.endpoint_id: row for row in ledger.endpoints}
    # gpu-a's 3 free GPUs hold no TP-4 replica; gpu-b's 4 hold one.
    assert (rows[tp4.pk].replica_gpus, rows[tp4.pk].whole_replicas_free) == (4, 1)
    assert (rows[tp1.pk].replica_gpus, rows[tp1.pk].whole_replicas_free) == (1, 7)
    assert ledger.total["free_gpus"] == 7


def test_the_ledger_api_and_console_show_the_clusters_room(db, room_store, two_nodes, on_kubernetes, operator, client):
    tp4, tp1 = on_kubernetes
    refresh_room(api=api(two_nodes))
    two_nodes.requests.clear()
    body = client_for(operator).get(LEDGER_URL).json()
    rows = {row["endpoint_id"]: row for row in body["endpoints"]}
    assert (rows[tp4.pk]["whole_replicas_free"], rows[tp1.pk]["whole_replicas_free"]) == (1, 7)
    assert body["total"]["free_gpus"] == 7
    client.force_login(operator)
    detail = client.get(reverse("console:endpoint", args=[tp4.pk])).content.decode()
    assert "1 more whole TP-4 replica in the free GPUs" in detail
    assert two_nodes.requests == [], "a view reads the published room, never the API server"


def test_a_rack_domain_label_lets_a_group_span_its_nodes(db, room_store, on_kubernetes):
    tp4, _ = on_kubernetes
    HardwareProfileFactory(name="gb200", gpus_per_replica=4, gpus_per_node=4, interconnect_domain_gpus=72,
                           domain_node_label=CLIQUE)  # fmt: skip
    half_used = [pod("p0", "tray-0", 2), pod("p1", "tray-1", 2)]
    rack = [node(f"tray-{i}", 4, labels={CLIQUE: "nvl72-a"}) for i in range(2)]
    refresh_room(api=api(ApiServer(rack, half_used)))
    cluster = free_gpus()
    assert set(cluster.domain_gpus) == {f"{CLIQUE}=nvl72-a"} and cluster.free_count() == 4
    row = capacity_ledger(endpoints=Endpoint.objects.filter(pk=tp4.pk), free_gpus=cluster).endpoints[0]
    assert (row.replica_gpus, row.whole_replicas_free) == (4, 1), "2 + 2 GPUs on two trays of one rack"
    refresh_room(api=api(ApiServer([node(f"tray-{i}", 4) for i in range(2)], half_used)))
    row = capacity_ledger(endpoints=Endpoint.objects.filter(pk=tp4.pk), free_gpus=free_gpus()).endpoints[0]
    assert row.whole_replicas_free == 0, "unlabelled, each node is its own domain of 4"


def test_a_refused_read_is_unknown_logged_once_and_no_500(
    db, room_store, two_nodes, on_kubernetes, host_gpus, operator, caplog
):
    host_gpus("8")  # this host's GPUs are not the cluster's: they must not stand in for it
    two_nodes.forbid = True
    with caplog.at_level(logging.WARNING, logger=kubernetes_room.__name__):
        assert "forbidden" in refresh_room(api=api(two_nodes))["unknown"]
        refresh_room(api=api(two_nodes))
    assert len([r for r in caplog.records if "room on Kubernetes unknown" in r.message]) == 1
    assert free_gpus() is None
    response = client_for(operator).get(LEDGER_URL)
    assert response.status_code == 200
    assert response.json()["total"]["free_gpus"] is None
    assert all(row["whole_replicas_free"] is None for row in response.json()["endpoints"])
    two_nodes.forbid = False
    with caplog.at_level(logging.INFO, logger=kubernetes_room.__name__):
        refresh_room(api=api(two_nodes))
    assert "room on Kubernetes readable again: 2 GPU nodes" in caplog.messages
    assert free_gpus().free_count() == 7, "readable again"


def test_an_api_server_down_is_unknown(db, room_store, on_kubernetes, settings):
    # The beat task as it runs in the worker: the API server from the settings, here a port nothing listens on.
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": "http://127.0.0.1:9"}
    assert room_refresh.delay().get()["unknown"].startswith("kubernetes API GET /api/v1/nodes")
    assert json.loads(store.client().get(ROOM_KEY))["unknown"]
    assert free_gpus() is None


def test_a_read_past_the_tasks_soft_limit_publishes_unknown(db, room_store, on_kubernetes, monkeypatch):
    def slow():
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr("workers.tasks.room.refresh_room", slow)
    assert room_refresh.delay().get()["unknown"].startswith("the nodes and pods were not read")
    assert free_gpus() is None  # null, not this host's GPUs


def test_without_kubernetes_endpoints_the_task_reads_nothing_and_the_host_counts(db, room_store, tenant_a, host_gpus):
    host_gpus("8")
    assert refresh_room() is None and room_refresh.delay().get() is None and store.client().get(ROOM_KEY) is None
    assert free_gpus().free_count() == 8
    assert beat_schedule()["capacity-room-refresh"]["task"] == "capacity.room_refresh"


def test_the_autoscalers_cluster_role_lists_nodes_and_pods():
    rbac = Path(__file__).resolve().parents[2] / "platform/kubernetes/base/rbac.yaml"
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(rbac.read_text())}
    grants = {
        (group, r, v)
        for rule in docs["ClusterRole"]["rules"]
        for group in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert grants == {("", "nodes", "list"), ("", "pods", "list")}  # nothing more, cluster-wide
    binding = docs["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": docs["ClusterRole"]["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"][0]["name"] == docs["ServiceAccount"]["metadata"]["name"]
