"""What an endpoint's pods require of a node, and which nodes meet it: the GPU model (the hardware profile's product on
the node label GPU feature discovery sets), the node selector and the tolerations its pods carry. One function for the
pod template the Kubernetes actuator emits and for the room the capacity ledger counts on the cluster (where the two
can still differ: docs/placement.md, "In the ledger", "Not matched"). Pure: no Django."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from placement import mig
from placement.cluster import Cluster, Gpu, Node
from placement.policies import groups_that_fit

# NVIDIA GPU feature discovery's label: the product name with spaces as dashes ("NVIDIA-H100-80GB-HBM3").
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
# A pod that requests an extended resource gets this toleration from the API server's ExtendedResourceToleration
# admission (GKE enables it, and taints its GPU nodes nvidia.com/gpu=present:NoSchedule); where it is off, a template
# that runs on nodes tainted so carries it already. Either way a GPU pod tolerates it.
GPU_RESOURCE_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# On a pod template: the node selector keys (with the values they replaced) and the tolerations ``with_requirements``
# put in, as JSON, so that a later write, or a copy for another pool or version, takes them out before putting its own
# in (a merge never removes a key).
ADDED_ANNOTATION = "infercap/node-requirements"
SPOT_NODE_SELECTOR = {"karpenter.sh/capacity-type": "spot"}
# The taint effects that keep a pod off a node; PreferNoSchedule only steers the scheduler.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
_LABEL_KEY = re.compile(r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class Toleration:
    """One toleration as the operator wrote it (``raw``, emitted as is) and matched as Kubernetes matches it."""

    raw: tuple[tuple[str, object], ...]

    @property
    def spec(self) -> dict:
        return dict(self.raw)

    def tolerates(self, taint: dict) -> bool:
        """Kubernetes' rule: an empty effect matches every effect; an empty key (with Exists) every key; Exists
        matches any value, Equal (the default) only the same value."""
        spec = self.spec
        if spec.get("effect") and spec["effect"] != taint.get("effect"):
            return False
        if spec.get("key") and spec["key"] != taint.get("key"):
            return False
        operator = spec.get("operator") or "Equal"
        if operator == "Exists":
            return True
        return operator == "Equal" and (spec.get("value") or "") == (taint.get("value") or "")


IMPLIED_GPU_TOLERATION = Toleration(tuple(GPU_RESOURCE_TOLERATION.items()))


@dataclass(frozen=True)
class NodeRequirements:
    """The node labels a pod selects (``nodeSelector``: every one must match), the taints it tolerates and the
    extended resource it asks for (``nvidia.com/gpu``, or a MIG slice's: ``mig.resource_name``). Hashable:
    endpoints with equal requirements share one room computation."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    resource: str = GPU_RESOURCE

    def tolerates(self, taint: dict) -> bool:
        if taint.get("effect") not in BLOCKING_EFFECTS:
            return True
        # ExtendedResourceToleration gives a pod that asks for a slice the slice resource's toleration; the
        # nvidia.com/gpu one stays implied (a template for nodes tainted so carries it: docs/placement.md).
        implied = (IMPLIED_GPU_TOLERATION,)
        if self.resource != GPU_RESOURCE:
            implied += (Toleration(tuple({**GPU_RESOURCE_TOLERATION, "key": self.resource}.items())),)
        return any(t.tolerates(taint) for t in (*self.tolerations, *implied))

    def admits(self, labels: dict, taints: Iterable[dict]) -> bool:
        """Whether a GPU pod with these requirements may be bound to a node of ``labels`` and ``taints``."""
        return all(labels.get(k) == v for k, v in self.node_selector) and all(self.tolerates(t) for t in taints)

    @property
    def label_keys(self) -> set[str]:
        return {k for k, _ in self.node_selector}


def node_selector_of(value, *, option: str, allow_empty: bool = True) -> dict:
    """A launch option's node selector, checked as the API server would (label keys and values), or ValueError."""
    if not isinstance(value, dict) or (not value and not allow_empty):
        raise ValueError(
            f"launch option {option} must be a{'n' if allow_empty else ' non-empty'} object of node labels"
        )
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str) or not _LABEL_KEY.match(key) or len(key) > 316:
            raise ValueError(f"launch option {option}: {key!r} must map a node label name to a string")
        if not _LABEL_VALUE.match(item):
            raise ValueError(
                f"launch option {option}: {item!r} is not a label value (63 characters: letters, digits, -_.)"
            )
    return dict(value)


