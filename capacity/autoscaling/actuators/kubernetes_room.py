"""Room on a Kubernetes cluster for the capacity ledger (docs/placement.md, "In the ledger"): the GPU nodes and the GPUs
that live pods request on each, as a placement ``Room``, so the ledger counts whole replicas there as it does on a
host of the local actuator; and the MIG slices each node offers (``nvidia.com/mig-<profile>``) less those live pods
request, for a MIG profile's endpoints (``Room.slices_free``, docs/placement.md, "MIG slices"). Each endpoint's room is on the nodes its pods may be bound to: those whose labels match
its requirements (GPU model, node selector) and whose NoSchedule/NoExecute taints its pods tolerate
(``placement.node_requirements``, the answer the actuator writes into the pods of the endpoint's own
profile and options; what a row does not stand for, such as a spot or prefill pool and Deployments whose pods predate
an edit, is listed in docs/placement.md, "Not matched").

A beat task (``workers/tasks/room.py``) reads the nodes and pods through the actuator's API client every
``REFRESH_S`` and keeps the result in the shared store for ``ROOM_TTL_S``. The ledger's readers (the console and the
REST API, which run in the web pods, without the worker's service account) read that snapshot, one store read, and
never the API server. A read that fails (403, API server down) publishes "unknown", logged once until it reads again.
"""

import json
import logging

from django.conf import settings

from capacity.autoscaling import store
from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.kubernetes_api import KubernetesApi
from capacity.models import HardwareProfile
from endpoints.models import Endpoint
from placement import mig
from placement.cluster import Cluster
from placement.node_requirements import (
    BLOCKING_EFFECTS,
    GPU_PRODUCT_LABEL,
    SPOT_NODE_SELECTOR,
    Room,
    RoomNode,
    selector_label_keys,
)

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE = "nvidia.com/mig-"  # + the profile: one MIG slice under the device plugin's mixed strategy
HOSTNAME_LABEL = "kubernetes.io/hostname"  # the node is its own domain: no label to read
ROOM_KEY = "infercap:room:kubernetes"
REFRESH_S = 30.0
ROOM_TTL_S = 90  # three refreshes missed (the beat or the worker gone): unknown rather than stale


def _count(value) -> int:
    """A GPU quantity as the API writes it ("8"); anything else (a fraction, garbage) counts as none."""
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0


def _schedulable(node: dict) -> bool:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and not spec.get("unschedulable")


