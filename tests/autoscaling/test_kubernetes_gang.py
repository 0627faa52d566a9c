"""Gang placement wired into the Kubernetes actuator (capacity/autoscaling/actuators/kubernetes_gang.py,
docs/placement.md "In the actuators"), against a recording API server that keeps Deployments, pods,
LeaderWorkerSets and PodGroups: a replica that fits a node is its Deployment's pod asking for the whole group on a
domain-labelled node; a replica larger than a node is one LeaderWorkerSet (and a Volcano PodGroup), created and
deleted whole; every object sent is valid against the Kubernetes and CRD schemas."""

import copy
import json
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml

from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.actuators.gang import GPU, KUEUE_QUEUE, LWS_GROUP_KEY, VOLCANO_GROUP
from capacity.autoscaling.actuators.kubernetes import KubernetesActuator
from capacity.autoscaling.actuators.kubernetes_gang import GROUP_OF, LWS_WORKER_INDEX
from endpoints.models import Endpoint, Replica, ReplicaState
from tests.autoscaling.test_gang_objects import TEMPLATE, _valid
from tests.factories import HardwareProfileFactory

CLIQUE = "nvidia.com/gpu.clique"
NS = "infer"
DEPLOY = "ep"
DEPLOY_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{DEPLOY}"
LWS_PATH = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
PG_PATH = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{NS}/podgroups"
PODS_PATH = f"/api/v1/namespaces/{NS}/pods"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch, as the API server applies ``application/merge-patch+json``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def matches(selector: str, labels: dict) -> bool:
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


