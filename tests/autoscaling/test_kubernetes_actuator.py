"""The Kubernetes actuator against a recorded API contract: scale subresource, pod registration, drained-pod
choice by deletion cost, restart by pod deletion, the warm pool (a standby Deployment whose pods are promoted by
relabelling), API errors surfaced as ActuatorError."""

import copy
import json
import sys
from pathlib import Path

import httpx
import pytest

from capacity.autoscaling import services, ticks
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.kubernetes import KubernetesActuator
from capacity.autoscaling.actuators.kubernetes_objects import DELETION_COST
from endpoints.models import Endpoint, ReplicaState

CONTRACT = json.loads((Path(__file__).parent / "contracts" / "kubernetes.json").read_text())
SCALE_PATH = "/apis/apps/v1/namespaces/infer/deployments/llama-13b/scale"
STANDBY_SCALE_PATH = "/apis/apps/v1/namespaces/infer/deployments/llama-13b-standby/scale"
PODS_PATH = "/api/v1/namespaces/infer/pods"
SELECTOR = CONTRACT["scale"]["status"]["selector"]  # app=llama-13b,infercap/role=replica
# The standby Deployment: the recorded scale shape with its own name and selector (same template, role=standby).
STANDBY_SELECTOR = SELECTOR.replace("infercap/role=replica", "infercap/role=standby")


def matches(selector: str, labels: dict) -> bool:
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


class FakeCluster:
    """Answers like the API server (shapes from the recorded contract) and records every request."""

    def __init__(self):
        self.replicas = 1
        self.standby_replicas = 0
        self.pods: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.refuse_patch = False

    @property
    def scales(self):
        return {SCALE_PATH: ("replicas", SELECTOR), STANDBY_SCALE_PATH: ("standby_replicas", STANDBY_SELECTOR)}

    def add_pod(self, name, *, phase="Running", ready=True, ip="10.42.0.17", role="replica"):
        pod = copy.deepcopy(CONTRACT["pod"])
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["infercap/role"] = role
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
        if path in self.scales:
            attr, selector = self.scales[path]
            if request.method == "PATCH":
                setattr(self, attr, body["spec"]["replicas"])
            scale = copy.deepcopy(CONTRACT["scale"])
            scale["metadata"]["name"] = path.split("/")[-2]
            scale["spec"]["replicas"] = scale["status"]["replicas"] = getattr(self, attr)
            scale["status"]["selector"] = selector
            return httpx.Response(200, json=scale)
        if path == PODS_PATH and request.method == "GET":
            selector = request.url.params["labelSelector"]
            assert selector in (SELECTOR, STANDBY_SELECTOR)
            listing = copy.deepcopy(CONTRACT["podList"])
            listing["items"] = [p for p in self.pods.values() if matches(selector, p["metadata"]["labels"])]
            return httpx.Response(200, json=listing)
        if path.startswith(PODS_PATH + "/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.pods:
                return httpx.Response(404, json={"kind": "Status", "message": f'pods "{name}" not found', "code": 404})
            if request.method == "PATCH":
                meta = self.pods[name]["metadata"]
                for key in ("annotations", "labels"):
                    meta.setdefault(key, {}).update(body["metadata"].get(key, {}))
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


def test_warm_pool_standby_pods_are_promoted_by_relabelling(db, cluster, k8s, endpoint, monkeypatch):
    Endpoint.objects.filter(pk=endpoint.pk).update(warm_pool_size=2, desired_replicas=1)
    endpoint.refresh_from_db()
    monkeypatch.setattr(services, "get_actuator", lambda e: k8s)
    cluster.add_pod("llama-13b-a", ip="10.42.0.17")
    k8s.sync(endpoint)
    # The warm pool is the standby Deployment, scaled through its own scale subresource
    assert "warm pool" in " ".join(services.reconcile(endpoint=endpoint))
    assert cluster.standby_replicas == 2 and cluster.replicas == 1
    assert ("PATCH", STANDBY_SCALE_PATH, {"spec": {"replicas": 2}}) in cluster.requests
    # Its pods register as standby replicas: ready, but neither capacity nor routed
    cluster.add_pod("llama-13b-standby-x", ip="10.42.1.1", role="standby")
    cluster.add_pod("llama-13b-standby-y", ip="10.42.1.2", role="standby")
    services.reconcile(endpoint=endpoint)
    standby = {r.name: r for r in endpoint.replicas.filter(is_standby=True)}
    assert set(standby) == {"llama-13b-standby-x", "llama-13b-standby-y"}
    assert {r.state for r in standby.values()} == {ReplicaState.READY}
    inputs = ticks.horizontal_inputs(endpoint, now=0.0)
    assert (inputs.ready, inputs.starting) == (1, 0)  # standbys are not capacity until promoted
    assert cluster.standby_replicas == 2 and cluster.replicas == 1  # a full pool: nothing more launched

    # Scale-up promotes a standby instead of cold-starting: its pod is relabelled into the serving set
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=2)
    endpoint.refresh_from_db()
    actions = services.reconcile(endpoint=endpoint)
    assert "promoted standby llama-13b-standby-x" in actions
    assert (
        "PATCH",
        f"{PODS_PATH}/llama-13b-standby-x",
        {"metadata": {"labels": {"infercap/role": "replica", "infercap/promoted": "true"}}},
    ) in cluster.requests
    promoted = endpoint.replicas.get(name="llama-13b-standby-x")
    assert not promoted.is_standby and promoted.state == ReplicaState.READY
    assert cluster.replicas == 1  # the serving Deployment was not scaled: the promoted pod is the new replica
    assert ticks.horizontal_inputs(endpoint, now=0.0).ready == 2
    # The standby ReplicaSet releases the relabelled pod and starts a replacement: the pool refills by itself
    cluster.add_pod("llama-13b-standby-z", phase="Pending", ready=False, role="standby")
    services.reconcile(endpoint=endpoint)
    assert cluster.standby_replicas == 2 and cluster.replicas == 1
    promoted.refresh_from_db()
    assert not promoted.is_standby and promoted.state == ReplicaState.READY
    assert endpoint.replicas.get(name="llama-13b-standby-z").is_standby

    # A later scale-up beyond the pool counts the promoted pod: the serving Deployment grows by the shortfall only
    k8s.launch(endpoint, 1)
    assert cluster.replicas == 2
    # Scale-in of a promoted pod deletes it (no ReplicaSet owns it) and leaves the Deployment's count alone
    k8s.move(promoted, ReplicaState.DRAINING, "scale in")
    k8s.terminate([promoted], reason="drained")
    assert cluster.requests[-1] == ("DELETE", f"{PODS_PATH}/llama-13b-standby-x", None)
    assert cluster.replicas == 2
    promoted.refresh_from_db()
    assert promoted.state == ReplicaState.STOPPED


