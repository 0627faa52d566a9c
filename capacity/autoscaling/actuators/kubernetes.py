"""The Kubernetes actuator: one Deployment per endpoint, scaled through its ``scale`` subresource.

``Endpoint.launch_options``: ``namespace`` (default ``default``), ``deployment`` (default the endpoint name with
characters Kubernetes refuses replaced), ``port`` (the vLLM container port, default 8000). Pods matching the
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

The API server comes from ``INFERCAP["KUBERNETES_API_URL"]`` (or in-cluster: ``KUBERNETES_SERVICE_HOST`` and the
service-account token).
"""

import logging
import os
import re
from pathlib import Path

import httpx
from django.conf import settings

from capacity.autoscaling.actuators.base import Actuator, ActuatorError
from endpoints.models import Endpoint, Replica, ReplicaState
from endpoints.runtimes.launch_env import kubernetes_container_patch

log = logging.getLogger(__name__)

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
STRATEGIC_PATCH = {"Content-Type": "application/strategic-merge-patch+json"}
ROLE = "infercap/role"
PROMOTED = "infercap/promoted"


def deployment_name(endpoint: Endpoint) -> str:
    name = (endpoint.launch_options or {}).get("deployment") or endpoint.name
    return re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:63] or f"endpoint-{endpoint.pk}"


def standby_deployment_name(endpoint: Endpoint) -> str:
    name = (endpoint.launch_options or {}).get("standby_deployment")
    if name:
        return re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:63] or f"endpoint-{endpoint.pk}-standby"
    return f"{deployment_name(endpoint)[:55].rstrip('-')}-standby"


def _promoted(pod: dict) -> bool:
    return (pod.get("metadata", {}).get("labels") or {}).get(PROMOTED) == "true"


