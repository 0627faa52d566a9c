"""Endpoint versions on Kubernetes: one Deployment per version, against the recorded API shapes (pods and scale in
contracts/kubernetes.json, the Deployment object in contracts/kubernetes_deployment.json).

The fake API server below keeps Deployments and their pods (a scale PATCH creates or removes pods like the
ReplicaSet would, the pod with the lowest deletion cost first) and records every request, so a rollout's ticks can
be checked call by call."""

import copy
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from capacity.autoscaling import services as autoscaling
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.base import version_endpoint
from capacity.autoscaling.actuators.kubernetes import KubernetesActuator
from capacity.autoscaling.actuators.kubernetes_objects import CAPACITY, DELETION_COST, VERSION
from endpoints.models import Endpoint, EndpointVersion, Replica, ReplicaState, RolloutState
from endpoints.rollouts import services
from endpoints.rollouts import ticks as rollout_ticks

CONTRACTS = Path(__file__).parent / "contracts"
PODS = json.loads((CONTRACTS / "kubernetes.json").read_text())
DEPLOYMENTS = json.loads((CONTRACTS / "kubernetes_deployment.json").read_text())
NS = "/apis/apps/v1/namespaces/infer/deployments"
PODS_PATH = "/api/v1/namespaces/infer/pods"


def selector_string(match_labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def matches(selector: str, labels: dict) -> bool:
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


class Cluster:
    """Deployments, their pods and every request, answering in the recorded shapes."""

    def __init__(self):
        self.deployments: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.scale_history: list[dict[str, int]] = []
        self._serial = iter(range(10, 250))  # pod names and IPs

    def deployment(self, name: str, body: dict | None = None) -> dict:
        dep = copy.deepcopy(body or DEPLOYMENTS["deployment"])
        dep["metadata"]["name"] = name
        dep["spec"]["replicas"] = 0
        self.deployments[name] = dep
        return dep

    def replicas(self, name: str) -> int:
        return self.deployments[name]["spec"]["replicas"] if name in self.deployments else 0

    def _scale(self, name: str, replicas: int) -> None:
        dep = self.deployments[name]
        dep["spec"]["replicas"] = replicas
        mine = [p for p in self.pods.values() if p["owner"] == name]
        for _ in range(len(mine), replicas):
            serial = next(self._serial)
            pod = copy.deepcopy(PODS["pod"])
            pod_name = f"{name}-7d9f8c6b5-{serial:05d}"
            pod["metadata"]["name"] = pod_name
            pod["metadata"]["labels"] = {**dep["spec"]["template"]["metadata"]["labels"], "pod-template-hash": "x"}
            pod["status"]["podIP"] = f"10.42.0.{serial}"
            pod["owner"] = name
            self.pods[pod_name] = pod
        cost = lambda p: int((p["metadata"].get("annotations") or {}).get(DELETION_COST, "0"))  # noqa: E731
        for pod in sorted(mine, key=cost)[: max(0, len(mine) - replicas)]:
            del self.pods[pod["metadata"]["name"]]
        self.scale_history.append({n: d["spec"]["replicas"] for n, d in self.deployments.items()})

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        method, path = request.method, request.url.path
        self.requests.append((method, path, body))
        if path == NS and method == "POST":
            name = body["metadata"]["name"]
            if name in self.deployments:
                return httpx.Response(409, json=DEPLOYMENTS["alreadyExists"])
            return httpx.Response(201, json=self.deployment(name, body))
        if path.startswith(NS + "/"):
            name, _, sub = path[len(NS) + 1 :].partition("/")
            if name not in self.deployments:
                return httpx.Response(404, json=DEPLOYMENTS["notFound"])
            dep = self.deployments[name]
            if sub == "scale":
                if method == "PATCH":
                    self._scale(name, body["spec"]["replicas"])
                scale = copy.deepcopy(PODS["scale"])
                scale["metadata"]["name"] = name
                scale["spec"]["replicas"] = scale["status"]["replicas"] = dep["spec"]["replicas"]
                scale["status"]["selector"] = selector_string(dep["spec"]["selector"]["matchLabels"])
                return httpx.Response(200, json=scale)
            if method == "DELETE":
                del self.deployments[name]
                for pod_name in [n for n, p in self.pods.items() if p["owner"] == name]:
                    del self.pods[pod_name]
                return httpx.Response(200, json=DEPLOYMENTS["deleted"])
            if method == "PATCH":  # the launch environment (strategic merge): recorded, not applied here
                assert request.headers["Content-Type"] == "application/strategic-merge-patch+json"
            return httpx.Response(200, json={k: v for k, v in dep.items()})
        if path == PODS_PATH and method == "GET":
            selector = request.url.params["labelSelector"]
            listing = copy.deepcopy(PODS["podList"])
            listing["items"] = [
                {k: v for k, v in p.items() if k != "owner"}
                for p in self.pods.values()
                if matches(selector, p["metadata"]["labels"])
            ]
            return httpx.Response(200, json=listing)
        if path.startswith(PODS_PATH + "/") and method == "PATCH":
            pod = self.pods.get(path.rsplit("/", 1)[1])
            if pod is None:
                return httpx.Response(404, json={"kind": "Status", "message": "pod not found", "code": 404})
            pod["metadata"].setdefault("annotations", {}).update(body["metadata"].get("annotations", {}))
            return httpx.Response(200, json=pod)
        return httpx.Response(404, json={"kind": "Status", "message": "not found", "code": 404})

    def calls(self, since: int = 0) -> list[tuple[str, str]]:
        return [(m, p) for m, p, _ in self.requests[since:]]


@pytest.fixture
def cluster():
    c = Cluster()
    c.deployment("llama-13b")
    c._scale("llama-13b", 2)
    return c


@pytest.fixture
def k8s(cluster, monkeypatch):
    actuator = KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(cluster.handle))
    monkeypatch.setattr("capacity.autoscaling.actuators.get_actuator", lambda endpoint: actuator)
    monkeypatch.setattr(autoscaling, "get_actuator", lambda endpoint: actuator)
    # drained pods are idle at once (no /metrics to scrape here); new pods pass their warm-up completion
    monkeypatch.setattr(autoscaling, "_in_flight", lambda replica: 0)
    monkeypatch.setattr(autoscaling, "DRAIN_GRACE_S", 0.0)
    monkeypatch.setattr(rollout_ticks, "warm_up_request", lambda url, model: (True, ""))
    return actuator


