"""The Kubernetes actuator: one Deployment per endpoint, scaled through its ``scale`` subresource.

``Endpoint.launch_options``: ``namespace`` (default ``INFERCAP["KUBERNETES_NAMESPACE"]``, else the kubeconfig
context's or, in a pod, its service account's: the worker's own namespace; else ``default``), ``deployment`` (default ``infercap-ep-<endpoint
id>``: never the tenant-chosen endpoint name, two of which could map to one Deployment), ``port`` (the vLLM container port, default 8000). Pods matching the
Deployment's selector are registered as replicas (name = pod name, url = pod IP). Scale-in picks the drained pod
itself: it gets ``controller.kubernetes.io/pod-deletion-cost: -1000`` before the replica count drops, so the
ReplicaSet removes that pod and not a busy one. A restart deletes the pod; the Deployment replaces it.

Warm pool: a second Deployment, ``<deployment>-standby`` (launch option ``standby_deployment``), with the same pod
template except the label ``infercap/role: standby`` where the serving one has ``infercap/role: replica``. Its pods
are registered as standby replicas (``is_standby``: booted and healthy, but neither routed to nor counted as
capacity). Promoting one relabels the pod ``infercap/role: replica`` (plus ``infercap/promoted: "true"``): the
Service and the serving Deployment's selector now include it, and the standby ReplicaSet, whose selector it no
longer matches, releases it and starts a replacement, so the pool refills by itself. A promoted pod belongs to no
ReplicaSet (its ``pod-template-hash`` is the standby one's): scale-in deletes it instead of lowering the serving
Deployment's count, and launches do not count it against that Deployment's ``spec.replicas``.

Versions: each endpoint version runs in its own Deployment, so a rollout runs two side by side. Version 1 runs in
the endpoint's Deployment (the one the operator set up); version N in ``<deployment>-v<N>``, created on its first
launch as a copy of the Deployment its launch options name (the template) with ``infercap/version: "N"`` added to
its labels, selector and pod labels, 0 replicas, then the version's CPU allotment patched in and scaled like any
other. Pods carrying ``infercap/version`` are left out of the template Deployment's listing (its selector matches
them too; ControllerRef keeps the ReplicaSets apart) and registered with their version. Once a retired version has
no replica left, its ``-v<N>`` Deployment is deleted (the template one is only scaled to 0). A version that changes
the model, hardware or runtime must name a template prepared for it (launch option ``deployment``): a copy of the
old one would run the old model.

Spot pools (docs/algorithms.md#spot-capacity): an endpoint's spot replicas run in ``<deployment>-spot`` (per version:
``<deployment>-v<N>-spot``), created on the first spot launch as a copy of the template like a version's, with
``infercap/capacity-type: spot`` added to its labels, selector and pod labels, and its pods scheduled on spot nodes:
besides the node requirements every pod of the endpoint carries (below), the pod template's ``nodeSelector`` gets the
launch option ``spot_node_selector`` (default Karpenter's ``karpenter.sh/capacity-type: spot``; GKE's is
``cloud.google.com/gke-spot: "true"``) and its tolerations the launch option ``spot_tolerations``. Its pods are
registered on the endpoint's spot profile (``Replica.hardware_profile``: cost rows and statements price them as spot)
and left out of the on-demand Deployments' listings, whose selectors match them too. The two pools scale apart; a
reclaimed node's pod is replaced by its ReplicaSet, once the market has capacity again.

Gang placement (docs/placement.md, "In the actuators"): replicas of several GPUs ask for their whole group inside one
interconnect domain, through the cluster's gang scheduler; a replica larger than a node is a LeaderWorkerSet
(``kubernetes_gang.py``); a MIG profile's replica is one pod asking for one slice, as the cluster's
``INFERCAP["KUBERNETES_MIG_STRATEGY"]`` names it (docs/placement.md, "MIG slices"). Whatever the shape, the pods carry
the launch's node requirements (``kubernetes_objects.launch_requirements``, the answer the ledger's room counts with):
a ``nodeSelector`` of the launch hardware profile's ``gpu_product`` on its ``gpu_product_label`` (default
``nvidia.com/gpu.product``; no product: any GPU node) merged with the launch option ``node_selector`` (the product
wins its label), and the launch option ``tolerations``; on a spot pool the spot ones too. They are merged into the
template's own (theirs win a key both name; no toleration twice): in the template Deployment's pod template while it
has no pods (a change rolls none), in a version's, spot or disaggregated pool's Deployment when it is created, in each
LeaderWorkerSet. A bad option shape is refused when the endpoint is written (``endpoints.validation``) and an
ActuatorError at launch.

The API client is ``kubernetes_api.py`` (the API server as kubectl finds it); the Deployments of versions, spot and
disaggregated pools are made in ``kubernetes_versions.py``.
"""

