"""The Deployments an endpoint's replicas run in (docs in ``kubernetes.py``'s module docstring, "Versions" and "Spot
pools"): one per version, per spot pool and per disaggregated role, created from the template Deployment on first
use and deleted once a retired version has no replica left."""

import copy

from capacity.autoscaling.actuators.base import ActuatorError, version_endpoint
from capacity.autoscaling.actuators.gang import one_gpu_template
from capacity.autoscaling.actuators.kubernetes_api import KubernetesApi
from capacity.autoscaling.actuators.kubernetes_objects import (
    CAPACITY,
    ENDPOINT_ID,
    ENDPOINT_NAME,
    LIVE,
    PD_ROLE,
    TEMPLATE,
    VERSION,
    deployment_name,
    launch_requirements,
    role_deployment_name,
    spot_deployment_name,
    version_deployment_name,
    with_kv_transfer,
)
from capacity.runtimes import vllm
from endpoints.models import (
    Endpoint,
    EndpointVersion,
    ReplicaRole,
    ReplicaState,
    RolloutState,
    ServingMode,
    active_rollout,
)
from placement.node_requirements import with_requirements


def kv_transfer_flag(endpoint: Endpoint, role: str) -> str:
    """A prefill or decode pod's ``--kv-transfer-config``: NIXL only, the shared-storage connector being one host's
    (vLLM's ExampleConnector over a local directory; docs/disaggregation.md)."""
    if endpoint.kv_connector != "nixl":
        raise ActuatorError(
            f"{endpoint.name}: kv_connector {endpoint.kv_connector!r} moves KV through one host's directory; "
            "a disaggregated endpoint on Kubernetes moves it with nixl"
        )
    return vllm.kv_transfer_config(role, "nixl")


