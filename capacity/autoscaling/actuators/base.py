"""The actuator interface: what the autoscaler asks of whatever runs replicas (local processes, Kubernetes).

An actuator owns the replicas it started (``Replica.actuator`` = its name) and only ever stops those; replicas
registered by hand (``static``) count as capacity but are left alone. Lifecycle moves go through
``capacity.lifecycle.replica_transition`` so every change is recorded and the proxy's snapshot follows.
"""

import contextlib
import copy
import logging
from abc import ABC, abstractmethod
from pathlib import Path

import httpx
from django.conf import settings

from capacity.lifecycle import IllegalTransition, replica_transition
from capacity.runtimes import vllm
from capacity.runtimes.replica_http import replica_client
from endpoints.models import Endpoint, EndpointVersion, Replica, ReplicaRole, ReplicaState

log = logging.getLogger(__name__)


def version_endpoint(endpoint: Endpoint, version: EndpointVersion) -> Endpoint:
    """An unsaved copy of the endpoint carrying the version's fields, for the actuators to launch that version."""
    view = copy.copy(endpoint)
    view.model_profile_id = version.model_profile_id
    view.hardware_profile_id = version.hardware_profile_id
    view.runtime = version.runtime
    view.launch_options = dict(version.launch_options or {})
    view.launch_version_id = version.pk  # read by the actuators when they create the Replica row
    for cached in ("model_profile", "hardware_profile"):
        view._state.fields_cache.pop(cached, None)  # Django's copy gives the copy its own cache
    return view


def launch_version_id(endpoint: Endpoint) -> int | None:
    """The version a launch starts: the one a rollout asked for (``version_endpoint``), else the endpoint's
    serving version (the autoscaler only ever scales that one)."""
    return getattr(endpoint, "launch_version_id", None) or endpoint.current_version_id


def launch_role(endpoint: Endpoint) -> str:
    """The role the replicas of this launch take (``services.pool_endpoint`` sets it: prefill or decode on a
    disaggregated endpoint); mixed by default."""
    return str(getattr(endpoint, "launch_role", None) or ReplicaRole.MIXED)


def kv_storage_dir(endpoint: Endpoint) -> Path:
    """Where a disaggregated endpoint's prefill replicas leave the prompts' KV for its decode replicas with the
    shared-storage connector (one host: docs/disaggregation.md): a directory of its own under the var dir."""
    return Path(settings.VAR_DIR) / "kv" / f"endpoint-{endpoint.pk}"


def kv_transfer_flag(endpoint: Endpoint) -> str | None:
    """The ``--kv-transfer-config`` JSON of a replica of this launch (``launch_role``), from the endpoint's
    ``kv_connector``; None for a mixed replica. Creates the shared directory it names."""
    role = launch_role(endpoint)
    if role == ReplicaRole.MIXED:
        return None
    path = None
    if endpoint.kv_connector == "shared_storage":
        path = kv_storage_dir(endpoint)
        path.mkdir(parents=True, exist_ok=True)
    try:
        return vllm.kv_transfer_config(role, endpoint.kv_connector, storage_path=str(path) if path else None)
    except ValueError as exc:
        raise ActuatorError(f"{endpoint.name}: {exc}") from exc


class ActuatorError(Exception):
    """The actuator could not do what it was asked (no free port, API refused, bad launch options)."""