def _toleration_problem(item) -> str | None:
    if not isinstance(item, dict) or not item or any(k not in TOLERATION_FIELDS for k in item):
        return f"each must be an object of {', '.join(TOLERATION_FIELDS)}"
    key, operator, value = item.get("key", ""), item.get("operator", "Equal"), item.get("value", "")
    if not all(isinstance(v, str) for v in (key, operator, value, item.get("effect", ""))):
        return "key, operator, value and effect must be strings"
    if operator not in ("Exists", "Equal"):
        return f"operator {operator!r} must be Exists or Equal"
    if item.get("effect", "") not in EFFECTS:
        return f"effect {item['effect']!r} must be empty or one of {', '.join(EFFECTS[1:])}"
    if operator == "Exists" and value:
        return "a toleration with operator Exists has no value"
    if not _LABEL_VALUE.match(value):
        return f"value {value!r} is not a label value (63 characters: letters, digits, -_.)"
    if not key and operator != "Exists":
        return "a toleration without a key must have operator Exists"
    if key and not _LABEL_KEY.match(key):
        return f"key {key!r} is not a taint key"
    seconds = item.get("tolerationSeconds")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int) or item.get("effect") != "NoExecute"
    ):
        return "tolerationSeconds is a whole number, for effect NoExecute only"
    return None


def tolerations_of(value, *, option: str) -> list[dict]:
    """A launch option's tolerations, checked as the API server would, or ValueError."""
    if not isinstance(value, list):
        raise ValueError(f"launch option {option} must be a list of tolerations ({', '.join(TOLERATION_FIELDS)})")
    for item in value:
        if problem := _toleration_problem(item):
            raise ValueError(f"launch option {option}: {problem}")
    return copy.deepcopy(value)


def requirements(
    *,
    gpu_product: str = "",
    gpu_product_label: str = GPU_PRODUCT_LABEL,
    node_selector=None,
    tolerations=(),
    resource: str = GPU_RESOURCE,
) -> NodeRequirements:
    """The requirements of a pod on hardware of ``gpu_product`` (empty: any GPU node) with the operator's
    ``node_selector`` and ``tolerations`` (checked already); the product overrides a selector on its label."""
    selector = dict(node_selector or {})
    if gpu_product:
        selector[gpu_product_label or GPU_PRODUCT_LABEL] = gpu_product
    return NodeRequirements(
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(Toleration(tuple(t.items())) for t in tolerations),
        resource=resource,
    )


def slice_product(hardware, mig_strategy: str) -> tuple[str, str]:
    """(the product label value a launch on ``hardware`` selects, the resource one replica asks for): the profile's
    own product and ``nvidia.com/gpu`` for whole GPUs; for a MIG profile the slice's resource under the device
    plugin's ``mig_strategy`` and, under ``single``, the slice's product label value (GPU feature discovery's
    ``<product>-MIG-<profile>``), without which a slice could not be told from a whole GPU. ValueError for an unknown
    strategy, or a MIG profile naming no product under ``single``."""
    product = str(getattr(hardware, "gpu_product", "") or "")
    profile = str(getattr(hardware, "mig_profile", "") or "")
    if not profile:
        return product, GPU_RESOURCE
    try:
        resource = mig.resource_name(profile, mig_strategy)
    except ValueError as exc:
        raise ValueError(f"{exc} (the cluster's KUBERNETES_MIG_STRATEGY setting)") from exc
    if mig_strategy == "mixed":
        return product, resource
    if not product:
        raise ValueError(
            f"MIG profile {profile} under the single strategy: its hardware profile must name its gpu_product, as "
            f"its slices are nvidia.com/gpu on nodes whose product label says -MIG-{profile}"
        )
    return mig.product_label_value(product, profile), resource