def test_api_refusals_are_actuator_errors(db, cluster, k8s, endpoint):
    cluster.refuse_patch = True
    with pytest.raises(ActuatorError, match="403 .*cannot patch resource"):
        k8s.launch(endpoint, 2)
    with pytest.raises(ActuatorError, match="403 .*cannot patch resource"):
        k8s.launch(endpoint, 1, standby=True)


def test_unreachable_api_is_an_actuator_error(db, endpoint):
    def down(request):
        raise httpx.ConnectError("connection refused", request=request)

    actuator = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(down))
    with pytest.raises(ActuatorError, match="connection refused"):
        actuator.sync(endpoint)


def test_no_api_configured_is_refused(settings, monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": ""}
    with pytest.raises(ActuatorError, match="no Kubernetes API"):
        KubernetesActuator()


EXEC_PLUGIN = """import json, sys
json.dump({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
           "status": {"token": "test-token"}}, sys.stdout)
"""


def test_a_kubeconfig_with_an_exec_plugin_authenticates_every_call(
    db, cluster, endpoint, settings, monkeypatch, tmp_path
):
    # As a cloud's kubeconfig does (aws eks get-token, gke-gcloud-auth-plugin): the token comes from a command.
    plugin = tmp_path / "get_token.py"
    plugin.write_text(EXEC_PLUGIN)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://k8s.test"}}],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": sys.executable,
                        "args": [str(plugin)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "infer"}}],
        "current-context": "ctx",
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))  # JSON is YAML
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    settings.INFERCAP = {**settings.INFERCAP, "KUBERNETES_API_URL": ""}
    actuator = KubernetesActuator(transport=httpx.MockTransport(cluster.handle))
    assert actuator.api_url == "https://k8s.test"
    assert actuator.namespace == "infer"  # the context's: where the endpoint's Deployments are looked for
    options = {k: v for k, v in endpoint.launch_options.items() if k != "namespace"}
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options=options)  # the fake cluster answers in "infer" only
    endpoint.refresh_from_db()
    cluster.add_pod("llama-13b-a", ip="10.42.0.17")
    actuator.sync(endpoint)  # the fake API server refuses any other Authorization
    assert actuator.launch(endpoint, 1) == [] and cluster.replicas == 2
    assert endpoint.replicas.get(name="llama-13b-a").state == ReplicaState.READY