def node_gpus(node: dict) -> int:
    """The GPUs a node offers new pods: its allocatable ``nvidia.com/gpu``, none while cordoned or not Ready."""
    if not _schedulable(node):
        return 0
    return _count(((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE))


def node_slices(node: dict) -> dict[str, int]:
    """The MIG slices a node offers new pods, per profile: its allocatable ``nvidia.com/mig-<profile>`` (the device
    plugin's mixed strategy; under single they are its ``nvidia.com/gpu``), none while cordoned or not Ready."""
    if not _schedulable(node):
        return {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    slices = {mig.profile_of_resource(key): _count(value) for key, value in allocatable.items() if _is_slice(key)}
    return {profile: count for profile, count in slices.items() if count}


def _is_slice(resource) -> bool:
    return isinstance(resource, str) and resource.startswith(MIG_RESOURCE)


def _container_devices(container: dict) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    # An extended resource's request equals its limit; a limit alone sets both.
    return {
        key: max(_count(requests.get(key)), _count(limits.get(key)))
        for key in {*requests, *limits}
        if key == GPU_RESOURCE or _is_slice(key)
    }


def pod_devices(pod: dict) -> dict[str, int]:
    """The GPUs and MIG slices (by resource) the scheduler counts for a pod: per resource, its containers' sum, or
    its largest init container's if larger."""
    spec = pod.get("spec") or {}
    counts: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for key, count in _container_devices(container).items():
            counts[key] = counts.get(key, 0) + count
    for container in spec.get("initContainers") or []:
        for key, count in _container_devices(container).items():
            counts[key] = max(counts.get(key, 0), count)
    return {key: count for key, count in counts.items() if count}


def pod_gpus(pod: dict) -> int:
    """The GPUs the scheduler counts for a pod: its containers' sum, or its largest init container's if larger."""
    return pod_devices(pod).get(GPU_RESOURCE, 0)


def blocking_taints(node: dict) -> list[dict]:
    """The node's taints that keep off a pod that does not tolerate them (NoSchedule, NoExecute)."""
    taints = (node.get("spec") or {}).get("taints") or []
    return [
        {"key": str(t.get("key") or ""), "value": str(t.get("value") or ""), "effect": t["effect"]}
        for t in taints
        if isinstance(t, dict) and t.get("effect") in BLOCKING_EFFECTS
    ]


def single_strategy_slice(labels: dict) -> str | None:
    """The MIG profile a node's GPUs are all cut into under the device plugin's single strategy, from the product
    label GPU feature discovery writes then (``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``); None for whole GPUs."""
    product = str(labels.get(GPU_PRODUCT_LABEL) or "")
    profile = product.rsplit("-MIG-", 1)[1] if "-MIG-" in product else ""
    return profile if mig.PROFILE.match(profile) else None


def _node_entry(node: dict, *, domain_labels: list[str], label_keys) -> dict | None:
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    gpus, slices = node_gpus(node), node_slices(node)
    single = single_strategy_slice(labels)
    if single and gpus:  # its nvidia.com/gpu are slices: never a whole GPU for a TP group or the free total
        gpus, slices = 0, {**slices, single: gpus}
    if not meta.get("name") or not (gpus or slices):
        return None
    domain = next((f"{label}={labels[label]}" for label in domain_labels if labels.get(label)), None)
    entry = {
        "name": meta["name"],
        "gpus": gpus,
        "domain": domain,
        "labels": {key: labels[key] for key in label_keys if key in labels},
        "taints": blocking_taints(node),
    }
    return entry | ({"slices": slices} if slices else {}) | ({"single_slice": single} if single else {})


def snapshot(nodes: list[dict], pods: list[dict], *, domain_labels: list[str], label_keys: list[str] = ()) -> dict:
    """The GPU nodes (name, GPUs, domain: the value of the first of ``domain_labels`` the node carries, else none,
    the node its own domain; the values of ``label_keys`` it carries, its blocking taints; its MIG slices per
    profile where it has some) and the GPUs and slices held on each by pods bound there, at most the node's.
    ``label_keys`` are the labels the endpoints' requirements select on (``requirement_label_keys``): a node's other
    labels are not kept. Nodes with whole GPUs are ``nodes`` (what a room published before slices were read holds);
    nodes with only slices (every GPU cut, mixed strategy) are ``slice_nodes``."""
    shape = {}
    for node in nodes:
        if entry := _node_entry(node, domain_labels=domain_labels, label_keys=label_keys):
            shape[entry["name"]] = entry
    held: dict[str, int] = {}
    held_slices: dict[str, dict[str, int]] = {}
    for pod in pods:
        name = (pod.get("spec") or {}).get("nodeName")
        if name not in shape:
            continue
        node, devices = shape[name], pod_devices(pod)
        if node["gpus"] and (gpus := devices.get(GPU_RESOURCE)):
            held[name] = min(node["gpus"], held.get(name, 0) + gpus)
        for key, count in devices.items():
            profile = mig.profile_of_resource(key) if _is_slice(key) else None
            if key == GPU_RESOURCE and node.get("single_slice"):
                profile = node["single_slice"]  # a slice of a node cut under the single strategy
            if profile in node.get("slices", {}):
                on_node = held_slices.setdefault(name, {})
                on_node[profile] = min(node["slices"][profile], on_node.get(profile, 0) + count)
    ordered = sorted(shape.values(), key=lambda n: n["name"])
    return {
        "nodes": [n for n in ordered if n["gpus"]],
        "slice_nodes": [n for n in ordered if not n["gpus"]],
        "held": held,
        "held_slices": held_slices,
        "label_keys": sorted(label_keys),
    }


def cluster_from(room: dict) -> Room | None:
    """The snapshot as a placement room with the held GPUs taken; None for no GPU node. A room published before
    slices were read (no ``held_slices``) reads as before, its slices unknown."""
    listed = [*(room.get("nodes") or []), *(room.get("slice_nodes") or [])]
    if not listed:
        return None
    nodes = [
        RoomNode(
            n["name"],
            int(n["gpus"]),
            domain=n.get("domain"),
            labels=dict(n.get("labels") or {}),
            taints=list(n.get("taints") or []),
            slices={str(p): int(c) for p, c in (n.get("slices") or {}).items()},
        )
        for n in listed
    ]
    held_slices = room.get("held_slices")
    return Room(
        nodes,
        room.get("held") or {},
        label_keys=room.get("label_keys") or [],
        held_slices=dict(held_slices) if isinstance(held_slices, dict) else None,
    )


def domain_labels() -> list[str]:
    """The node labels the hardware profiles name as their domain (the hostname left out: that node is its own)."""
    labels = HardwareProfile.objects.exclude(domain_node_label__in=["", HOSTNAME_LABEL]).values_list(
        "domain_node_label", flat=True
    )
    return sorted(set(labels))


def requirement_label_keys() -> list[str]:
    """The node labels the endpoints' pods may select on: the GPU product label of every profile that names a
    product, and the keys of the launch options' node selectors (spot's, and a prefill pool's own, too); the default
    spot selector's where an endpoint has a spot pool."""
    keys = set(HardwareProfile.objects.exclude(gpu_product="").values_list("gpu_product_label", flat=True).distinct())
    rows = Endpoint.objects.values_list("launch_options", "prefill_launch_options")
    for options, prefill_options in rows.iterator(chunk_size=2000):
        keys |= selector_label_keys(options) | selector_label_keys(prefill_options)
    if Endpoint.objects.filter(spot_hardware_profile__isnull=False).exists():
        keys |= set(SPOT_NODE_SELECTOR)  # a spot pool that names no selector of its own selects on the default
    return sorted(keys)


def kubernetes_in_use() -> bool:
    """Whether any endpoint's replicas run on Kubernetes: the default actuator's, or some endpoint's own choice."""
    if getattr(settings, "INFERCAP", {}).get("AUTOSCALE_ACTUATOR") == "kubernetes":
        return True
    return Endpoint.objects.filter(launch_options__actuator="kubernetes").exists()


def _published() -> dict | None:
    try:
        raw = store.client().get(ROOM_KEY)
        room = json.loads(raw) if raw else None
    except (store.RedisError, ValueError):
        return None
    return room if isinstance(room, dict) else None


def _publish(room: dict) -> None:
    try:
        store.client().set(ROOM_KEY, json.dumps(room), ex=ROOM_TTL_S)
    except store.RedisError as exc:
        log.warning("room on Kubernetes not published: %s", exc)


def _read(api: KubernetesApi | None) -> dict:
    """The snapshot, through ``api`` or a client made for this read (and closed after: the task runs every 30 s)."""
    client = api or KubernetesApi()
    try:
        return snapshot(
            client.nodes(), client.running_pods(), domain_labels=domain_labels(), label_keys=requirement_label_keys()
        )
    finally:
        if api is None:
            client.client.close()


def publish_unknown(why: str) -> dict:
    """Publish that the room is unknown (a read that could not finish): the readers show null, not this host's GPUs."""
    room = {"unknown": why}
    _publish(room)
    return room


def refresh_room(*, api: KubernetesApi | None = None) -> dict | None:
    """Read the nodes and live pods and publish the snapshot; on a failed read publish ``{"unknown": why}``. None
    where no endpoint runs on Kubernetes (nothing published: the readers fall back to the local actuator's GPUs).
    A failure is logged when the published room was not unknown already, so a cluster that stays unreadable is
    logged once, whichever worker process runs the task."""
    if api is None and not kubernetes_in_use():
        return None
    was_unknown = "unknown" in (_published() or {})
    try:
        room = _read(api)
    except (ActuatorError, ValueError) as exc:
        if not was_unknown:
            log.warning("room on Kubernetes unknown: cannot read the nodes and pods: %s", exc)
        room = {"unknown": str(exc)}
    else:
        if was_unknown:
            log.info("room on Kubernetes readable again: %d GPU nodes", len(room["nodes"]))
    _publish(room)
    return room


def kubernetes_room() -> tuple[bool, Cluster | None]:
    """(whether a Kubernetes snapshot is published, its ``Room``): (True, None) where the last read failed or found
    no GPU node, (False, None) where none is published, or the store cannot be read."""
    room = _published()
    if room is None:
        return False, None
    try:
        return True, None if "unknown" in room else cluster_from(room)
    except (KeyError, TypeError, ValueError):
        return True, None
