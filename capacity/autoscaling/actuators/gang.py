"""The Kubernetes objects that place a replica of several GPUs whole and inside one interconnect domain
(docs/placement.md, "On Kubernetes"): a replica that fits one node is one pod asking for all of its GPUs (the
scheduler binds a pod whole, so it cannot hold part of a group) with node affinity on the domain label; a replica
larger than a node is a LeaderWorkerSet of one group (a leader and workers, one pod per node, all in one domain),
admitted whole by the cluster's gang scheduler: Kueue (its queue label and topology-aware scheduling annotations)
or Volcano (a PodGroup the pods name), chosen by a setting. Pure: objects in, objects out."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from capacity.autoscaling.actuators.base import ActuatorError

GPU = "nvidia.com/gpu"
GANG_SCHEDULERS = ("none", "kueue", "volcano")
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"  # leader and workers share one topology domain
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LWS_API = "leaderworkerset.x-k8s.io/v1"
VOLCANO_API = "scheduling.volcano.sh/v1beta1"
HOSTNAME = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Gang:
    """How the cluster places groups: its gang scheduler and queue, and its hardware's shape (the hardware
    profile's gpus_per_node, interconnect_domain_gpus and domain_node_label)."""

    scheduler: str = "none"
    queue: str = "infercap"
    gpus_per_node: int = 8
    domain_gpus: int = 8
    domain_label: str = HOSTNAME

    def __post_init__(self):
        if self.scheduler not in GANG_SCHEDULERS:
            raise ActuatorError(f"gang scheduler {self.scheduler!r} is not one of {', '.join(GANG_SCHEDULERS)}")

    def shares(self, gpus: int) -> tuple[int, int]:
        """(pods, GPUs per pod) of one replica of ``gpus``: one pod where a node's NVLink island holds it, else equal
        shares on nodes of the rack-scale domain (whole nodes where the size allows); an ActuatorError where no
        domain holds it."""
        if gpus <= min(self.gpus_per_node, self.domain_gpus):
            return 1, gpus
        if gpus > self.domain_gpus:
            raise ActuatorError(f"a replica of {gpus} GPUs is larger than the {self.domain_gpus}-GPU domain")
        per = next(p for p in range(self.gpus_per_node, 0, -1) if gpus % p == 0)
        return gpus // per, per


def _node_affinity(domain_label: str) -> dict:
    """Only nodes that carry the domain label: a node outside any known domain takes no group."""
    term = {"matchExpressions": [{"key": domain_label, "operator": "Exists"}]}
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}


def _group_affinity(domain_label: str) -> dict:
    """Every pod of one LeaderWorkerSet group on nodes of one domain (the first pod of a group matches itself)."""
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchExpressions": [{"key": LWS_GROUP_KEY, "operator": "Exists"}]},
                "matchLabelKeys": [LWS_GROUP_KEY],
                "topologyKey": domain_label,
            }
        ]
    }


def _with_gpus(pod: dict, gpus: int) -> dict:
    pod = copy.deepcopy(pod)
    containers = pod.setdefault("spec", {}).get("containers") or []
    if not containers:
        raise ActuatorError("the pod template has no container")
    resources = containers[0].setdefault("resources", {})
    resources.setdefault("limits", {})[GPU] = gpus
    if GPU in resources.get("requests", {}):
        resources["requests"][GPU] = gpus
    return pod


def _schedule(pod: dict, gang: Gang, *, group: str | None) -> None:
    meta, spec = pod.setdefault("metadata", {}), pod["spec"]
    spec.setdefault("affinity", {})["nodeAffinity"] = _node_affinity(gang.domain_label)
    annotations = meta.setdefault("annotations", {})
    if gang.scheduler == "kueue" and group is not None:
        annotations[KUEUE_REQUIRED_TOPOLOGY] = gang.domain_label
        annotations[KUEUE_PODSET_GROUP] = "replica"
    if gang.scheduler == "volcano":
        spec["schedulerName"] = "volcano"
        annotations[VOLCANO_QUEUE] = gang.queue
        if group is not None:
            annotations[VOLCANO_GROUP] = group


