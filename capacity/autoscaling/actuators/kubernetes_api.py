"""The Kubernetes API as the actuator speaks it: one httpx client to the API server, the paths of an endpoint's
Deployments, their scale subresource and pods. The API server comes from ``INFERCAP["KUBERNETES_API_URL"]``, else
from the environment as kubectl reads it (the pod's service account, a kubeconfig with its exec plugins), through
lightkube's configuration. The actuator never waits on the API server: each tick reads what is there and asks for
what it wants, so it needs no watch."""

import httpx
from django.conf import settings
from lightkube.config.client_adapter import ConnectionParams

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.kubernetes_objects import (
    MERGE_PATCH,
    deployment_name,
    kube_config,
    standby_deployment_name,
)
from endpoints.models import Endpoint, Replica

LIST_PAGE = 500
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubernetesApi:
    """The client: the API server and credentials, and the requests every part of the actuator makes."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        api_url: str | None = None,
        token: str | None = None,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
        kubeconfig: str | None = None,
    ) -> None:
        """The API server and credentials: ``api_url`` (or ``INFERCAP["KUBERNETES_API_URL"]``) with ``token`` when
        given, an API server named explicitly (``kubectl proxy``, a test double); otherwise lightkube's reading of the
        environment, as kubectl's: in a pod the service account (its token file re-read when the kubelet rotates
        it), else ``kubeconfig`` (``INFERCAP["KUBECONFIG"]``), ``$KUBECONFIG`` or ``~/.kube/config``, with its
        current context's client certificates, tokens or exec plugins (cloud IAM logins). One client, its
        connections reused, for the actuator's life."""
        conf = getattr(settings, "INFERCAP", {})
        url = (api_url or conf.get("KUBERNETES_API_URL") or "").rstrip("/")
        timeout = httpx.Timeout(5.0)
        namespace = "default"
        if url:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            params = {
                "base_url": url,
                "headers": headers,
                "verify": verify,
                "timeout": timeout,
                "transport": transport,
            }
        else:
            config = kube_config(kubeconfig or conf.get("KUBECONFIG") or None)
            namespace = config.namespace  # the context's, or in a pod its service account's
            # The transport is set after: lightkube's dataclasses.asdict would hand httpx a deep copy of it.
            params = ConnectionParams(timeout=timeout, trust_env=False).httpx_params(config)
            params["transport"] = transport
        # Where an endpoint's Deployments live unless its launch options say: the setting, else the credentials'.
        self.namespace = conf.get("KUBERNETES_NAMESPACE") or namespace
        self.api_url = str(params["base_url"]).rstrip("/")
        self.client = httpx.Client(**params)
        self.spot_shortage: dict[int, str] = {}  # endpoint id → why its last sync found no spot capacity

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
            error = ActuatorError(f"kubernetes API {method} {path}: {response.status_code} {message}")
            error.status_code = response.status_code
            raise error
        return response.json() if response.content else {}

    def _ns(self, endpoint: Endpoint) -> str:
        return str((endpoint.launch_options or {}).get("namespace") or self.namespace)

    def _deployment_path(self, endpoint: Endpoint, name: str | None = None) -> str:
        return f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments/{name or deployment_name(endpoint)}"

    def _scale_path(self, endpoint: Endpoint, *, standby: bool = False, deployment: str | None = None) -> str:
        name = standby_deployment_name(endpoint) if standby else (deployment or deployment_name(endpoint))
        return f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments/{name}/scale"

    def get_scale(
        self, endpoint: Endpoint, *, standby: bool = False, deployment: str | None = None
    ) -> tuple[int, str]:
        scale = self._request("GET", self._scale_path(endpoint, standby=standby, deployment=deployment))
        return int(scale.get("spec", {}).get("replicas") or 0), scale.get("status", {}).get("selector", "")

    def set_scale(
        self, endpoint: Endpoint, replicas: int, *, standby: bool = False, deployment: str | None = None
    ) -> None:
        self._request(
            "PATCH",
            self._scale_path(endpoint, standby=standby, deployment=deployment),
            json={"spec": {"replicas": max(0, replicas)}},
            headers=MERGE_PATCH,
        )

    def pods(self, endpoint: Endpoint, *, standby: bool = False, deployment: str | None = None) -> list[dict]:
        _, selector = self.get_scale(endpoint, standby=standby, deployment=deployment)
        if not selector:
            name = standby_deployment_name(endpoint) if standby else (deployment or deployment_name(endpoint))
            raise ActuatorError(f"deployment {name} reports no selector")
        listing = self._request(
            "GET", f"/api/v1/namespaces/{self._ns(endpoint)}/pods", params={"labelSelector": selector}
        )
        return listing.get("items", [])

    def _pod_path(self, endpoint: Endpoint, replica: Replica) -> str:
        return f"/api/v1/namespaces/{self._ns(endpoint)}/pods/{replica.actuator_ref or replica.name}"

    # -- the cluster's nodes, for the ledger's room (kubernetes_room.py) --------------------------------------
    def _list_all(self, path: str, **params) -> list[dict]:
        """Every item of a collection, page by page (``limit`` and ``continue``), so a large cluster's listing does not
        arrive as one reply the API server has to build whole."""
        items: list[dict] = []
        params = {"limit": LIST_PAGE, **params}
        while True:
            page = self._request("GET", path, params=params)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            params = {**params, "continue": token}

    def nodes(self) -> list[dict]:
        """Every node of the cluster (needs ``list`` on ``nodes``: a ClusterRole)."""
        return self._list_all("/api/v1/nodes")

    def running_pods(self) -> list[dict]:
        """Every pod of every namespace that is not terminated (phase neither Succeeded nor Failed): those hold
        the GPUs they requested on their node, whoever started them."""
        return self._list_all("/api/v1/pods", fieldSelector=LIVE_PODS)