class KubernetesActuator(Actuator):
    name = "kubernetes"
    supports_standby = True
    # One Deployment per endpoint: its pods all run one pod template, so two versions cannot run side by side.
    supports_versions = False

    def __init__(
        self,
        *,
        api_url: str | None = None,
        token: str | None = None,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        conf = getattr(settings, "INFERCAP", {})
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        in_cluster = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}" if host else None
        self.api_url = (api_url or conf.get("KUBERNETES_API_URL") or in_cluster or "").rstrip("/")
        if not self.api_url:
            raise ActuatorError("no Kubernetes API: set INFERCAP['KUBERNETES_API_URL'] or run in a cluster")
        if token is None and (SA_DIR / "token").exists():
            token = (SA_DIR / "token").read_text().strip()
            verify = str(SA_DIR / "ca.crt")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(
            base_url=self.api_url, headers=headers, verify=verify, timeout=5.0, transport=transport
        )

    # -- API calls ----------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ActuatorError(f"kubernetes API {method} {path}: {exc}") from exc
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise ActuatorError(f"kubernetes API {method} {path}: {response.status_code} {message}")
        return response.json() if response.content else {}

    @staticmethod
    def _ns(endpoint: Endpoint) -> str:
        return str((endpoint.launch_options or {}).get("namespace") or "default")

    def _scale_path(self, endpoint: Endpoint, *, standby: bool = False) -> str:
        name = standby_deployment_name(endpoint) if standby else deployment_name(endpoint)
        return f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments/{name}/scale"

    def get_scale(self, endpoint: Endpoint, *, standby: bool = False) -> tuple[int, str]:
        scale = self._request("GET", self._scale_path(endpoint, standby=standby))
        return int(scale.get("spec", {}).get("replicas") or 0), scale.get("status", {}).get("selector", "")

    def set_scale(self, endpoint: Endpoint, replicas: int, *, standby: bool = False) -> None:
        self._request(
            "PATCH",
            self._scale_path(endpoint, standby=standby),
            json={"spec": {"replicas": max(0, replicas)}},
            headers=MERGE_PATCH,
        )

    def pods(self, endpoint: Endpoint, *, standby: bool = False) -> list[dict]:
        _, selector = self.get_scale(endpoint, standby=standby)
        if not selector:
            name = standby_deployment_name(endpoint) if standby else deployment_name(endpoint)
            raise ActuatorError(f"deployment {name} reports no selector")
        listing = self._request(
            "GET", f"/api/v1/namespaces/{self._ns(endpoint)}/pods", params={"labelSelector": selector}
        )
        return listing.get("items", [])

    def _pod_path(self, endpoint: Endpoint, replica: Replica) -> str:
        return f"/api/v1/namespaces/{self._ns(endpoint)}/pods/{replica.actuator_ref or replica.name}"

    def _uses_warm_pool(self, endpoint: Endpoint) -> bool:
        return endpoint.warm_pool_size > 0 or endpoint.replicas.filter(actuator=self.name, is_standby=True).exists()

    # -- the actuator interface ---------------------------------------------------------------------------
    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        # The target counts registered pods, not spec.replicas: pods the ReplicaSet is still creating are already
        # in spec, so asking for spec + count on every tick until they register would overshoot.
        registered = endpoint.replicas.filter(
            actuator=self.name,
            is_standby=standby,
            state__in=(ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY),
        ).count()
        if not standby and self._uses_warm_pool(endpoint):
            # Promoted standbys are serving replicas, but not the serving Deployment's pods.
            registered -= sum(1 for pod in self.pods(endpoint) if _promoted(pod))
        current, _ = self.get_scale(endpoint, standby=standby)
        if registered + count > current:
            if current == 0 and not standby:
                self.apply_launch_env(endpoint)
            self.set_scale(endpoint, registered + count, standby=standby)
        return []

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

    def apply_launch_env(self, endpoint: Endpoint) -> None:
        """Set the pod template's CPU request/limit and thread variables from the ``cpus`` launch option.

        Only while the Deployment has no pods (called when scaling up from zero): a template change then starts no
        rollout of running pods. Without a ``cpus`` option the template's own limit and ``resourceFieldRef`` rule.
        """
        try:
            patch = kubernetes_container_patch(endpoint.launch_options, runtime=endpoint.runtime)
        except ValueError as exc:
            raise ActuatorError(f"bad launch options for {endpoint.name}: {exc}") from exc
        if patch is not None:
            path = f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments/{deployment_name(endpoint)}"
            self._request(
                "PATCH", path, json=patch, headers=STRATEGIC_PATCH
            )  # the pods show up in sync() once the ReplicaSet has created them

    def terminate(self, replicas: list[Replica], *, reason: str) -> None:
        by_endpoint: dict[int, list[Replica]] = {}
        for replica in replicas:
            by_endpoint.setdefault(replica.endpoint_id, []).append(replica)
        for group in by_endpoint.values():
            endpoint = group[0].endpoint
            promoted = set()
            if self._uses_warm_pool(endpoint):
                promoted = {p["metadata"]["name"] for p in self.pods(endpoint) if _promoted(p)}
            for standby in (True, False):
                members = [r for r in group if r.is_standby == standby]
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
                if owned:
                    current, _ = self.get_scale(endpoint, standby=standby)
                    self.set_scale(endpoint, current - len(owned), standby=standby)
            for replica in group:
                self.stop_row(replica, reason)

    def restart(self, replica: Replica) -> list[Replica]:
        endpoint = replica.endpoint
        self._request("DELETE", f"/api/v1/namespaces/{self._ns(endpoint)}/pods/{replica.actuator_ref or replica.name}")
        self.stop_row(replica, "restart: pod deleted, the deployment replaces it")
        return []

    def sync(self, endpoint: Endpoint) -> None:
        port = int((endpoint.launch_options or {}).get("port", 8000))
        pods = {p["metadata"]["name"]: p for p in self.pods(endpoint)}
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
                    version_id=endpoint.current_version_id,  # one Deployment per endpoint: its serving version
                    is_standby=name in standby_pods,
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
        for name, row in rows.items():
            if name not in pods:
                self.stop_row(row, "pod gone")
