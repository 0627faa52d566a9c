"""The Kubernetes objects of gang placement (capacity/autoscaling/actuators/gang.py, docs/placement.md): built from
the shipped vLLM replica template, valid against the Kubernetes API's schemas (strict) and against the part of the
LeaderWorkerSet and Volcano PodGroup CRD schemas they use, and shaped so a group lands whole inside one domain."""

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.gang import (
    GPU,
    KUEUE_QUEUE,
    KUEUE_REQUIRED_TOPOLOGY,
    LWS_GROUP_KEY,
    VOLCANO_GROUP,
    Gang,
    deployment_labels,
    leader_worker_set,
    replica_objects,
    single_node_template,
)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = yaml.safe_load((ROOT / "platform/kubernetes/base/vllm-replica.yaml").read_text())
POD = TEMPLATE["spec"]["template"]
LABELS = {"infercap/endpoint-id": "7", "infercap/role": "replica"}
CLIQUE = "nvidia.com/gpu.clique"
NVL72 = {"gpus_per_node": 4, "domain_gpus": 72, "domain_label": CLIQUE}

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
    "additionalProperties": False,
}
# The fields used here, as the CRDs define them: leaderworkerset.x-k8s.io/v1 (LWS v0.6+) and
# scheduling.volcano.sh/v1beta1 (Volcano 1.9+). additionalProperties false: a misspelt field fails.
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None", "Default"]},
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                    },
                },
            },
        },
    },
}
POD_GROUP_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "scheduling.volcano.sh/v1beta1"},
        "kind": {"const": "PodGroup"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": {"type": "integer", "minimum": 1},
                "minResources": {"type": "object", "additionalProperties": {"type": "string"}},
                "queue": {"type": "string"},
                "priorityClassName": {"type": "string"},
            },
        },
    },
}


def _valid_pod_template(pod: dict) -> None:
    """Strict Kubernetes validation of a pod template, as a Deployment's."""
    deployment = copy.deepcopy(TEMPLATE)
    deployment["spec"]["template"] = pod
    deployment["spec"]["template"]["metadata"].setdefault("labels", {}).update(
        TEMPLATE["spec"]["selector"]["matchLabels"]
    )
    kubernetes_validate.validate(deployment, "1.32", strict=True)


def _valid(obj: dict) -> None:
    if obj["kind"] == "LeaderWorkerSet":
        jsonschema.validate(obj, LWS_SCHEMA)
        for role in ("leaderTemplate", "workerTemplate"):
            _valid_pod_template(obj["spec"]["leaderWorkerTemplate"][role])
    else:
        jsonschema.validate(obj, POD_GROUP_SCHEMA)


def test_a_replica_that_fits_a_node_is_one_pod_asking_for_all_its_gpus():
    gang = Gang(scheduler="kueue", **NVL72)
    pod = single_node_template(POD, gpus=4, gang=gang)
    _valid_pod_template(pod)
    assert pod["spec"]["containers"][0]["resources"]["limits"][GPU] == 4
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": CLIQUE, "operator": "Exists"}]
    assert deployment_labels(gang) == {KUEUE_QUEUE: "infercap"} and deployment_labels(Gang()) == {}
    assert POD["spec"]["containers"][0]["resources"]["limits"][GPU] == 1  # the template itself is left alone


def test_a_replica_larger_than_a_node_is_a_leader_worker_set_inside_one_domain_under_kueue():
    lws = leader_worker_set(
        name="ep-7-r3", namespace="infer", labels=LABELS, pod=POD, gpus=16, gang=Gang(scheduler="kueue", **NVL72)
    )
    _valid(lws)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 4 and lws["spec"]["replicas"] == 1
    assert lws["metadata"]["labels"][KUEUE_QUEUE] == "infercap"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    for pod in (leader, worker):
        assert pod["spec"]["containers"][0]["resources"]["limits"][GPU] == 4  # a whole node each
        assert pod["metadata"]["annotations"][KUEUE_REQUIRED_TOPOLOGY] == CLIQUE
        (affinity,) = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert affinity["topologyKey"] == CLIQUE and affinity["matchLabelKeys"] == [LWS_GROUP_KEY]
    leader_args, worker_args = leader["spec"]["containers"][0]["args"], worker["spec"]["containers"][0]["args"]
    assert {"--nnodes=4", "--node-rank=0", "--master-addr=$(LWS_LEADER_ADDRESS)"} <= set(leader_args)
    assert {"--node-rank=$(LWS_WORKER_INDEX)", "--headless"} <= set(worker_args) and "--headless" not in leader_args
    assert (
        "readinessProbe" in leader["spec"]["containers"][0] and "readinessProbe" not in worker["spec"]["containers"][0]
    )


def test_under_volcano_the_pods_name_their_pod_group_of_the_whole_group():
    pod_group, lws = replica_objects(
        name="ep-7-r3", namespace="infer", labels=LABELS, pod=POD, gpus=8, gang=Gang(scheduler="volcano", **NVL72)
    )
    for obj in (pod_group, lws):
        _valid(obj)
    assert pod_group["spec"]["minMember"] == 2 and pod_group["spec"]["minResources"] == {GPU: "8"}
    for role in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][role]
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"][VOLCANO_GROUP] == pod_group["metadata"]["name"]
    assert KUEUE_QUEUE not in lws["metadata"]["labels"]


def test_the_schemas_catch_a_wrong_field():
    lws = leader_worker_set(name="x", namespace="infer", labels=LABELS, pod=POD, gpus=16, gang=Gang(**NVL72))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 4
    with pytest.raises(jsonschema.ValidationError):
        _valid(lws)
    pod = single_node_template(POD, gpus=2, gang=Gang())
    pod["spec"]["affinity"]["nodeAffinity"]["required"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid_pod_template(pod)


@pytest.mark.parametrize(
    ("gpus", "shape", "why"),
    [
        (16, {}, "larger than the 8-GPU domain"),  # HGX boards: no domain spans nodes
        (4, {"domain_gpus": 2}, "larger than the 2-GPU domain"),  # NVLink pairs on a PCIe node
        (76, NVL72, "larger than the 72-GPU domain"),
    ],
)
def test_a_group_no_domain_holds_is_refused(gpus, shape, why):
    with pytest.raises(ActuatorError, match=why):
        replica_objects(name="x", namespace="infer", labels=LABELS, pod=POD, gpus=gpus, gang=Gang(**shape))


def test_a_group_that_is_no_multiple_of_a_node_takes_equal_shares_of_nodes():
    lws = leader_worker_set(name="x", namespace="infer", labels=LABELS, pod=POD, gpus=6, gang=Gang(**NVL72))
    _valid(lws)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (
        template["size"] == 2 and template["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"][GPU] == 3
    )


def test_the_wrong_kind_for_the_size_and_an_unknown_scheduler_are_refused():
    with pytest.raises(ActuatorError, match="LeaderWorkerSet"):
        single_node_template(POD, gpus=8, gang=Gang(**NVL72))
    with pytest.raises(ActuatorError, match="fits one node"):
        leader_worker_set(name="x", namespace="n", labels={}, pod=POD, gpus=4, gang=Gang(**NVL72))
    with pytest.raises(ActuatorError, match="gang scheduler"):
        Gang(scheduler="slurm")