def endpoint_requirements(options, hardware, *, spot: bool = False, mig_strategy: str = "mixed") -> NodeRequirements:
    """An endpoint's pods' requirements, from its launch options (``node_selector`` and ``tolerations`` on every pod;
    a spot pod adds ``spot_node_selector``, default Karpenter's spot label, and ``spot_tolerations``) and the
    hardware profile it launches on (its ``gpu_product`` on its ``gpu_product_label``; None or no product: any GPU
    node; a MIG profile's under the cluster's ``mig_strategy``: ``slice_product``). Bad option shapes are a
    ValueError naming the option."""
    options = options if isinstance(options, dict) else {}
    selector = node_selector_of(options.get("node_selector", {}), option="node_selector")
    tolerations = tolerations_of(options.get("tolerations", []), option="tolerations")
    if spot:
        spot_selector = options.get("spot_node_selector", SPOT_NODE_SELECTOR)
        selector |= node_selector_of(spot_selector, option="spot_node_selector", allow_empty=False)
        tolerations += tolerations_of(options.get("spot_tolerations", []), option="spot_tolerations")
    product, resource = slice_product(hardware, mig_strategy)
    return requirements(
        gpu_product=product,
        gpu_product_label=str(getattr(hardware, "gpu_product_label", "") or GPU_PRODUCT_LABEL),
        node_selector=selector,
        tolerations=tolerations,
        resource=resource,
    )


def selector_label_keys(options) -> set[str]:
    """The node label keys an endpoint's launch options select on (for the room's read; bad shapes add none)."""
    options = options if isinstance(options, dict) else {}
    keys = set()
    for name in ("node_selector", "spot_node_selector"):
        if isinstance(options.get(name), dict):
            keys |= {k for k in options[name] if isinstance(k, str)}
    return keys


def _added_by_platform(pod: dict) -> dict:
    """What ``with_requirements`` recorded it put into this template (its annotation; unreadable: nothing)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ADDED_ANNOTATION)
    try:
        added = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        added = {}
    added = added if isinstance(added, dict) else {}
    return {
        name: added[name] if isinstance(added.get(name), kind) else kind()
        for name, kind in (("nodeSelector", dict), ("replaced", dict), ("tolerations", list))
    }


def without_requirements(pod: dict) -> dict:
    """A copy of the pod template without what ``with_requirements`` put in (its annotation says what): a selector key
    it set goes back to the template's own value, or away; a toleration it added goes. What an operator changed
    since, the template's own, stays."""
    pod = copy.deepcopy(pod)
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    if ADDED_ANNOTATION not in annotations:
        return pod
    added = _added_by_platform(pod)
    del annotations[ADDED_ANNOTATION]
    if not annotations:
        del metadata["annotations"]
    spec = pod.get("spec") or {}
    selector, tolerations = spec.get("nodeSelector") or {}, spec.get("tolerations") or []
    for key, value in added["nodeSelector"].items():
        if selector.get(key) == value:
            own = added["replaced"].get(key)
            if isinstance(own, str):
                selector[key] = own
            else:
                del selector[key]
    for toleration in added["tolerations"]:
        if toleration in tolerations:
            tolerations.remove(toleration)
    for name, now in (("nodeSelector", selector), ("tolerations", tolerations)):
        if name in spec and not now and added[name]:
            del spec[name]  # it held only what the platform added
    return pod


def with_requirements(pod: dict, needs: NodeRequirements) -> dict:
    """A copy of the pod template carrying ``needs`` in place of what an earlier call put in (``without_requirements``:
    a template copied for another pool, or a launch whose options dropped a key, keeps none of it): its node selector
    merged into the template's own (``needs`` wins a key both name), its tolerations added after the template's (none
    twice). What it adds is recorded in the ``infercap/node-requirements`` annotation, for the next call."""
    pod = without_requirements(pod)
    spec = pod.get("spec") or {}
    selector = dict(spec.get("nodeSelector") or {})
    set_keys = {key: value for key, value in needs.node_selector if selector.get(key) != value}
    replaced = {key: selector[key] for key in set_keys if key in selector}
    tolerations = list(spec.get("tolerations") or [])
    added_tolerations = []
    for toleration in (t.spec for t in needs.tolerations):
        if toleration not in tolerations:
            tolerations.append(toleration)
            added_tolerations.append(toleration)
    if not set_keys and not added_tolerations:
        return pod
    pod["spec"] = spec
    if set_keys:
        spec["nodeSelector"] = selector | set_keys
    if added_tolerations:
        spec["tolerations"] = tolerations
    record = {"nodeSelector": set_keys, "replaced": replaced, "tolerations": added_tolerations}
    annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ADDED_ANNOTATION] = json.dumps({k: v for k, v in record.items() if v}, sort_keys=True)
    return pod


def carries(pod: dict, needs: NodeRequirements) -> bool:
    """Whether a pod template carries every requirement in ``needs`` (a test's and a reader's check)."""
    spec = pod.get("spec") or {}
    selector, tolerations = spec.get("nodeSelector") or {}, spec.get("tolerations") or []
    return all(selector.get(k) == v for k, v in needs.node_selector) and all(
        t.spec in tolerations for t in needs.tolerations
    )


