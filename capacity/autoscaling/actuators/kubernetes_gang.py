"""Gang placement in the Kubernetes actuator (docs/placement.md, "In the actuators"): the objects of ``gang.py``
created and scaled for an endpoint.

The cluster's gang scheduler is ``INFERCAP["GANG_SCHEDULER"]`` (``none``, ``kueue``, ``volcano``; its queue
``INFERCAP["GANG_QUEUE"]``); the shape is the launch hardware profile's (``gpus_per_node``,
``interconnect_domain_gpus``, ``domain_node_label``) and a replica's GPUs are its profile's ``gpus_per_replica``. With no
gang scheduler and one GPU a replica, nothing here applies: the Deployment is scaled as it is.

* A replica that fits one node stays a Deployment's pod: when the Deployment is scaled up from zero (no pod to roll),
  its pod template asks for all the group's GPUs, gets required node affinity on the domain label and the gang
  scheduler's fields, and the Deployment Kueue's queue label (``gang.single_node_template``).
* A replica larger than a node is a LeaderWorkerSet of one group (under Volcano with its PodGroup) built from the
  Deployment's pod template; the Deployment itself stays at 0. Scaling creates and deletes whole LeaderWorkerSets,
  labelled ``infercap/group-of: <deployment>``; their leader pods (worker index 0, named ``<set>-0``) are the
  replicas, registered like a Deployment's pods. A warm pool of such replicas is refused.

* A MIG profile's replica (``HardwareProfile.mig_profile``) is always one pod asking for one slice: the resource of
  ``mig.resource_name`` under ``INFERCAP["KUBERNETES_MIG_STRATEGY"]`` (``nvidia.com/mig-<profile>`` under mixed, where
  the pod then asks for no ``nvidia.com/gpu``; ``nvidia.com/gpu`` under single, on nodes whose product label names the
  slice), written into the Deployment's pod template like a group's, whatever the gang scheduler. Never a
  LeaderWorkerSet: a slice is a domain of one. An unknown strategy fails the launch (``ActuatorError``), not a sync.

Either way the pods carry the launch's node requirements (``kubernetes_objects.launch_requirements``: the GPU model,
the operators' node selector and tolerations), the same the ledger's room counts (``kubernetes_room.py``).
"""

import uuid

from django.conf import settings

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.gang import (
    LWS_API,
    VOLCANO_API,
    Gang,
    deployment_labels,
    one_gpu_template,
    replica_objects,
    single_node_template,
)
from capacity.autoscaling.actuators.kubernetes_objects import (
    ENDPOINT_ID,
    MERGE_PATCH,
    launch_requirements,
    merge_patch,
    mig_strategy,
)
from capacity.autoscaling.actuators.kubernetes_versions import KubernetesDeployments
from capacity.autoscaling.actuators.replica_shape import launch_hardware, profile_gpus
from endpoints.models import Endpoint, Replica
from placement import mig
from placement.node_requirements import with_requirements

GROUP_OF = "infercap/group-of"  # on a LeaderWorkerSet and its pods: the Deployment whose replicas it runs
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
COLLECTIONS = {"LeaderWorkerSet": (LWS_API, "leaderworkersets"), "PodGroup": (VOLCANO_API, "podgroups")}


def gang_settings() -> tuple[str, str]:
    conf = getattr(settings, "INFERCAP", {})
    return str(conf.get("GANG_SCHEDULER") or "none"), str(conf.get("GANG_QUEUE") or "infercap")


def slice_resource(hardware) -> str:
    """The extended resource a MIG profile's pod asks for one slice as; an ActuatorError naming the setting where the
    strategy is unknown."""
    try:
        return mig.resource_name(hardware.mig_profile, mig_strategy())
    except ValueError as exc:
        raise ActuatorError(f"INFERCAP['KUBERNETES_MIG_STRATEGY']: {exc}") from exc


def group_name(deployment: str) -> str:
    """A new LeaderWorkerSet's name: the Deployment's, cut so the set's pods and Service stay inside 63 characters."""
    return f"{deployment[:48].rstrip('-')}-g{uuid.uuid4().hex[:6]}"


def leader_group(replica: Replica) -> str:
    """The LeaderWorkerSet of a group replica: its leader pod is ``<set>-0``."""
    return (replica.actuator_ref or replica.name).rsplit("-", 1)[0]