class ApiServer:
    """Deployments, their scale, pods, LeaderWorkerSets and PodGroups; a LeaderWorkerSet gets its group's pods at
    once (leader ``<set>-0``, workers ``<set>-0-<i>``), as the LWS controller makes them. Records every request."""

    def __init__(self, endpoint_id: int):
        deployment = json.loads(json.dumps(TEMPLATE).replace("ENDPOINT_ID", str(endpoint_id)))
        deployment["metadata"].update(name=DEPLOY, namespace=NS)
        self.deployments = {DEPLOY: deployment}
        self.pods: dict[str, dict] = {}
        self.sets: dict[str, dict] = {}
        self.pod_groups: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.ip = 10

    def _pod(self, name: str, template: dict, labels: dict) -> None:
        self.ip += 1
        pod = {"metadata": {"name": name, "namespace": NS, "labels": {**template["metadata"]["labels"], **labels}}}
        pod["spec"] = copy.deepcopy(template["spec"])
        pod["status"] = {
            "phase": "Running",
            "podIP": f"10.42.0.{self.ip}",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        self.pods[name] = pod

    def _create_set(self, body: dict) -> None:
        name = body["metadata"]["name"]
        self.sets[name] = body
        spec = body["spec"]["leaderWorkerTemplate"]
        group = {LWS_NAME: name, LWS_GROUP_KEY: f"key-{name}"}
        self._pod(f"{name}-0", spec["leaderTemplate"], {**group, LWS_WORKER_INDEX: "0"})
        for i in range(1, spec["size"]):
            self._pod(f"{name}-0-{i}", spec["workerTemplate"], {**group, LWS_WORKER_INDEX: str(i)})

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        method, path = request.method, request.url.path
        self.requests.append((method, path, body))
        selector = request.url.params.get("labelSelector")
        if path.startswith("/apis/apps/v1/") and "/deployments/" in path:
            name, _, sub = path.split("/deployments/")[1].partition("/")
            deployment = self.deployments.get(name)
            if deployment is None:
                return httpx.Response(404, json={"message": "not found"})
            if sub == "scale":
                if method == "PATCH":
                    deployment["spec"]["replicas"] = body["spec"]["replicas"]
                labels = deployment["spec"]["selector"]["matchLabels"]
                status = {"selector": ",".join(f"{k}={v}" for k, v in labels.items())}
                return httpx.Response(
                    200, json={"spec": {"replicas": deployment["spec"]["replicas"]}, "status": status}
                )
            if method == "PATCH":
                assert request.headers["Content-Type"] == "application/merge-patch+json"
                merge(deployment, body)
            return httpx.Response(200, json=deployment)
        if path == PODS_PATH:
            return httpx.Response(
                200, json={"items": [p for p in self.pods.values() if matches(selector, p["metadata"]["labels"])]}
            )
        if path.startswith(PODS_PATH + "/") and method == "DELETE":
            self.pods.pop(path.rsplit("/", 1)[1], None)
            return httpx.Response(200, json={})
        if path.startswith(PODS_PATH + "/") and method == "PATCH":
            return httpx.Response(200, json=merge(self.pods[path.rsplit("/", 1)[1]], body))
        for collection, store in ((LWS_PATH, self.sets), (PG_PATH, self.pod_groups)):
            if path == collection and method == "POST":
                if store is self.sets:
                    self._create_set(body)
                else:
                    store[body["metadata"]["name"]] = body
                return httpx.Response(201, json=body)
            if path == collection and method == "GET":
                items = [s for s in store.values() if matches(selector, s["metadata"]["labels"])]
                return httpx.Response(200, json={"items": items})
            if path.startswith(collection + "/") and method == "DELETE":
                name = path.rsplit("/", 1)[1]
                if store.pop(name, None) is None:
                    return httpx.Response(404, json={"message": "not found"})
                for pod in [p for p in self.pods.values() if p["metadata"]["labels"].get(LWS_NAME) == name]:
                    self.pods.pop(pod["metadata"]["name"])
                return httpx.Response(200, json={})
        return httpx.Response(404, json={"message": "not found"})

    def sent(self, method: str, path: str) -> list[dict]:
        return [body for m, p, body in self.requests if m == method and p == path]


def gang_endpoint(tenant, *, gpus: int, per_node: int = 4, domain: int = 72, label: str = CLIQUE) -> Endpoint:
    hardware = HardwareProfileFactory(
        name=f"gb200-tp{gpus}",
        gpus_per_replica=gpus,
        gpus_per_node=per_node,
        interconnect_domain_gpus=domain,
        domain_node_label=label,
    )
    Endpoint.objects.filter(pk=tenant.endpoint.pk).update(
        hardware_profile=hardware, launch_options={"actuator": "kubernetes", "namespace": NS, "deployment": DEPLOY}
    )
    return Endpoint.objects.get(pk=tenant.endpoint.pk)


@pytest.fixture
def gang(settings):
    def use(scheduler: str) -> None:
        settings.INFERCAP = {**settings.INFERCAP, "GANG_SCHEDULER": scheduler, "GANG_QUEUE": "gpu-queue"}

    return use


def actuator(server: ApiServer) -> KubernetesActuator:
    return KubernetesActuator(api_url="https://k8s.test", token="t", transport=httpx.MockTransport(server.handle))


def test_a_replica_that_fits_a_node_asks_for_its_whole_group_on_a_domain_node_under_kueue(db, tenant_a, gang):
    gang("kueue")
    endpoint = gang_endpoint(tenant_a, gpus=4)
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 2)
    assert len(server.sent("PATCH", DEPLOY_PATH)) == 1  # from zero, before the scale-up
    assert [m for m, p, _ in server.requests if p == DEPLOY_PATH + "/scale"][-1] == "PATCH"
    deployment = server.deployments[DEPLOY]
    kubernetes_validate.validate(deployment, "1.32", strict=True)
    assert deployment["metadata"]["labels"][KUEUE_QUEUE] == "gpu-queue" and deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"][GPU] == 4  # the template asked for 1: the whole group now
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": CLIQUE, "operator": "Exists"}]
    assert pod["containers"][0]["args"] == TEMPLATE["spec"]["template"]["spec"]["containers"][0]["args"]
    # Scaling on with pods running changes no template (it would roll them); none registered yet: 3 in all
    k8s.launch(endpoint, 3)
    assert len(server.sent("PATCH", DEPLOY_PATH)) == 1 and deployment["spec"]["replicas"] == 3
    assert not server.sent("POST", LWS_PATH)