@dataclass
class RoomNode:
    """A schedulable GPU node as the room read it: its whole GPUs, its MIG slices per profile (the device plugin's
    ``nvidia.com/mig-<profile>`` under the mixed strategy), domain, the label values the requirements may select on
    and its taints that keep pods off (NoSchedule, NoExecute)."""

    name: str
    gpus: int
    domain: str | None = None
    labels: dict = field(default_factory=dict)
    taints: list = field(default_factory=list)
    slices: dict = field(default_factory=dict)


class Room(Cluster):
    """A cluster's GPU nodes with what live pods hold, where each endpoint has room only on the nodes its pods'
    requirements admit. As a Cluster it is every schedulable node with whole GPUs (the ledger's total free GPUs);
    ``held_slices`` (node → profile → slices live pods ask for) is None where the read counted no slices (a room
    published before it did: slices unknown)."""

    def __init__(
        self,
        nodes: Iterable[RoomNode],
        held: dict[str, int],
        *,
        label_keys: Iterable[str],
        held_slices: dict[str, dict[str, int]] | None = None,
    ):
        self.room_nodes = tuple(nodes)
        self.room_held = {name: int(count) for name, count in held.items()}
        self.room_held_slices = held_slices
        self.label_keys = frozenset(label_keys)
        super().__init__(Node(n.name, n.gpus, domain=n.domain) for n in self.room_nodes if n.gpus)
        self._take_held(self)
        self._groups: dict[tuple[NodeRequirements, int], int | None] = {}
        self.computations = 0  # distinct (requirements, size) placements run: one per set, however many endpoints
        self.mig_free: dict[str, int] = {}  # every schedulable node's free slices per profile, where read
        if held_slices is not None:
            for node in self.room_nodes:
                for profile in node.slices:
                    self.mig_free[profile] = self.mig_free.get(profile, 0) + self._free_slices(node, profile)

    def _take_held(self, cluster: Cluster) -> None:
        for name, count in self.room_held.items():
            if name in cluster.node:
                cluster.take(("pods", name), [Gpu(name, i) for i in range(min(count, cluster.node[name].gpus))])

    def _free_slices(self, node: RoomNode, profile: str) -> int:
        held = ((self.room_held_slices or {}).get(node.name) or {}).get(profile, 0)
        return max(0, int(node.slices.get(profile, 0)) - int(held))

    def admitting(self, needs: NodeRequirements) -> Cluster | None:
        """The nodes ``needs`` admits, with their holdings; None where it selects on a label the room did not read
        (unknown, not "no node"); an empty cluster where no node admits it."""
        if not needs.label_keys <= self.label_keys:
            return None
        cluster = Cluster(
            Node(n.name, n.gpus, domain=n.domain)
            for n in self.room_nodes
            if n.gpus and needs.admits(n.labels, n.taints)
        )
        self._take_held(cluster)
        return cluster

    def whole_groups(self, needs: NodeRequirements, size: int) -> int | None:
        """How many more replicas of ``size`` GPUs with ``needs`` fit (None: unknown), computed once per pair."""
        key = (needs, size)
        if key not in self._groups:
            self.computations += 1
            cluster = self.admitting(needs)
            self._groups[key] = None if cluster is None else (groups_that_fit(cluster, size) if cluster.nodes else 0)
        return self._groups[key]

    def slices_free(self, needs: NodeRequirements, mig_profile: str, strategy: str = "mixed") -> int | None:
        """How many more one-slice replicas of ``mig_profile`` with ``needs`` fit (None: unknown). Under the
        ``mixed`` strategy: the nodes' allocatable ``nvidia.com/mig-<profile>`` less what live pods ask of it, on
        the nodes ``needs`` admits; under ``single`` each slice is an ``nvidia.com/gpu`` of a node whose product
        label names the slice (the room read them as that node's slices: ``single_strategy_slice``), which ``needs``
        selects already. ValueError for an unknown strategy."""
        mig.resource_name(mig_profile, strategy)
        if self.room_held_slices is None or not needs.label_keys <= self.label_keys:
            return None
        return sum(
            self._free_slices(n, mig_profile)
            for n in self.room_nodes
            if n.slices.get(mig_profile) and needs.admits(n.labels, n.taints)
        )
