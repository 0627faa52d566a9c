"""The Kubernetes actuator against a recorded API contract: scale subresource, pod registration, drained-pod
choice by deletion cost, restart by pod deletion, API errors surfaced as ActuatorError."""

import copy
import json
from pathlib import Path

import httpx
import pytest

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.kubernetes import DELETION_COST, KubernetesActuator
from endpoints.models import Endpoint, ReplicaState

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "kubernetes.json").read_text())
SCALE_PATH = "/apis/apps/v1/namespaces/infer/deployments/llama-13b/scale"
PODS_PATH = "/api/v1/namespaces/infer/pods"


class FakeCluster:
    """Answers like the API server (shapes from the recorded contract) and records every request."""

    def __init__(self):
        self.replicas = 1
        self.pods: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.refuse_patch = False

    def add_pod(self, name, *, phase="Running", ready=True, ip="10.42.0.17"):
        pod = copy.deepcopy(CONTRACT["pod"])
        pod["metadata"]["name"] = name
        pod["status"]["phase"] = phase
        pod["status"]["podIP"] = ip if phase != "Pending" else None
        for cond in pod["status"]["conditions"]:
            if cond["type"] in ("Ready", "ContainersReady"):
                cond["status"] = "True" if ready else "False"
        self.pods[name] = pod
        return pod

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        assert request.headers["Authorization"] == "Bearer test-token"
        path = request.url.path
        if request.method == "PATCH":
            assert request.headers["Content-Type"] == "application/merge-patch+json"
            if self.refuse_patch:
                return httpx.Response(403, json=CONTRACT["forbidden"])
        if path == SCALE_PATH:
            if request.method == "PATCH":
                self.replicas = body["spec"]["replicas"]
            scale = copy.deepcopy(CONTRACT["scale"])
            scale["spec"]["replicas"] = scale["status"]["replicas"] = self.replicas
            return httpx.Response(200, json=scale)
        if path == PODS_PATH and request.method == "GET":
            assert request.url.params["labelSelector"] == CONTRACT["scale"]["status"]["selector"]
            listing = copy.deepcopy(CONTRACT["podList"])
            listing["items"] = list(self.pods.values())
            return httpx.Response(200, json=listing)
        if path.startswith(PODS_PATH + "/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.pods:
                return httpx.Response(404, json={"kind": "Status", "message": f'pods "{name}" not found', "code": 404})
            if request.method == "PATCH":
                self.pods[name]["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
            elif request.method == "DELETE":
                self.pods[name]["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:00Z"
            return httpx.Response(200, json=self.pods[name])
        return httpx.Response(404, json={"kind": "Status", "message": "not found", "code": 404})


@pytest.fixture
def cluster():
    return FakeCluster()


@pytest.fixture
def k8s(cluster):
    return KubernetesActuator(
        api_url="https://k8s.test", token="test-token", transport=httpx.MockTransport(cluster.handle)
    )


@pytest.fixture
def endpoint(tenant_a):
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(
        launch_options={"actuator": "kubernetes", "namespace": "infer", "deployment": "llama-13b", "port": 8000}
    )
    tenant_a.endpoint.refresh_from_db()
    return tenant_a.endpoint


def test_scale_register_drain_and_restart(db, cluster, k8s, endpoint):
    # The deployment runs one pod; sync registers it
    cluster.add_pod("llama-13b-a", ip="10.42.0.17")
    k8s.sync(endpoint)
    # Scale-up goes through the scale subresource: read, then merge-patch spec.replicas
    assert k8s.launch(endpoint, 2) == []
    assert cluster.requests[-2:] == [("GET", SCALE_PATH, None), ("PATCH", SCALE_PATH, {"spec": {"replicas": 3}})]
    # Asked again before the new pods registered (the next tick), it does not overshoot
    k8s.launch(endpoint, 2)
    assert cluster.replicas == 3 and cluster.requests[-1] == ("GET", SCALE_PATH, None)
    # The ReplicaSet's pods are registered as replicas, in the state their conditions say
    cluster.add_pod("llama-13b-b", phase="Pending", ready=False)
    cluster.add_pod("llama-13b-c", ready=False, ip="10.42.0.19")
    k8s.sync(endpoint)
    rows = {r.name: r for r in endpoint.replicas.all()}
    assert {n: r.state for n, r in rows.items()} == {
        "llama-13b-a": ReplicaState.READY, "llama-13b-b": ReplicaState.STARTING, "llama-13b-c": ReplicaState.STARTING,
    }  # fmt: skip
    assert rows["llama-13b-a"].url == "http://10.42.0.17:8000" and rows["llama-13b-b"].url == ""
    assert {r.actuator for r in rows.values()} == {"kubernetes"}
    # A pod turning ready (and getting its IP) follows on the next sync
    cluster.add_pod("llama-13b-b", ip="10.42.0.18")
    k8s.sync(endpoint)
    assert endpoint.replicas.get(name="llama-13b-b").state == ReplicaState.READY

    # Scale-in removes the drained pod, not any pod: deletion cost first, then one replica fewer
    drained = endpoint.replicas.get(name="llama-13b-a")
    k8s.move(drained, ReplicaState.DRAINING, "scale in")
    k8s.terminate([drained], reason="drained")
    pod_path = f"{PODS_PATH}/llama-13b-a"
    assert cluster.requests[-3:] == [
        ("PATCH", pod_path, {"metadata": {"annotations": {DELETION_COST: "-1000"}}}),
        ("GET", SCALE_PATH, None),
        ("PATCH", SCALE_PATH, {"spec": {"replicas": 2}}),
    ]
    drained.refresh_from_db()
    assert drained.state == ReplicaState.STOPPED
    # The terminating pod is still listed for a while: it must not come back as a replica
    k8s.sync(endpoint)
    assert endpoint.replicas.filter(name="llama-13b-a").get().state == ReplicaState.STOPPED
    del cluster.pods["llama-13b-a"]

    # Restart deletes the pod; the Deployment's replacement is registered on sync
    sick = endpoint.replicas.get(name="llama-13b-c")
    k8s.restart(sick)
    assert cluster.requests[-1][:2] == ("DELETE", f"{PODS_PATH}/llama-13b-c")
    sick.refresh_from_db()
    assert sick.state == ReplicaState.STOPPED
    del cluster.pods["llama-13b-c"]
    cluster.add_pod("llama-13b-d", ip="10.42.0.20")
    k8s.sync(endpoint)
    assert endpoint.replicas.get(name="llama-13b-d").state == ReplicaState.READY

    # A pod that vanished (node lost) is closed; a failed pod is marked failed
    del cluster.pods["llama-13b-b"]
    cluster.add_pod("llama-13b-d", phase="Failed", ready=False, ip="10.42.0.20")
    k8s.sync(endpoint)
    assert endpoint.replicas.get(name="llama-13b-b").state == ReplicaState.STOPPED
    assert endpoint.replicas.get(name="llama-13b-d").state == ReplicaState.FAILED


def test_api_refusals_are_actuator_errors(db, cluster, k8s, endpoint):
    cluster.refuse_patch = True
    with pytest.raises(ActuatorError, match="403 .*cannot patch resource"):
        k8s.launch(endpoint, 2)
    with pytest.raises(ActuatorError, match="warm pool"):
        k8s.launch(endpoint, 1, standby=True)


def test_unreachable_api_is_an_actuator_error(db, endpoint):
    def down(request):
        raise httpx.ConnectError("connection refused", request=request)

    actuator = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(down))
    with pytest.raises(ActuatorError, match="connection refused"):
        actuator.sync(endpoint)


def test_no_api_configured_is_refused(settings, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": ""}
    with pytest.raises(ActuatorError, match="no Kubernetes API"):
        KubernetesActuator()
