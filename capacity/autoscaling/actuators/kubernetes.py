"""The Kubernetes actuator: one Deployment per endpoint, scaled through its ``scale`` subresource.

``Endpoint.launch_options``: ``namespace`` (default ``default``), ``deployment`` (default the endpoint name with
characters Kubernetes refuses replaced), ``port`` (the vLLM container port, default 8000). Pods matching the
Deployment's selector are registered as replicas (name = pod name, url = pod IP). Scale-in picks the drained pod
itself: it gets ``controller.kubernetes.io/pod-deletion-cost: -1000`` before the replica count drops, so the
ReplicaSet removes that pod and not a busy one. A restart deletes the pod; the Deployment replaces it.

The API server comes from ``INFERCAP["KUBERNETES_API_URL"]`` (or in-cluster: ``KUBERNETES_SERVICE_HOST`` and the
service-account token). No warm pool here: standby pods would need a second Deployment.
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


def deployment_name(endpoint: Endpoint) -> str:
    name = (endpoint.launch_options or {}).get("deployment") or endpoint.name
    return re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:63] or f"endpoint-{endpoint.pk}"


class KubernetesActuator(Actuator):
    name = "kubernetes"
    supports_standby = False

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

    def _scale_path(self, endpoint: Endpoint) -> str:
        return f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments/{deployment_name(endpoint)}/scale"

    def get_scale(self, endpoint: Endpoint) -> tuple[int, str]:
        scale = self._request("GET", self._scale_path(endpoint))
        return int(scale.get("spec", {}).get("replicas") or 0), scale.get("status", {}).get("selector", "")

    def set_scale(self, endpoint: Endpoint, replicas: int) -> None:
        self._request(
            "PATCH", self._scale_path(endpoint), json={"spec": {"replicas": max(0, replicas)}}, headers=MERGE_PATCH
        )

    def pods(self, endpoint: Endpoint) -> list[dict]:
        _, selector = self.get_scale(endpoint)
        if not selector:
            raise ActuatorError(f"deployment {deployment_name(endpoint)} reports no selector")
        listing = self._request(
            "GET", f"/api/v1/namespaces/{self._ns(endpoint)}/pods", params={"labelSelector": selector}
        )
        return listing.get("items", [])

    # -- the actuator interface ---------------------------------------------------------------------------
    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        if standby:
            raise ActuatorError("the kubernetes actuator keeps no warm pool")
        # The target counts registered pods, not spec.replicas: pods the ReplicaSet is still creating are already
        # in spec, so asking for spec + count on every tick until they register would overshoot.
        registered = endpoint.replicas.filter(
            actuator=self.name, state__in=(ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)
        ).count()
        current, _ = self.get_scale(endpoint)
        if registered + count > current:
            if current == 0:
                self.apply_launch_env(endpoint)
            self.set_scale(endpoint, registered + count)
        return []

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
            for replica in group:
                self._request(
                    "PATCH",
                    f"/api/v1/namespaces/{self._ns(endpoint)}/pods/{replica.actuator_ref or replica.name}",
                    json={"metadata": {"annotations": {DELETION_COST: "-1000"}}},
                    headers=MERGE_PATCH,
                )
            current, _ = self.get_scale(endpoint)
            self.set_scale(endpoint, current - len(group))
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