def test_without_a_gang_scheduler_a_one_gpu_replica_leaves_the_deployment_as_it_is(db, tenant_a, gang):
    gang("none")
    endpoint = gang_endpoint(tenant_a, gpus=1, per_node=8, domain=8, label="kubernetes.io/hostname")
    server = ApiServer(endpoint.pk)
    before = copy.deepcopy(server.deployments[DEPLOY]["spec"]["template"])
    actuator(server).launch(endpoint, 1)
    assert not server.sent("PATCH", DEPLOY_PATH) and server.deployments[DEPLOY]["spec"]["template"] == before
    assert server.deployments[DEPLOY]["spec"]["replicas"] == 1


def test_under_volcano_a_one_node_replica_names_the_scheduler_and_its_queue(db, tenant_a, gang):
    gang("volcano")
    endpoint = gang_endpoint(tenant_a, gpus=2, per_node=8, domain=8, label="kubernetes.io/hostname")
    server = ApiServer(endpoint.pk)
    actuator(server).launch(endpoint, 1)
    deployment = server.deployments[DEPLOY]
    kubernetes_validate.validate(deployment, "1.32", strict=True)
    template = deployment["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == "gpu-queue"
    assert template["spec"]["containers"][0]["resources"]["limits"][GPU] == 2
    assert not server.sent("POST", PG_PATH)  # one pod is its own gang


def test_a_replica_larger_than_a_node_is_one_leader_worker_set_created_and_deleted_whole(db, tenant_a, gang):
    gang("volcano")
    endpoint = gang_endpoint(tenant_a, gpus=8)  # NVL72 trays of 4: a leader and a worker of 4 GPUs each
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 2)
    sets, groups = server.sent("POST", LWS_PATH), server.sent("POST", PG_PATH)
    assert len(sets) == 2 and len(groups) == 2
    for obj in sets + groups:
        _valid(obj)
    for lws in sets:
        name = lws["metadata"]["name"]
        assert lws["metadata"]["labels"][GROUP_OF] == DEPLOY and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        assert leader["metadata"]["annotations"][VOLCANO_GROUP] == name
        assert leader["spec"]["containers"][0]["resources"]["limits"][GPU] == 4
        assert (
            leader["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
                "topologyKey"
            ]
            == CLIQUE
        )
    assert {g["metadata"]["name"] for g in groups} == {s["metadata"]["name"] for s in sets}
    assert server.deployments[DEPLOY]["spec"]["replicas"] == 0  # the Deployment is only the template
    assert not server.sent("PATCH", DEPLOY_PATH + "/scale")
    # Asked again before the leaders registered (the next tick): no overshoot
    k8s.launch(endpoint, 2)
    assert len(server.sent("POST", LWS_PATH)) == 2
    # The leaders are the replicas; the workers (headless) are not
    k8s.sync(endpoint)
    rows = {r.name: r for r in endpoint.replicas.all()}
    assert set(rows) == {f"{s['metadata']['name']}-0" for s in sets}
    assert {r.state for r in rows.values()} == {ReplicaState.READY}
    assert all(r.url.startswith("http://10.42.0.") for r in rows.values())
    # Scale-in deletes one whole group: its set and PodGroup go, the other stays
    gone, kept = sorted(rows.values(), key=lambda r: r.name)
    k8s.terminate([gone], reason="scale-in")
    gone_set = gone.name[: -len("-0")]
    assert ("DELETE", f"{LWS_PATH}/{gone_set}") in [(m, p) for m, p, _ in server.requests]
    assert gone_set not in server.sets and gone_set not in server.pod_groups and len(server.sets) == 1
    k8s.sync(endpoint)
    assert Replica.objects.get(pk=gone.pk).state == ReplicaState.STOPPED
    assert Replica.objects.get(pk=kept.pk).state == ReplicaState.READY
    # One more replica: one more set, from the registered count
    k8s.launch(endpoint, 1)
    assert len(server.sets) == 2