import copy
import logging
import time

from django.db.models import Q

from capacity.autoscaling.actuators.base import (
    Actuator,
    ActuatorError,
    launch_role,
    launch_version_id,
    version_endpoint,
)
from capacity.autoscaling.actuators.kubernetes_gang import GROUP_OF, GangReplicas
from capacity.autoscaling.actuators.kubernetes_objects import (
    CAPACITY,
    DELETION_COST,
    LIVE,
    MERGE_PATCH,
    PD_ROLE,
    PROMOTED,
    ROLE,
    SPOT_SCHEDULING_GRACE_S,
    STRATEGIC_PATCH,
    VERSION,
    deployment_name,
    is_promoted,
    standby_deployment_name,
    unschedulable_for,
    version_deployment_name,
)
from capacity.runtimes.launch_env import kubernetes_container_patch
from endpoints.models import Endpoint, Replica, ReplicaRole, ReplicaState

log = logging.getLogger(__name__)


class KubernetesActuator(GangReplicas, Actuator):
    name = "kubernetes"
    supports_standby = True

    def _uses_warm_pool(self, endpoint: Endpoint) -> bool:
        return endpoint.warm_pool_size > 0 or endpoint.replicas.filter(actuator=self.name, is_standby=True).exists()

    # -- the actuator interface ---------------------------------------------------------------------------
    def rollout_refusal(self, endpoint: Endpoint, from_version, to_version) -> str | None:
        if self._uses_warm_pool(endpoint):
            return "the Kubernetes warm pool runs the serving template's pods: set warm_pool_size to 0 for a rollout"
        old, new = version_endpoint(endpoint, from_version), version_endpoint(endpoint, to_version)
        pod_changes = [
            f
            for f in ("model_profile", "hardware_profile", "runtime")
            if from_version.spec()[f] != to_version.spec()[f]
        ]
        if pod_changes and deployment_name(old) == deployment_name(new):
            return (
                f"version {to_version.number} changes {', '.join(pod_changes)} but names the same template Deployment "
                f"({deployment_name(new)}): set its launch option 'deployment' to a Deployment prepared for it"
            )
        return None

    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        pool_id = getattr(endpoint, "launch_hardware_profile_id", None)  # a spot pool's (services.pool_endpoint)
        role = launch_role(endpoint)
        if role != ReplicaRole.MIXED:
            endpoint, pool_id = self._role_view(endpoint, role, pool_id, standby)
        if pool_id and standby:
            raise ActuatorError("the warm pool is on-demand: a standby never launches on a spot pool")
        if pool_id and (shortage := self.spot_shortage.pop(endpoint.pk, None)):
            raise ActuatorError(shortage)  # the caller's back-off puts the count on on-demand
        # The target counts registered pods, not spec.replicas: pods the ReplicaSet is still creating are already
        # in spec, so asking for spec + count on every tick until they register would overshoot.
        registered = endpoint.replicas.filter(actuator=self.name, is_standby=standby, state__in=LIVE)
        name, view = None, endpoint
        if standby and self.deployment_for(endpoint, endpoint.current_version_id) != deployment_name(endpoint):
            # The standby Deployment copies the template, which runs version 1: its pods would serve the wrong one.
            raise ActuatorError(
                f"the warm pool of {endpoint.name} runs the template Deployment's pods, not the serving version's "
                f"({self.deployment_for(endpoint, endpoint.current_version_id)})"
            )
        if not standby:
            version_id = launch_version_id(endpoint)
            view, number = self._version(endpoint, version_id)
            name = self.ensure_version_deployment(view, number, spot=bool(pool_id), role=role)
            mine = Q(version_id__in=[version_id] if version_id else [])
            if version_deployment_name(view, number) == deployment_name(view):
                mine |= Q(version__isnull=True)  # registered before versions existed
            registered = registered.filter(mine, hardware_profile__isnull=not pool_id, role=role)
        registered = registered.count()
        if self.multi_node(view, strict=True):  # one LeaderWorkerSet a replica (kubernetes_gang.py)
            if standby:
                raise ActuatorError(f"{endpoint.name}: replicas larger than a node have no warm pool")
            self.launch_groups(view, name, registered + count)
            return []
        if not standby and not pool_id and self._uses_warm_pool(endpoint):
            # Promoted standbys are serving replicas, but not the serving Deployment's pods.
            registered -= sum(1 for pod in self.pods(endpoint) if is_promoted(pod))
        current, _ = self.get_scale(endpoint, standby=standby, deployment=name)
        if registered + count > current:
            if current == 0:  # no pod to roll: the template may change
                self.place_pod_template(view, name or standby_deployment_name(endpoint))
                if not standby:
                    self.apply_launch_env(view, deployment=name)
            self.set_scale(endpoint, registered + count, standby=standby, deployment=name)
        return []

    @staticmethod
    def _role_view(endpoint: Endpoint, role: str, pool_id, standby: bool) -> tuple[Endpoint, int | None]:
        """A prefill or decode pool's launch: the endpoint's own placement (namespace, template Deployment) under
        the prefill pool's options; its hardware is the template's (no spot pool, no warm pool for a role)."""
        if role == ReplicaRole.PREFILL:
            own = Endpoint.objects.filter(pk=endpoint.pk).values_list("launch_options", flat=True).first() or {}
            endpoint = copy.copy(endpoint)
            endpoint.launch_options = {**own, **(endpoint.launch_options or {})}
            if pool_id == endpoint.prefill_hardware_profile_id:
                pool_id = None
        if pool_id or standby:
            raise ActuatorError(f"{endpoint.name}: a {role} pool runs neither on spot nor from a warm pool here")
        return endpoint, None

    def promote(self, replica: Replica) -> None:
        """Relabel the standby pod into the serving set, then count it as capacity (see the module docstring)."""
        endpoint = replica.endpoint
        self._request(
            "PATCH",
            self._pod_path(endpoint, replica),
            json={"metadata": {"labels": {ROLE: "replica", PROMOTED: "true"}}},
            headers=MERGE_PATCH,
        )
        super().promote(replica)

    def apply_launch_env(self, endpoint: Endpoint, *, deployment: str | None = None) -> None:
        """Set the pod template's CPU request/limit and thread variables from the ``cpus`` launch option.

        Only while the Deployment has no pods (called when scaling up from zero): a template change then starts no
        rollout of running pods. Without a ``cpus`` option the template's own limit and ``resourceFieldRef`` rule.
        """
        try:
            patch = kubernetes_container_patch(endpoint.launch_options, runtime=endpoint.runtime)
        except ValueError as exc:
            raise ActuatorError(f"bad launch options for {endpoint.name}: {exc}") from exc
        if patch is not None:
            path = self._deployment_path(endpoint, deployment)
            self._request(
                "PATCH", path, json=patch, headers=STRATEGIC_PATCH
            )  # the pods show up in sync() once the ReplicaSet has created them

    def terminate(self, replicas: list[Replica], *, reason: str) -> None:
        by_endpoint: dict[int, list[Replica]] = {}
        for replica in replicas:
            by_endpoint.setdefault(replica.endpoint_id, []).append(replica)
        for group in by_endpoint.values():
            endpoint = group[0].endpoint
            gangs = [r for r in group if not r.is_standby and self._in_group(endpoint, r)]
            for replica in gangs:  # a replica larger than a node: its LeaderWorkerSet goes whole
                self.delete_group(endpoint, replica)
            promoted = set()
            if self._uses_warm_pool(endpoint):
                promoted = {p["metadata"]["name"] for p in self.pods(endpoint) if is_promoted(p)}
            for standby in (True, False):
                members = [r for r in group if r.is_standby == standby and r not in gangs]
                owned = [r for r in members if (r.actuator_ref or r.name) not in promoted]
                for replica in members:
                    if replica not in owned:  # a promoted pod has no ReplicaSet: delete it
                        self._request("DELETE", self._pod_path(endpoint, replica))
                        continue
                    self._request(
                        "PATCH",
                        self._pod_path(endpoint, replica),
                        json={"metadata": {"annotations": {DELETION_COST: "-1000"}}},
                        headers=MERGE_PATCH,
                    )
                by_deployment: dict[str | None, list[Replica]] = {}
                for replica in owned:
                    spot = replica.hardware_profile_id is not None
                    name = (
                        None
                        if standby
                        else self.deployment_for(endpoint, replica.version_id, spot=spot, role=replica.role)
                    )
                    by_deployment.setdefault(name, []).append(replica)
                for name, rows in by_deployment.items():
                    current, _ = self.get_scale(endpoint, standby=standby, deployment=name)
                    self.set_scale(endpoint, current - len(rows), standby=standby, deployment=name)
            for replica in group:
                self.stop_row(replica, reason)
            self._retire(endpoint, {r.version_id for r in group if not r.is_standby})

    def _in_group(self, endpoint: Endpoint, replica: Replica) -> bool:
        """Whether the replica is a LeaderWorkerSet's leader (its version's replicas are larger than a node)."""
        return self.multi_node(self._version(endpoint, replica.version_id)[0])

    def restart(self, replica: Replica) -> list[Replica]:
        endpoint = replica.endpoint
        if self._in_group(endpoint, replica):
            # Its group is replaced whole, under a new name: a pod recreated under its old name keeps no row.
            return Actuator.restart(self, replica)
        self._request("DELETE", f"/api/v1/namespaces/{self._ns(endpoint)}/pods/{replica.actuator_ref or replica.name}")
        self.stop_row(replica, "restart: pod deleted, the deployment replaces it")
        return []

    def _listed_pods(self, endpoint: Endpoint) -> tuple[dict, dict, set, set, dict]:
        """Every pod of the endpoint's Deployments: name → pod, name → version, the spot pool's and the standby ones,
        name → role (a disaggregated pool's pods)."""
        pods, version_of, on_spot, role_of = {}, {}, set(), {}
        for deployment, (version_id, spot, role) in self._deployments(endpoint).items():
            view, number = self._version(endpoint, version_id)
            template = deployment == deployment_name(view)
            versioned = version_deployment_name(view, number) != deployment_name(view)
            grouped = self.multi_node(view)  # its replicas are LeaderWorkerSets' leaders
            try:
                listing = (
                    self.group_pods(endpoint, deployment) if grouped else self.pods(endpoint, deployment=deployment)
                )
            except ActuatorError as exc:
                if template or getattr(exc, "status_code", None) != 404:
                    raise
                listing = []  # a version's or spot pool's Deployment not created yet, or already retired
            for pod in listing:
                labels = pod.get("metadata", {}).get("labels") or {}
                if (not versioned and VERSION in labels) or (not spot and CAPACITY in labels):
                    continue  # a -v<N> or -spot Deployment's pod: this one's selector matches it too
                if (GROUP_OF in labels) != grouped:
                    continue  # a LeaderWorkerSet's pod, which the Deployment's selector matches too
                if labels.get(PD_ROLE, ReplicaRole.MIXED) != role:
                    continue  # a -prefill or -decode Deployment's pod, listed by its own
                pods[pod["metadata"]["name"]] = pod
                version_of[pod["metadata"]["name"]] = version_id
                role_of[pod["metadata"]["name"]] = role
                if spot:
                    on_spot.add(pod["metadata"]["name"])
        standby_pods = set()
        standby_listing: list[dict] = []
        if self._uses_warm_pool(endpoint):
            try:
                standby_listing = self.pods(endpoint, standby=True)
            except ActuatorError as exc:  # no standby Deployment: the serving replicas still sync
                log.warning("warm pool of %s: %s", endpoint.name, exc)
            for pod in standby_listing:
                name = pod["metadata"]["name"]
                if name not in pods:  # a pod being promoted can show in both listings for a moment
                    pods[name] = pod
                    standby_pods.add(name)
        return pods, version_of, on_spot, standby_pods, role_of

    def _give_back_unplaced(self, endpoint: Endpoint, unplaced: list[tuple[Replica, float]]) -> None:
        """No spot node to be had: give the pods back (the spot Deployment shrinks) and let the next spot launch fail,
        which puts the count on on-demand for the back-off (services.launch_capped)."""
        worst = max(waited for _, waited in unplaced)
        reason = f"no spot capacity: {len(unplaced)} spot pod(s) unschedulable for up to {worst:.0f} s"
        self.terminate([row for row, _ in unplaced], reason=reason)
        self.spot_shortage[endpoint.pk] = reason

    def sync(self, endpoint: Endpoint) -> None:
        port = int((endpoint.launch_options or {}).get("port", 8000))
        pods, version_of, on_spot, standby_pods, role_of = self._listed_pods(endpoint)
        now, unplaced = time.time(), []
        rows = {r.name: r for r in endpoint.replicas.filter(actuator=self.name).exclude(state=ReplicaState.STOPPED)}
        # A pod we stopped can stay listed for a while (terminating); it must not come back as a new replica.
        stopped = set(
            endpoint.replicas.filter(actuator=self.name, state=ReplicaState.STOPPED, name__in=list(pods)).values_list(
                "name", flat=True
            )
        )
        for name, pod in pods.items():
            meta, status = pod.get("metadata", {}), pod.get("status", {})
            if name in stopped or (meta.get("deletionTimestamp") and name not in rows):
                continue
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
            ip = status.get("podIP") or ""
            row = rows.get(name)
            if row is None:
                row = Replica.objects.create(
                    endpoint=endpoint,
                    name=name,
                    actuator=self.name,
                    actuator_ref=name,
                    url=f"http://{ip}:{port}" if ip else "",
                    concurrency_limit=endpoint.concurrency_limit,
                    version_id=version_of.get(name, endpoint.current_version_id),  # standbys: the serving one
                    is_standby=name in standby_pods,
                    # A spot pod is priced on the pool's profile (none named any more: the endpoint's own).
                    hardware_profile_id=endpoint.spot_hardware_profile_id if name in on_spot else None,
                    role=role_of.get(name, ReplicaRole.MIXED),  # a disaggregated pool's pod
                )
                self.move(row, ReplicaState.STARTING, f"pod {status.get('phase', 'Pending')}")
            if ip and not row.url:
                row.url = f"http://{ip}:{port}"
                row.save(update_fields=["url"])
            phase = status.get("phase")
            if phase in ("Failed", "Succeeded") and row.state != ReplicaState.FAILED:
                self.move(row, ReplicaState.FAILED, f"pod phase {phase}")
            elif ready and row.url and row.state in (ReplicaState.PENDING, ReplicaState.STARTING):
                self.move(row, ReplicaState.READY, "pod ready")
            elif name in on_spot and (waited := unschedulable_for(status, now=now)) is not None:
                if waited > SPOT_SCHEDULING_GRACE_S and row.state in (ReplicaState.PENDING, ReplicaState.STARTING):
                    unplaced.append((row, waited))
        if unplaced:
            self._give_back_unplaced(endpoint, unplaced)
            for row, _ in unplaced:
                rows.pop(row.name, None)
        for name, row in rows.items():
            if name not in pods:
                self.stop_row(row, "pod gone")