@pytest.fixture
def endpoint(tenant_a, k8s):
    options = {"actuator": "kubernetes", "namespace": "infer", "deployment": "llama-13b", "port": 8000}
    Endpoint.objects.filter(pk=tenant_a.endpoint.pk).update(launch_options=options, desired_replicas=2)
    endpoint = tenant_a.endpoint
    endpoint.refresh_from_db()
    services.ensure_current_version(endpoint)
    k8s.sync(endpoint)
    assert endpoint.replicas.filter(state=ReplicaState.READY, version=endpoint.current_version).count() == 2
    return endpoint


def drive(rollout, cluster, ticks: int = 40) -> list[int]:
    """Tick until the rollout ends; the replicas the cluster runs (all Deployments) after each tick."""
    running = []
    for _ in range(ticks):
        rollout_ticks.rollout_tick(rollout_id=rollout.pk)
        running.append(sum(cluster.replicas(n) for n in cluster.deployments))
        rollout.refresh_from_db()
        if rollout.state in (RolloutState.SUCCEEDED, RolloutState.ROLLED_BACK, RolloutState.FAILED):
            return running
    raise AssertionError(f"rollout stuck in {rollout.state}: {list(rollout.events.values_list('message', flat=True))}")


def test_a_rollout_runs_the_new_version_in_its_own_deployment_and_retires_the_old(
    db, clean_store, cluster, k8s, endpoint
):
    v1 = endpoint.current_version
    v2 = services.create_version(endpoint=endpoint, launch_options={**endpoint.launch_options, "cpus": 8})
    rollout = services.start_rollout(endpoint=endpoint, to_version=v2, max_surge=1)  # no longer refused
    mark = len(cluster.requests)
    rollout_ticks.rollout_tick(rollout_id=rollout.pk)
    # The first tick syncs the serving Deployment, creates the new version's Deployment from it and scales it to 1
    calls = cluster.calls(mark)
    assert calls[-6:] == [
        ("GET", f"{NS}/llama-13b-v2"),  # 404: not there yet
        ("GET", f"{NS}/llama-13b"),  # the template
        ("POST", NS),
        ("GET", f"{NS}/llama-13b-v2/scale"),
        ("PATCH", f"{NS}/llama-13b-v2"),  # the version's CPU allotment, while it has no pods
        ("PATCH", f"{NS}/llama-13b-v2/scale"),
    ]
    assert ("PATCH", f"{NS}/llama-13b/scale") not in calls  # the old version is not touched
    created = next(b for m, p, b in cluster.requests if m == "POST")
    assert created["metadata"]["name"] == "llama-13b-v2" and created["metadata"]["labels"][VERSION] == "2"
    assert created["spec"]["replicas"] == 0
    assert created["spec"]["selector"]["matchLabels"] == {"app": "llama-13b", "infercap/role": "replica", VERSION: "2"}
    assert created["spec"]["template"]["metadata"]["labels"][VERSION] == "2"
    assert created["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.11.0"
    cpu = cluster.requests[-2][2]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert cpu == {"requests": {"cpu": "8000m"}, "limits": {"cpu": "8000m"}}
    assert cluster.requests[-1][2] == {"spec": {"replicas": 1}}

    running = drive(rollout, cluster)
    assert rollout.state == RolloutState.SUCCEEDED, rollout.reason
    assert max(running) == 3  # 2 old + a surge of 1, never more
    # the new pods were registered with their version; the old version drained one pod at a time
    new = Replica.objects.filter(endpoint=endpoint, version=v2, state=ReplicaState.READY)
    assert new.count() == 2 and all(r.name.startswith("llama-13b-v2-") for r in new)
    assert not Replica.objects.filter(endpoint=endpoint, version=v1).exclude(state=ReplicaState.STOPPED).exists()

    def patches(name):
        return [b["spec"]["replicas"] for m, p, b in cluster.requests if (m, p) == ("PATCH", f"{NS}/{name}/scale")]

    assert patches("llama-13b") == [1, 0] and patches("llama-13b-v2") == [1, 2]
    # the template Deployment stays, at 0 replicas: the next version is copied from it
    assert cluster.replicas("llama-13b") == 0 and "llama-13b" in cluster.deployments

    # A second rollout: v3 in llama-13b-v3; once v2's last pod is gone its Deployment is deleted
    v3 = services.create_version(endpoint=endpoint, launch_options={**endpoint.launch_options, "cpus": 4})
    endpoint.refresh_from_db()
    rollout = services.start_rollout(endpoint=endpoint, to_version=v3, max_surge=2)
    running = drive(rollout, cluster)
    assert rollout.state == RolloutState.SUCCEEDED, rollout.reason
    assert max(running) == 4
    assert ("DELETE", f"{NS}/llama-13b-v2") in cluster.calls()
    assert set(cluster.deployments) == {"llama-13b", "llama-13b-v3"} and cluster.replicas("llama-13b-v3") == 2
    assert Replica.objects.filter(endpoint=endpoint, version=v3, state=ReplicaState.READY).count() == 2
    # the autoscaler now scales llama-13b-v3; a warm pool (a copy of the template, version 1) is refused
    endpoint.refresh_from_db()
    k8s.launch(endpoint, 1)
    assert cluster.replicas("llama-13b-v3") == 3 and cluster.replicas("llama-13b") == 0
    with pytest.raises(ActuatorError, match="warm pool .* not the serving version's \\(llama-13b-v3\\)"):
        k8s.launch(endpoint, 1, standby=True)


def test_a_rolled_back_version_is_scaled_down_and_its_deployment_deleted(db, clean_store, cluster, k8s, endpoint):
    v2 = services.create_version(endpoint=endpoint, launch_options={**endpoint.launch_options, "cpus": 8})
    rollout = services.start_rollout(
        endpoint=endpoint, to_version=v2, strategy="canary", canary_steps=[50, 100], step_duration_s=600, max_surge=2
    )
    rollout_ticks.rollout_tick(rollout_id=rollout.pk)  # llama-13b-v2 created, scaled to 2
    assert cluster.replicas("llama-13b-v2") == 2
    rollout_ticks.rollout_tick(rollout_id=rollout.pk)  # its pods registered and warmed: 50 %, one old pod drains
    rollout_ticks.rollout_tick(rollout_id=rollout.pk)  # the drained old pod is removed
    rollout.refresh_from_db()
    assert (rollout.state, rollout.traffic_percent) == (RolloutState.SHIFTING, 50)
    assert cluster.replicas("llama-13b") == 1
    services.rollback_rollout(rollout=rollout, reason="wrong model")
    drive(rollout, cluster)
    assert rollout.state == RolloutState.ROLLED_BACK
    # the old version was scaled back up to where it started; the new version's Deployment is gone
    assert cluster.replicas("llama-13b") == 2
    assert "llama-13b-v2" not in cluster.deployments and ("DELETE", f"{NS}/llama-13b-v2") in cluster.calls()
    assert endpoint.replicas.filter(state=ReplicaState.READY, version=endpoint.current_version).count() == 2
    assert not endpoint.replicas.filter(version=v2).exclude(state=ReplicaState.STOPPED).exists()


def test_the_template_listing_leaves_out_the_pods_of_version_deployments(db, clean_store, cluster, k8s, endpoint):
    v2 = services.create_version(endpoint=endpoint, launch_options={**endpoint.launch_options, "cpus": 8})
    k8s.launch(version_endpoint(endpoint, v2), 1)
    # the template's selector matches the -v2 pod too (its labels are a superset), but it is not version 1's
    k8s.sync(endpoint)
    assert not endpoint.replicas.filter(name__startswith="llama-13b-v2-").exists()
    assert endpoint.replicas.filter(state=ReplicaState.READY).count() == 2
    # once version 2 is in play (a rollout), its Deployment is listed and the pod registered as version 2
    services.start_rollout(endpoint=endpoint, to_version=v2)
    k8s.sync(endpoint)
    pod = endpoint.replicas.get(name__startswith="llama-13b-v2-")
    assert pod.version == v2 and pod.state == ReplicaState.READY


@pytest.fixture
def spot_pool(endpoint):
    from capacity.models import HardwareProfile
    from tests.factories import HardwareProfileFactory

    pool = HardwareProfileFactory(
        name="a100-spot",
        gpu_type=endpoint.hardware_profile.gpu_type,
        capacity_type=HardwareProfile.CapacityType.SPOT,
        usd_per_gpu_hour=0.9,
    )
    options = {**endpoint.launch_options, "spot_tolerations": [{"key": "spot", "operator": "Exists"}]}
    set_launch_options(endpoint, options)
    Endpoint.objects.filter(pk=endpoint.pk).update(spot_hardware_profile=pool)
    endpoint.refresh_from_db()
    return pool


def set_launch_options(endpoint, options: dict) -> None:
    """The operators' launch options, on the endpoint and the version it serves (which a launch reads)."""
    Endpoint.objects.filter(pk=endpoint.pk).update(launch_options=options)
    EndpointVersion.objects.filter(pk=endpoint.current_version_id).update(launch_options=options)
    endpoint.refresh_from_db()


def unschedulable(pod: dict, *, minutes_ago: float) -> None:
    """The pod as the API server shows one no node fits: Pending, PodScheduled False for reason Unschedulable."""
    since = time.time() - minutes_ago * 60
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
                "lastProbeTime": None,
                "lastTransitionTime": datetime.fromtimestamp(since, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
    }


def test_a_spot_pool_runs_in_its_own_deployment_on_spot_nodes_and_scales_apart(
    db, clean_store, cluster, k8s, endpoint, spot_pool
):
    k8s.launch(autoscaling.pool_endpoint(endpoint, spot_pool), 2)
    created = next(b for m, p, b in cluster.requests if m == "POST")
    assert created["metadata"]["name"] == "llama-13b-spot" and created["metadata"]["labels"][CAPACITY] == "spot"
    assert created["spec"]["selector"]["matchLabels"] == {
        "app": "llama-13b",
        "infercap/role": "replica",
        CAPACITY: "spot",
    }
    pod_spec = created["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert pod_spec["tolerations"][-1] == {"key": "spot", "operator": "Exists"}
    assert cluster.replicas("llama-13b-spot") == 2 and cluster.replicas("llama-13b") == 2
    # The template's selector matches the spot pods too; they are registered once, on the pool's profile.
    k8s.sync(endpoint)
    spot = endpoint.replicas.filter(hardware_profile=spot_pool, state=ReplicaState.READY)
    assert spot.count() == 2 and all(r.name.startswith("llama-13b-spot-") for r in spot)
    assert endpoint.replicas.filter(hardware_profile__isnull=True, state=ReplicaState.READY).count() == 2
    # Each pool counts its own pods: one more on-demand replica scales the template only, one more spot the pool.
    k8s.launch(endpoint, 1)
    k8s.launch(autoscaling.pool_endpoint(endpoint, spot_pool), 1)
    assert (cluster.replicas("llama-13b"), cluster.replicas("llama-13b-spot")) == (3, 3)
    # Scale-in of a spot replica lowers the spot Deployment, and the ReplicaSet removes that very pod.
    k8s.sync(endpoint)
    victim = endpoint.replicas.filter(hardware_profile=spot_pool).order_by("name").first()
    k8s.terminate([victim], reason="scale in")
    assert (cluster.replicas("llama-13b"), cluster.replicas("llama-13b-spot")) == (4 - 1, 2)
    assert victim.name not in cluster.pods
    # The reconcile loop converges both pools to the split the autoscaler decided.
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=5, desired_spot_replicas=3)
    endpoint.refresh_from_db()
    autoscaling.reconcile(endpoint=endpoint)
    # The third spot pod is launched; the surplus on-demand one serves on until the ready fleet can spare it...
    assert cluster.replicas("llama-13b-spot") == 3 and cluster.replicas("llama-13b") == 3
    assert not endpoint.replicas.filter(state=ReplicaState.DRAINING).exists()
    # ...which it can once that spot pod is ready: then it drains (the pod goes when its requests are done).
    autoscaling.reconcile(endpoint=endpoint)
    draining = endpoint.replicas.get(state=ReplicaState.DRAINING)
    assert draining.hardware_profile is None and draining.name.startswith("llama-13b-")


def test_spot_pods_no_node_can_take_fall_back_to_on_demand(db, clean_store, cluster, k8s, endpoint, spot_pool):
    from capacity.autoscaling import store

    k8s.launch(autoscaling.pool_endpoint(endpoint, spot_pool), 2)
    pending = sorted(n for n in cluster.pods if n.startswith("llama-13b-spot-"))
    unschedulable(cluster.pods[pending[0]], minutes_ago=1)  # within the grace: a node may be on its way
    unschedulable(cluster.pods[pending[1]], minutes_ago=10)
    k8s.sync(endpoint)
    stuck = endpoint.replicas.get(name=pending[1])
    assert stuck.state == ReplicaState.STOPPED and stuck.hardware_profile == spot_pool
    assert endpoint.replicas.get(name=pending[0]).state == ReplicaState.STARTING
    assert cluster.replicas("llama-13b-spot") == 1 and pending[1] not in cluster.pods
    # The next spot launch is refused, which is what puts the count on on-demand for the back-off.
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=4, desired_spot_replicas=2)
    endpoint.refresh_from_db()
    actions = autoscaling.reconcile(endpoint=endpoint)
    assert any(a.startswith("spot: launch failed: no spot capacity: 1 spot pod(s) unschedulable") for a in actions)
    assert store.spot_unavailable(endpoint.pk)


def test_bad_spot_scheduling_options_are_named(db, clean_store, cluster, k8s, endpoint, spot_pool):
    good = dict(endpoint.launch_options)
    for bad, option in (
        ({"spot_node_selector": {"a": 1}}, "spot_node_selector"),
        ({"spot_tolerations": "x"}, "spot_tolerations"),
    ):
        set_launch_options(endpoint, {**good, **bad})
        with pytest.raises(ActuatorError, match=option):
            k8s.launch(autoscaling.pool_endpoint(endpoint, spot_pool), 1)
    assert "llama-13b-spot" not in cluster.deployments