class Actuator(ABC):
    name: str = ""
    supports_versions = True  # can run replicas of two endpoint versions side by side (what a rollout needs)

    @abstractmethod
    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        """Start ``count`` replicas (registered as pending/starting); they turn ready in ``sync`` once healthy."""

    @abstractmethod
    def terminate(self, replicas: list[Replica], *, reason: str) -> None:
        """Stop these replicas now (drained or never ready) and mark them stopped."""

    @abstractmethod
    def sync(self, endpoint: Endpoint) -> None:
        """Bring rows in line with reality: starting → ready once healthy, dead ones → failed → stopped."""

    def launches_undone_on_error(self):
        """A context manager around a caller's transaction that launches: what the block started and could not
        register is stopped when it raises. Nothing to undo by default (the local actuator's processes have)."""
        return contextlib.nullcontext()

    def restart(self, replica: Replica) -> list[Replica]:
        """Replace a failed or hung replica: stop it, start another of the same kind (for the health checker)."""
        replica.refresh_from_db()
        if replica.actuator != self.name:
            raise ActuatorError(f"replica {replica.pk} belongs to actuator {replica.actuator!r}, not {self.name!r}")
        standby = replica.is_standby
        self.terminate([replica], reason="restart")  # also when the row is already stopped: the process may not be
        endpoint = replica.endpoint
        if replica.version_id and replica.version_id != endpoint.current_version_id:
            endpoint = version_endpoint(endpoint, replica.version)  # a replica of a rollout's new version
        if replica.hardware_profile_id or replica.role != ReplicaRole.MIXED:
            endpoint = copy.copy(endpoint)
            if replica.hardware_profile_id:
                endpoint.launch_hardware_profile_id = replica.hardware_profile_id  # its replacement on the same pool
            if replica.role == ReplicaRole.PREFILL:
                endpoint.launch_options = dict(endpoint.prefill_launch_options or {})  # the prefill pool's
            endpoint.launch_role = replica.role  # and in the same role (docs/disaggregation.md)
        return self.launch(endpoint, 1, standby=standby)

    def rollout_refusal(self, endpoint: Endpoint, from_version, to_version) -> str | None:
        """Why a rollout of ``endpoint`` from one version to the other cannot run on this actuator, or None."""
        if not self.supports_versions:
            return f"the {self.name} actuator cannot run two versions side by side; no rollout possible"
        return None

    def owns(self, replica: Replica) -> bool:
        return replica.actuator == self.name

    def promote(self, replica: Replica) -> None:
        """Turn a ready standby into serving capacity (the proxy snapshot picks it up on this save). Actuators
        whose standbys differ from serving replicas outside the database (Kubernetes labels) do that first."""
        replica.is_standby = False
        replica.save(update_fields=["is_standby"])

    # -- helpers shared by the implementations ------------------------------------------------------------
    @staticmethod
    def move(replica: Replica, to_state: str, reason: str) -> bool:
        """Transition if still allowed; a concurrent health check may have moved it first."""
        try:
            replica_transition(replica=replica, to_state=to_state, reason=reason)
            return True
        except IllegalTransition as exc:
            log.info("actuator: %s", exc)
            return False

    @staticmethod
    def stop_row(replica: Replica, reason: str) -> None:
        """Walk a replica to stopped from wherever it is (ready must drain first: ready → draining → stopped)."""
        replica.refresh_from_db(fields=["state"])
        if replica.state == ReplicaState.READY:
            Actuator.move(replica, ReplicaState.DRAINING, reason)
        if replica.state != ReplicaState.STOPPED:
            Actuator.move(replica, ReplicaState.STOPPED, reason)

    @staticmethod
    def healthy(url: str, timeout_s: float = 0.5) -> bool:
        try:
            return replica_client().get(f"{url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False


class StaticActuator(Actuator):
    """Hand-registered replicas: nothing to start or stop; the autoscaler records decisions but cannot act."""

    name = "static"

    def launch(self, endpoint: Endpoint, count: int, *, standby: bool = False) -> list[Replica]:
        raise ActuatorError("the static actuator cannot start replicas; register them by hand")

    def terminate(self, replicas: list[Replica], *, reason: str) -> None:
        for replica in replicas:
            self.stop_row(replica, reason)

    def sync(self, endpoint: Endpoint) -> None:
        pass

    def restart(self, replica: Replica) -> list[Replica]:
        raise ActuatorError("the static actuator cannot restart replicas")
