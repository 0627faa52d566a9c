"""The Kubernetes objects that place a replica of several GPUs whole and inside one interconnect domain
(docs/placement.md, "On Kubernetes"): a replica that fits one node is one pod asking for all of its GPUs (the
scheduler binds a pod whole, so it cannot hold part of a group) with node affinity on the domain label; a replica
larger than a node is a LeaderWorkerSet of one group (a leader and workers, one pod per node, all in one domain),
admitted whole by the cluster's gang scheduler: Kueue (its queue label and topology-aware scheduling annotations)
or Volcano (a PodGroup the pods name), chosen by a setting. A MIG profile's replica is one pod asking for one slice
(``Gang.resource``: the slice's extended resource under the device plugin's strategy, placement/mig.py).
Pure: objects in, objects out."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from capacity.autoscaling.actuators.base import ActuatorError

GPU = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-"  # + the profile: a MIG slice under the device plugin's mixed strategy
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
# What ``_schedule`` wrote into a pod template (its domain label), so that a later launch of another shape takes out
# exactly that and never an operator's own affinity, scheduler or annotations.
PLACED_ANNOTATION = "infercap/gang-placed"


@dataclass(frozen=True)
class Gang:
    """How the cluster places groups: its gang scheduler and queue, and its hardware's shape (the hardware
    profile's gpus_per_node, interconnect_domain_gpus and domain_node_label)."""

    scheduler: str = "none"
    queue: str = "infercap"
    gpus_per_node: int = 8
    domain_gpus: int = 8
    domain_label: str = HOSTNAME
    # What one of a replica's GPUs is asked as: nvidia.com/gpu, or a MIG slice's resource (mig.resource_name).
    resource: str = GPU

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


def is_device(resource) -> bool:
    """Whether an extended resource is a GPU's or a MIG slice's (what ``_with_gpus`` writes)."""
    return resource == GPU or (isinstance(resource, str) and resource.startswith(MIG_RESOURCE))


def _with_gpus(pod: dict, gpus: int, resource: str = GPU) -> dict:
    """The engine container asking for ``gpus`` of ``resource`` (requests too where the template requests GPUs), and
    for no other GPU or slice resource: a template an earlier launch wrote for another profile asks for this one's
    only (a slice under the mixed strategy is not also an nvidia.com/gpu)."""
    pod = copy.deepcopy(pod)
    containers = pod.setdefault("spec", {}).get("containers") or []
    if not containers:
        raise ActuatorError("the pod template has no container")
    resources = containers[0].setdefault("resources", {})
    limits, requests = resources.setdefault("limits", {}), resources.get("requests") or {}
    requested = any(is_device(key) for key in requests)
    for table in (limits, requests):
        for key in [key for key in table if is_device(key)]:
            del table[key]
    limits[resource] = gpus
    if requested:
        resources["requests"][resource] = gpus
    return pod