class KubernetesDeployments(KubernetesApi):
    # -- versions -----------------------------------------------------------------------------------------
    @staticmethod
    def _version(endpoint: Endpoint, version_id: int | None) -> tuple[Endpoint, int | None]:
        """The endpoint as ``version_id`` launches it (its launch options name the template) and its number."""
        version = (
            EndpointVersion.objects.filter(pk=version_id, endpoint_id=endpoint.pk).first() if version_id else None
        )
        if version is None:
            return endpoint, None
        return version_endpoint(endpoint, version), version.number

    def deployment_for(
        self, endpoint: Endpoint, version_id: int | None, *, spot: bool = False, role: str = ReplicaRole.MIXED
    ) -> str:
        view, number = self._version(endpoint, version_id)
        name = role_deployment_name(version_deployment_name(view, number), role)
        return spot_deployment_name(name) if spot else name

    def ensure_version_deployment(
        self, endpoint: Endpoint, number: int | None, *, spot: bool = False, role: str = ReplicaRole.MIXED
    ) -> str:
        """Version ``number``'s Deployment (its spot pool's with ``spot``, a disaggregated pool's with ``role``:
        labelled ``infercap/pd-role``, its engine given the role's ``--kv-transfer-config``), created from its
        template (0 replicas) when it does not exist yet, its pods carrying the launch's node requirements
        (``launch_requirements``: on a spot pool the spot node selector and tolerations too)."""
        name, template_name = version_deployment_name(endpoint, number), deployment_name(endpoint)
        versioned = name != template_name
        name = role_deployment_name(name, role)
        if spot:
            name = spot_deployment_name(name)
        elif not versioned and role == ReplicaRole.MIXED:
            return name
        needs = launch_requirements(endpoint, spot=spot)  # a bad option fails before anything is created
        try:
            self._request("GET", self._deployment_path(endpoint, name))
            return name
        except ActuatorError as exc:
            if getattr(exc, "status_code", None) != 404:
                raise
        template = self._request("GET", self._deployment_path(endpoint, template_name))
        spec = template.get("spec") or {}
        added = ({VERSION: str(number)} if versioned else {}) | ({CAPACITY: "spot"} if spot else {})
        added |= {PD_ROLE: role} if role != ReplicaRole.MIXED else {}
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {}).update(added)
        # The GPU model, selector and tolerations, in place of those the template carries for its own pods (another
        # profile's model, a selector key this version's options dropped).
        pod = with_requirements(spec.get("template") or {}, needs)
        # One whole GPU where the template holds another shape's ask (the slice an earlier MIG launch of the endpoint
        # wrote, the 8 GPUs and gang affinity of a TP-8 endpoint's template): this pool may be one whole GPU; a pool
        # of another shape gets its own back as its launch places the template.
        pod = one_gpu_template(pod)
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(added)
        if role != ReplicaRole.MIXED:
            with_kv_transfer(pod, kv_transfer_flag(endpoint, role))
        labels = {
            **((template.get("metadata") or {}).get("labels") or {}),
            **added,
            ENDPOINT_ID: str(endpoint.pk),
        }
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": self._ns(endpoint),
                "labels": labels,
                # The endpoint's name for humans: an annotation, as names may hold characters labels refuse.
                "annotations": {TEMPLATE: template_name, ENDPOINT_NAME: endpoint.name},
            },
            "spec": {
                **{k: v for k, v in spec.items() if k in ("strategy", "minReadySeconds", "revisionHistoryLimit")},
                "replicas": 0,
                "selector": selector,
                "template": pod,
            },
        }
        try:
            self._request("POST", f"/apis/apps/v1/namespaces/{self._ns(endpoint)}/deployments", json=body)
            self.created_with()[name] = needs
        except ActuatorError as exc:
            if getattr(exc, "status_code", None) != 409:  # another worker created it first
                raise
        return name

    def created_with(self) -> dict:
        """Deployment name → the node requirements this actuator created it with a moment ago (its pod template carries
        them: ``place_pod_template`` need not read it back)."""
        return self.__dict__.setdefault("_created_with", {})

    def _deployments(self, endpoint: Endpoint) -> dict[str, tuple[int | None, bool, str]]:
        """Deployment name → (the version its pods run, spot, role), for every version that may have pods: the
        serving one, those with live replicas, and both sides of an active rollout; their spot pools' Deployments
        too when the endpoint has a pool or spot replicas are left, and their prefill and decode pools' when it is
        disaggregated or role replicas are left."""
        spot_ids = set(
            endpoint.replicas.filter(actuator=self.name, hardware_profile__isnull=False)
            .exclude(state=ReplicaState.STOPPED)
            .values_list("version_id", flat=True)
        )
        if endpoint.spot_hardware_profile_id:
            spot_ids.add(endpoint.current_version_id)
        ids = {endpoint.current_version_id}
        ids |= set(
            endpoint.replicas.filter(actuator=self.name, is_standby=False)
            .exclude(state=ReplicaState.STOPPED)
            .values_list("version_id", flat=True)
        )
        rollout = active_rollout(endpoint)
        if rollout is not None:
            ids |= {rollout.from_version_id, rollout.to_version_id}
        out: dict[str, tuple[int | None, bool, str]] = {}
        for version_id in sorted(ids | spot_ids, key=lambda v: (v is None, v or 0)):
            if version_id in ids:
                out.setdefault(self.deployment_for(endpoint, version_id), (version_id, False, ReplicaRole.MIXED))
            if version_id in spot_ids:
                out.setdefault(self.deployment_for(endpoint, version_id, spot=True), (version_id, True, "mixed"))
        roles = set(
            endpoint.replicas.filter(actuator=self.name, is_standby=False)
            .exclude(state=ReplicaState.STOPPED)
            .exclude(role=ReplicaRole.MIXED)
            .values_list("version_id", "role")
        )
        if endpoint.serving_mode == ServingMode.DISAGGREGATED:
            roles |= {(endpoint.current_version_id, ReplicaRole.PREFILL), (endpoint.current_version_id, "decode")}
        for version_id, role in sorted(roles, key=lambda vr: (vr[0] is None, vr[0] or 0, vr[1])):
            out.setdefault(self.deployment_for(endpoint, version_id, role=role), (version_id, False, role))
        return out

    def _retire(self, endpoint: Endpoint, version_ids: set) -> None:
        """Delete the ``-v<N>`` Deployments of versions that no longer serve, once none of their replicas is left."""
        keep = {endpoint.current_version_id}
        rollout = active_rollout(endpoint)
        if rollout is not None and rollout.state not in (RolloutState.PROMOTING, RolloutState.ROLLING_BACK):
            keep |= {rollout.from_version_id, rollout.to_version_id}
        for version_id in version_ids - keep - {None}:
            view, number = self._version(endpoint, version_id)
            name = version_deployment_name(view, number)
            if endpoint.replicas.filter(
                actuator=self.name, version_id=version_id, state__in=(*LIVE, ReplicaState.DRAINING)
            ).exists():
                continue  # a draining pod still finishes its requests
            # The template Deployment stays (at 0 replicas); a version's own and every spot pool's go.
            pools = [spot_deployment_name(name), *(role_deployment_name(name, r) for r in ("prefill", "decode"))]
            for gone in pools + ([name] if name != deployment_name(view) else []):
                try:
                    self._request(
                        "DELETE", self._deployment_path(view, gone), params={"propagationPolicy": "Background"}
                    )
                except ActuatorError as exc:
                    if getattr(exc, "status_code", None) != 404:
                        raise
