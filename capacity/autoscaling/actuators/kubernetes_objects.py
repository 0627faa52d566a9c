"""The Kubernetes objects an endpoint owns, by name and label: its Deployments (one per version, a standby pool, a
spot twin), the labels and annotations the actuator reads back from pods, and what a launch's pods require of a node
(GPU model, node selector, tolerations). The actuator that creates and scales them is ``capacity/autoscaling/actuators/kubernetes.py``."""

import copy
import re
from datetime import datetime
from pathlib import Path

from django.conf import settings
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core.exceptions import ConfigError

from capacity.autoscaling.actuators.base import ActuatorError
from capacity.autoscaling.actuators.replica_shape import launch_hardware
from endpoints.models import Endpoint, ReplicaState
from placement import mig
from placement.node_requirements import NodeRequirements, endpoint_requirements

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


STRATEGIC_PATCH = {"Content-Type": "application/strategic-merge-patch+json"}


ROLE = "infercap/role"


PROMOTED = "infercap/promoted"


VERSION = "infercap/version"


TEMPLATE = "infercap/template"


ENDPOINT_ID = "infercap/endpoint-id"


ENDPOINT_NAME = "infercap/endpoint-name"


CAPACITY = "infercap/capacity-type"


# A disaggregated endpoint's pools (docs/disaggregation.md): prefill and decode pods carry their role.
PD_ROLE = "infercap/pd-role"


# A spot pod the scheduler cannot place for this long is taken as no spot to be had: a node autoscaler (Karpenter,
# the cluster autoscaler) provisions a node for an unschedulable pod within a minute or two when the market has one.
SPOT_SCHEDULING_GRACE_S = 180.0


LIVE = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY)


def kube_config(path: str | None) -> SingleConfig:
    """The current context of the kubeconfig at ``path``, else of the environment (lightkube's ``from_env``: the
    pod's service account, ``$KUBECONFIG``, ``~/.kube/config``); none is an ``ActuatorError``."""
    try:
        config = KubeConfig.from_file(path) if path else KubeConfig.from_env(service_account=SA_DIR)
        single = config.get()
    except (ConfigError, OSError, KeyError, ValueError) as exc:
        raise ActuatorError(
            f"no Kubernetes API: set INFERCAP['KUBERNETES_API_URL'], a kubeconfig or run in a cluster ({exc})"
        ) from exc
    if single is None or single.cluster is None:
        raise ActuatorError("no Kubernetes API: the kubeconfig has no current context")
    return single


def deployment_name(endpoint: Endpoint) -> str:
    """The operator's ``deployment`` launch option, else ``infercap-ep-<endpoint id>``: never derived from the
    endpoint name, which tenants choose (``Llama.3.70B`` and ``llama_3_70b`` would both become ``llama-3-70b``)."""
    name = (endpoint.launch_options or {}).get("deployment")
    if not name:
        return f"infercap-ep-{endpoint.pk}"
    return re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:63] or f"infercap-ep-{endpoint.pk}"


def standby_deployment_name(endpoint: Endpoint) -> str:
    name = (endpoint.launch_options or {}).get("standby_deployment")
    if name:
        return re.sub(r"[^a-z0-9-]+", "-", str(name).lower()).strip("-")[:63] or f"infercap-ep-{endpoint.pk}-standby"
    return f"{deployment_name(endpoint)[:55].rstrip('-')}-standby"


def version_deployment_name(endpoint: Endpoint, number: int | None) -> str:
    """The Deployment running one version: the endpoint's own for version 1 (or before versions existed),
    ``<deployment>-v<N>`` for version N (``endpoint`` carries that version's launch options)."""
    base = deployment_name(endpoint)
    if not number or number == 1:
        return base
    return f"{base[: 62 - len(str(number))].rstrip('-')}-v{number}"


def role_deployment_name(base: str, role: str) -> str:
    """The Deployment of a disaggregated endpoint's ``role`` pool beside ``base`` (a version's); ``base`` for mixed."""
    return base if role == "mixed" else f"{base[:55].rstrip('-')}-{role}"


def with_kv_transfer(pod: dict, flag: str) -> None:
    """Add vLLM's ``--kv-transfer-config`` to the pod template's first container (the engine), which must not have
    one of its own: the platform sets it from the role."""
    containers = pod.get("spec", {}).get("containers") or []
    if not containers:
        raise ActuatorError("the template Deployment's pod has no container to give --kv-transfer-config")
    args = list(containers[0].get("args") or [])
    if any(str(a).startswith("--kv-transfer-config") for a in args):
        raise ActuatorError("the template Deployment sets --kv-transfer-config: the platform sets it from the role")
    containers[0]["args"] = [*args, f"--kv-transfer-config={flag}"]


def spot_deployment_name(base: str) -> str:
    """The spot pool's Deployment beside ``base`` (a version's on-demand one)."""
    return f"{base[:58].rstrip('-')}-spot"


def launch_is_spot(endpoint: Endpoint) -> bool:
    """Whether this launch is of the endpoint's spot pool (``services.pool_endpoint`` on its spot profile)."""
    pool = getattr(endpoint, "launch_hardware_profile_id", None)
    return bool(pool) and pool == endpoint.spot_hardware_profile_id


def mig_strategy() -> str:
    """How the cluster's NVIDIA device plugin advertises MIG slices (``INFERCAP["KUBERNETES_MIG_STRATEGY"]``:
    ``mixed``, ``single``; placement/mig.py), checked where a MIG profile's launch reads it."""
    return mig.strategy_of(getattr(settings, "INFERCAP", {}).get("KUBERNETES_MIG_STRATEGY"))


def launch_requirements(endpoint: Endpoint, *, spot: bool | None = None) -> NodeRequirements:
    """What this launch's pods require of a node (``placement.node_requirements``, the same answer the
    ledger's room uses): the launch hardware profile's GPU product (a MIG slice's under the cluster's strategy), the
    operators' launch options ``node_selector`` and ``tolerations``, and on a spot pool ``spot_node_selector`` and
    ``spot_tolerations``. A bad shape, or an unknown MIG strategy, is an ActuatorError that names it, not a pod the
    API server refuses later."""
    spot = launch_is_spot(endpoint) if spot is None else spot
    try:
        return endpoint_requirements(
            endpoint.launch_options, launch_hardware(endpoint), spot=spot, mig_strategy=mig_strategy()
        )
    except ValueError as exc:
        raise ActuatorError(f"{endpoint.name}: {exc}") from exc


def merge_patch(before: dict, after: dict) -> dict:
    """The JSON merge patch (RFC 7386, ``MERGE_PATCH``) that turns ``before`` into ``after``: what changed, and null
    for each key ``after`` no longer has (sending ``after`` alone would keep them: a merge never removes a key);
    lists go whole. Empty where nothing changed."""
    patch: dict = {key: None for key in sorted(before.keys() - after.keys())}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            if inner := merge_patch(old, value):
                patch[key] = inner
        elif key not in before or old != value:
            patch[key] = copy.deepcopy(value)
    return patch


def unschedulable_for(status: dict, *, now: float) -> float | None:
    """Seconds a Pending pod has been unschedulable (its PodScheduled condition False for reason Unschedulable),
    else None."""
    if status.get("phase") != "Pending":
        return None
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            try:
                since = datetime.fromisoformat(str(cond.get("lastTransitionTime")).replace("Z", "+00:00")).timestamp()
            except ValueError:
                return 0.0
            return max(0.0, now - since)
    return None


def is_promoted(pod: dict) -> bool:
    return (pod.get("metadata", {}).get("labels") or {}).get(PROMOTED) == "true"