def asked_devices(pod: dict) -> dict:
    """The GPUs and MIG slices the pod template's engine container asks for, by resource (its limits)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    limits = ((containers[0].get("resources") or {}).get("limits") or {}) if containers else {}
    return {key: value for key, value in limits.items() if is_device(key)}


def _one_gpu(asked: dict) -> bool:
    # The API server answers quantities as strings ("1"); a template written here holds integers.
    return list(asked) == [GPU] and str(asked[GPU]).strip() == "1"


def one_gpu_template(pod: dict) -> dict:
    """The pod template for a replica of one whole GPU that nothing but the scheduler places (no gang scheduler):
    where the template was written for another shape (a MIG launch's slice, or a copy of an 8-GPU endpoint's
    template for its 1-GPU spot or prefill pool), it asks for one GPU and loses what ``_schedule`` wrote for the
    gang (``PLACED_ANNOTATION`` says what); a template asking for no GPU (CPU replicas) or for one already is
    kept as it is."""
    asked = asked_devices(pod)
    if asked and not _one_gpu(asked):
        pod = _with_gpus(pod, 1)
    return _unscheduled(pod)


def _unscheduled(pod: dict) -> dict:
    """``pod`` without what ``_schedule`` wrote into it (``PLACED_ANNOTATION``: the domain label its node affinity
    named): that node affinity, the Kueue topology and Volcano annotations, Volcano as the scheduler. A template
    without the annotation (never placed here, or written by an operator) is returned as it is."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if PLACED_ANNOTATION not in annotations:
        return pod
    pod = copy.deepcopy(pod)
    annotations = pod["metadata"]["annotations"]
    label = annotations.pop(PLACED_ANNOTATION)
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    if affinity.get("nodeAffinity") == _node_affinity(label):
        del affinity["nodeAffinity"]
        if not affinity:
            spec.pop("affinity", None)
    if annotations.pop(VOLCANO_QUEUE, None) is not None and spec.get("schedulerName") == "volcano":
        del spec["schedulerName"]
    for key in (KUEUE_REQUIRED_TOPOLOGY, KUEUE_PODSET_GROUP, VOLCANO_GROUP):
        annotations.pop(key, None)
    return pod


def _schedule(pod: dict, gang: Gang, *, group: str | None) -> None:
    meta, spec = pod.setdefault("metadata", {}), pod["spec"]
    spec.setdefault("affinity", {})["nodeAffinity"] = _node_affinity(gang.domain_label)
    annotations = meta.setdefault("annotations", {})
    annotations[PLACED_ANNOTATION] = gang.domain_label
    if gang.scheduler == "kueue" and group is not None:
        annotations[KUEUE_REQUIRED_TOPOLOGY] = gang.domain_label
        annotations[KUEUE_PODSET_GROUP] = "replica"
    if gang.scheduler == "volcano":
        spec["schedulerName"] = "volcano"
        annotations[VOLCANO_QUEUE] = gang.queue
        if group is not None:
            annotations[VOLCANO_GROUP] = group


def single_node_template(pod: dict, *, gpus: int, gang: Gang) -> dict:
    """A Deployment's pod template for replicas that fit one node: all ``gpus`` asked by one pod (as
    ``gang.resource``: one MIG slice's for a MIG profile), on labelled nodes."""
    if gang.shares(gpus)[0] != 1:
        raise ActuatorError(f"a replica of {gpus} GPUs spans nodes: it is a LeaderWorkerSet")
    pod = _with_gpus(pod, gpus, gang.resource)
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
        template = _multi_node_args(_with_gpus(pod, per_pod, gang.resource), nodes=nodes, worker=role == "worker")
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


def volcano_pod_group(
    *, name: str, namespace: str, labels: dict, members: int, gpus: int, queue: str, resource: str = GPU
) -> dict:
    """Volcano's gang: none of the ``members`` pods binds until all can, with ``gpus`` of ``resource`` (GPUs, or a
    MIG profile's slices) free for them."""
    return {
        "apiVersion": VOLCANO_API,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"minMember": members, "minResources": {resource: str(gpus)}, "queue": queue},
    }


def replica_objects(*, name: str, namespace: str, labels: dict, pod: dict, gpus: int, gang: Gang) -> list[dict]:
    """What one replica larger than a node is on the cluster: its LeaderWorkerSet of one group, and under Volcano the
    PodGroup its pods name (one replica, one gang: scaling adds and removes these objects, never part of one)."""
    objects = [leader_worker_set(name=name, namespace=namespace, labels=labels, pod=pod, gpus=gpus, gang=gang)]
    if gang.scheduler == "volcano":
        nodes, _ = gang.shares(gpus)
        group = volcano_pod_group(
            name=name,
            namespace=namespace,
            labels=labels,
            members=nodes,
            gpus=gpus,
            queue=gang.queue,
            resource=gang.resource,
        )
        objects.insert(0, group)
    return objects