class GangReplicas(KubernetesDeployments):
    def placement(self, endpoint: Endpoint) -> tuple[Gang, int] | None:
        """The gang and one replica's GPUs for this launch, or None where nothing is to be placed (no gang scheduler
        and one GPU a replica: today's Deployment as it is). A MIG profile's replica is one slice, a pod that is its
        own domain, whatever the gang scheduler."""
        scheduler, queue = gang_settings()
        hardware = launch_hardware(endpoint)
        if hardware is not None and hardware.mig_profile:
            resource = slice_resource(hardware)
            return Gang(scheduler=scheduler, queue=queue, gpus_per_node=1, domain_gpus=1, resource=resource), 1
        gpus = profile_gpus(hardware)
        if scheduler == "none" and gpus == 1:
            return None
        if hardware is None:
            return Gang(scheduler=scheduler, queue=queue), gpus
        shape = {
            "gpus_per_node": hardware.gpus_per_node,
            "domain_gpus": hardware.interconnect_domain_gpus,
            "domain_label": hardware.domain_node_label,
        }
        return Gang(scheduler=scheduler, queue=queue, **shape), gpus

    def multi_node(self, endpoint: Endpoint, *, strict: bool = False) -> bool:
        """Whether the launch's replicas are larger than a node (LeaderWorkerSets). A group no domain holds, or an
        unknown gang scheduler, is an ActuatorError with ``strict`` (a launch), else no (a sync or a scale-in of
        what runs already)."""
        try:
            placed = self.placement(endpoint)
            return placed is not None and placed[0].shares(placed[1])[0] > 1
        except ActuatorError:
            if strict:
                raise
            return False

    def place_pod_template(self, endpoint: Endpoint, deployment: str) -> None:
        """The Deployment's pod template as this launch needs it: the node requirements (``launch_requirements``: GPU
        model, node selector, tolerations) and, for a replica of several GPUs or under a gang scheduler, the whole
        group on labelled nodes through the gang scheduler. Called while the Deployment has no pods (a template change
        rolls none). What an earlier launch wrote and this one does not need (a selector key its options dropped, another
        GPU model) goes; nothing is written where nothing changes."""
        placed = self.placement(endpoint)
        needs = launch_requirements(endpoint)
        if placed is None and self.created_with().pop(deployment, None) == needs:
            return  # just created with them
        path = self._deployment_path(endpoint, deployment)
        try:
            current = self._request("GET", path)
        except ActuatorError as exc:
            if getattr(exc, "status_code", None) == 404:
                return  # no Deployment to place: the scale that follows says so
            raise
        before = (current.get("spec") or {}).get("template") or {}
        template = before
        if placed is not None:
            gang, gpus = placed
            template = single_node_template(template, gpus=gpus, gang=gang)
        else:
            template = one_gpu_template(template)  # no slice or 8-GPU ask left by another shape's launch
        template = with_requirements(template, needs)  # in place of those an earlier launch wrote
        patch: dict = {"spec": {"template": changes}} if (changes := merge_patch(before, template)) else {}
        if placed is not None and (labels := deployment_labels(placed[0])):
            patch["metadata"] = {"labels": labels}
        if patch:  # else the template carries the requirements already
            self._request("PATCH", path, json=patch, headers=MERGE_PATCH)

    # -- replicas larger than a node: one LeaderWorkerSet each ---------------------------------------------
    def _collection(self, endpoint: Endpoint, kind: str) -> str:
        api, plural = COLLECTIONS[kind]
        return f"/apis/{api}/namespaces/{self._ns(endpoint)}/{plural}"

    def groups(self, endpoint: Endpoint, deployment: str) -> list[dict]:
        """The LeaderWorkerSets running ``deployment``'s replicas, those being deleted left out."""
        listing = self._request(
            "GET", self._collection(endpoint, "LeaderWorkerSet"), params={"labelSelector": f"{GROUP_OF}={deployment}"}
        )
        return [g for g in listing.get("items", []) if not (g.get("metadata") or {}).get("deletionTimestamp")]

    def group_pods(self, endpoint: Endpoint, deployment: str) -> list[dict]:
        """The leader pods of ``deployment``'s groups: the replicas (the workers serve no HTTP)."""
        selector = f"{GROUP_OF}={deployment},{LWS_WORKER_INDEX}=0"
        listing = self._request(
            "GET", f"/api/v1/namespaces/{self._ns(endpoint)}/pods", params={"labelSelector": selector}
        )
        return listing.get("items", [])

    def launch_groups(self, endpoint: Endpoint, deployment: str, wanted: int) -> int:
        """Create LeaderWorkerSets (and PodGroups) from ``deployment``'s pod template until ``wanted`` exist; returns
        how many were created."""
        gang, gpus = self.placement(endpoint)
        needs = launch_requirements(endpoint)  # a bad option fails before anything is created
        existing = len(self.groups(endpoint, deployment))
        if existing >= wanted:
            return 0
        if existing == 0:
            self.apply_launch_env(endpoint, deployment=deployment)  # the CPU allotment, into the template
        template = self._request("GET", self._deployment_path(endpoint, deployment))
        pod = with_requirements((template.get("spec") or {}).get("template") or {}, needs)
        pod.setdefault("metadata", {}).setdefault("labels", {})[GROUP_OF] = deployment
        labels = {**((template.get("metadata") or {}).get("labels") or {}), ENDPOINT_ID: str(endpoint.pk)}
        labels[GROUP_OF] = deployment
        for _ in range(wanted - existing):
            name = group_name(deployment)
            objects = replica_objects(
                name=name, namespace=self._ns(endpoint), labels=labels, pod=pod, gpus=gpus, gang=gang
            )
            for body in objects:  # the PodGroup first: the set's pods name it
                self._request("POST", self._collection(endpoint, body["kind"]), json=body)
        return wanted - existing

    def delete_group(self, endpoint: Endpoint, replica: Replica) -> None:
        """Delete a group replica's LeaderWorkerSet (its pods go with it) and its PodGroup, if any."""
        name = leader_group(replica)
        for kind in ("LeaderWorkerSet", "PodGroup"):  # a PodGroup too where none was made: 404, as is no CRD
            try:
                self._request(
                    "DELETE", f"{self._collection(endpoint, kind)}/{name}", params={"propagationPolicy": "Background"}
                )
            except ActuatorError as exc:
                if getattr(exc, "status_code", None) != 404:
                    raise