def single_node_template(pod: dict, *, gpus: int, gang: Gang) -> dict:
    """A Deployment's pod template for replicas that fit one node: all ``gpus`` asked by one pod, on labelled nodes."""
    if gang.shares(gpus)[0] != 1:
        raise ActuatorError(f"a replica of {gpus} GPUs spans nodes: it is a LeaderWorkerSet")
    pod = _with_gpus(pod, gpus)
    _schedule(pod, gang, group=None)
    return pod


def deployment_labels(gang: Gang) -> dict:
    """Labels the replicas' Deployment carries: Kueue's queue (Kueue admits a Deployment's pods through it)."""
    return {KUEUE_QUEUE: gang.queue} if gang.scheduler == "kueue" else {}


def _multi_node_args(pod: dict, *, nodes: int, worker: bool) -> dict:
    """vLLM's multi-node launch (the mp backend): every pod the same model and parallel sizes, its node rank, the
    leader's address; workers run headless (no API server)."""
    container = pod["spec"]["containers"][0]
    rank = "$(LWS_WORKER_INDEX)" if worker else "0"
    args = [a for a in container.get("args", []) if not a.startswith(("--nnodes", "--node-rank", "--master-addr"))]
    args += [f"--nnodes={nodes}", f"--node-rank={rank}", "--master-addr=$(LWS_LEADER_ADDRESS)"]
    if worker:
        args.append("--headless")
        for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
            container.pop(probe, None)  # a headless worker serves no HTTP; the leader's probes speak for the group
    container["args"] = args
    return pod


def leader_worker_set(
    *,
    name: str,
    namespace: str,
    labels: dict,
    pod: dict,
    gpus: int,
    gang: Gang,
    replicas: int = 1,
    per_pod: int | None = None,
) -> dict:
    """A LeaderWorkerSet for replicas larger than a node: each group a pod per node with an equal share of the GPUs
    (a whole node's where the size allows, or ``per_pod``), recreated together when one fails, all inside one
    domain."""
    nodes, whole = gang.shares(gpus)
    if per_pod is not None:  # a smaller share, chosen by who knows the nodes' free GPUs (docs/placement.md)
        if per_pod < 1 or per_pod > whole or gpus % per_pod:
            raise ActuatorError(f"{per_pod} GPUs per pod does not split a replica of {gpus} on {whole}-GPU shares")
        nodes = gpus // per_pod
    per_pod = per_pod or whole
    if nodes < 2:
        raise ActuatorError(f"a replica of {gpus} GPUs fits one node: it is a Deployment's pod")
    templates = {}
    for role in ("leader", "worker"):
        template = _multi_node_args(_with_gpus(pod, per_pod), nodes=nodes, worker=role == "worker")
        template["spec"]["affinity"] = {"podAffinity": _group_affinity(gang.domain_label)}
        _schedule(template, gang, group=name if gang.scheduler == "volcano" else "replica")
        templates[role] = template
    metadata = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if gang.scheduler == "kueue":
        metadata["labels"][KUEUE_QUEUE] = gang.queue
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": templates["leader"],
                "workerTemplate": templates["worker"],
            },
        },
    }


def volcano_pod_group(*, name: str, namespace: str, labels: dict, members: int, gpus: int, queue: str) -> dict:
    """Volcano's gang: none of the ``members`` pods binds until all can, with ``gpus`` GPUs free for them."""
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"minMember": members, "minResources": {GPU: str(gpus)}, "queue": queue},
    }


def replica_objects(*, name: str, namespace: str, labels: dict, pod: dict, gpus: int, gang: Gang) -> list[dict]:
    """What one replica larger than a node is on the cluster: its LeaderWorkerSet of one group, and under Volcano the
    PodGroup its pods name (one replica, one gang: scaling adds and removes these objects, never part of one)."""
    objects = [leader_worker_set(name=name, namespace=namespace, labels=labels, pod=pod, gpus=gpus, gang=gang)]
    if gang.scheduler == "volcano":
        nodes, _ = gang.shares(gpus)
        group = volcano_pod_group(
            name=name, namespace=namespace, labels=labels, members=nodes, gpus=gpus, queue=gang.queue
        )
        objects.insert(0, group)
    return objects