def test_restarting_a_group_replaces_its_whole_set_under_a_new_name(db, tenant_a, gang):
    gang("kueue")
    endpoint = gang_endpoint(tenant_a, gpus=16)
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 1)
    (lws,) = server.sent("POST", LWS_PATH)
    assert lws["metadata"]["labels"][KUEUE_QUEUE] == "gpu-queue" and lws["spec"]["leaderWorkerTemplate"]["size"] == 4
    _valid(lws)
    assert not server.sent("POST", PG_PATH)
    k8s.sync(endpoint)
    (row,) = endpoint.replicas.all()
    k8s.restart(row)
    row.refresh_from_db()
    assert row.state == ReplicaState.STOPPED and lws["metadata"]["name"] not in server.sets
    (new,) = server.sets
    assert new != lws["metadata"]["name"]
    k8s.sync(endpoint)
    assert endpoint.replicas.exclude(state=ReplicaState.STOPPED).get().name == f"{new}-0"


def test_a_group_no_domain_holds_fails_before_anything_is_created(db, tenant_a, gang):
    gang("none")
    endpoint = gang_endpoint(tenant_a, gpus=16, per_node=8, domain=8, label="kubernetes.io/hostname")
    server = ApiServer(endpoint.pk)
    with pytest.raises(ActuatorError, match="larger than the 8-GPU domain"):
        actuator(server).launch(endpoint, 1)
    assert not [r for r in server.requests if r[0] in ("POST", "PATCH")]


def test_a_group_replica_has_no_warm_pool(db, tenant_a, gang):
    gang("none")
    endpoint = gang_endpoint(tenant_a, gpus=8)
    with pytest.raises(ActuatorError, match="no warm pool"):
        actuator(ApiServer(endpoint.pk)).launch(endpoint, 1, standby=True)


def test_the_worker_role_grants_the_group_objects_the_actuator_creates_and_deletes():
    rbac = Path(__file__).resolve().parents[2] / "platform/kubernetes/base/rbac.yaml"
    (role,) = [doc for doc in yaml.safe_load_all(rbac.read_text()) if doc["kind"] == "Role"]
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for group, resource in (("leaderworkerset.x-k8s.io", "leaderworkersets"), ("scheduling.volcano.sh", "podgroups")):
        assert {(group, resource, verb) for verb in ("list", "create", "delete")} <= grants


def test_a_bad_gang_setting_fails_launches_but_not_the_sync_of_what_runs(db, tenant_a, gang):
    gang("none")
    endpoint = gang_endpoint(tenant_a, gpus=2, per_node=8, domain=8, label="kubernetes.io/hostname")
    server = ApiServer(endpoint.pk)
    k8s = actuator(server)
    k8s.launch(endpoint, 1)
    server._pod("ep-abc", server.deployments[DEPLOY]["spec"]["template"], {})
    gang("slurm")
    with pytest.raises(ActuatorError, match="gang scheduler 'slurm'"):
        k8s.launch(endpoint, 1)
    k8s.sync(endpoint)  # the Deployment's pod is still registered and can be scaled in
    (row,) = endpoint.replicas.all()
    k8s.terminate([row], reason="scale-in")
    assert server.deployments[DEPLOY]["spec"]["replicas"] == 0


def test_a_deployments_listing_leaves_leader_worker_set_pods_to_their_groups(db, tenant_a, gang):
    gang("none")
    endpoint = gang_endpoint(tenant_a, gpus=4)  # fits a tray: the Deployment's pods are the replicas
    server = ApiServer(endpoint.pk)
    template = server.deployments[DEPLOY]["spec"]["template"]
    server._pod("ep-abc", template, {})
    # A set's pods carry the template's labels, which the Deployment's selector matches
    server._pod("ep-g123456-0", template, {GROUP_OF: DEPLOY, LWS_NAME: "ep-g123456", LWS_WORKER_INDEX: "0"})
    actuator(server).sync(endpoint)
    assert [r.name for r in endpoint.replicas.all()] == ["ep-abc"]
