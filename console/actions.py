"""Writes the console performs, delegated to the apps' services so the console and the REST API behave the same
(validation, overcommit refusal, audit entries). Live events follow from console.signals on commit.

Each is named after the service it reaches with an ``_action`` suffix: it takes a form's cleaned data and the
acting user, and refuses what the platform's rules forbid with ``ActionRefused`` (shown to the user).
"""

from __future__ import annotations

from django.db import transaction

from billing.alerts import alert_acknowledge
from billing.models import Alert
from capacity.autoscaling.actuators import ActuatorError
from capacity.autoscaling.pins import DEFAULT_PIN_MINUTES
from capacity.autoscaling.services import replica_drain
from capacity.services import reservation_sell
from endpoints import services as endpoint_services
from endpoints.models import Endpoint, Replica, ReplicaState
from endpoints.rollouts import services as rollout_services
from tenants.models import CapacityReservation
from tenants.services import audit_log


class ActionRefused(Exception):
    """The request was well-formed but the platform's rules refuse it (message shown to the user)."""


def endpoint_create_action(*, form_data: dict, actor) -> Endpoint:
    return endpoint_services.endpoint_create(actor=actor, **form_data)


@transaction.atomic
def endpoint_scale_action(
    *,
    endpoint: Endpoint,
    min_replicas: int,
    max_replicas: int,
    desired_replicas: int,
    actor,
    pin_minutes: int = DEFAULT_PIN_MINUTES,
) -> Endpoint:
    """New bounds first (endpoint.update audit entry when they change), then the desired count (endpoint.scale), a
    pin on an autoscaled endpoint."""
    if (endpoint.min_replicas, endpoint.max_replicas) != (min_replicas, max_replicas):
        endpoint = endpoint_services.endpoint_update(
            endpoint=endpoint, actor=actor, min_replicas=min_replicas, max_replicas=max_replicas
        )
    return endpoint_services.endpoint_scale(
        endpoint=endpoint, desired_replicas=desired_replicas, actor=actor, reason="console", pin_minutes=pin_minutes
    )


def replica_drain_action(*, replica: Replica, actor, reason: str = "") -> Replica:
    """Stop routing new requests to a ready replica; the autoscaler stops it once its in-flight requests finish."""
    if replica.state != ReplicaState.READY:
        raise ActionRefused(f"{replica.name} is {replica.get_state_display().lower()}; only a ready replica drains")
    with transaction.atomic():
        try:
            replica_drain(replica=replica, reason=reason or "console drain")
        except ActuatorError as exc:
            raise ActionRefused(str(exc)) from exc
        replica.refresh_from_db(fields=["state"])
        if replica.state != ReplicaState.DRAINING:  # a health check moved it first
            raise ActionRefused(f"{replica.name} is now {replica.get_state_display().lower()}; not drained")
        audit_log(
            actor=actor,
            action="replica.drain",
            obj=replica,
            tenant=replica.endpoint.owner_tenant,
            detail={"endpoint": replica.endpoint.name, "replica": replica.name, "reason": reason},
        )
    return replica


def replica_attach_action(*, endpoint: Endpoint, form_data: dict, actor) -> Replica:
    """A running vLLM server as a replica of ``endpoint``; a server that is not one is a field error on ``url``."""
    data = {k: v for k, v in form_data.items() if v not in (None, "")}
    return endpoint_services.replica_attach(endpoint=endpoint, actor=actor, **data)


def reservation_sell_action(*, form_data: dict, actor) -> CapacityReservation:
    """capacity.services refuses a sale beyond the overcommit limit with a ValidationError on mu_per_min."""
    data = dict(form_data)
    return reservation_sell(
        tenant=data.pop("tenant"),
        endpoint=data.pop("endpoint"),
        mu_per_min=data.pop("mu_per_min"),
        actor=actor,
        **data,
    )


@transaction.atomic
def alert_acknowledge_action(*, alert: Alert, actor, note: str = "") -> Alert:
    locked = Alert.objects.select_for_update().select_related("slo").get(pk=alert.pk)
    if locked.acknowledged_at is not None:
        raise ActionRefused(f"already acknowledged by {locked.acknowledged_by} at {locked.acknowledged_at:%H:%M}")
    if locked.state == Alert.State.RESOLVED:
        raise ActionRefused("this alert is resolved; there is nothing left to acknowledge")
    return alert_acknowledge(alert=locked, user=actor, note=note)  # audited there, as from the API


@transaction.atomic
def rollout_start_action(*, endpoint: Endpoint, form_data: dict, actor):
    """Start a rollout to the chosen version, or to a new one made from the changed model / launch options."""
    data = dict(form_data)
    version = data.pop("to_version", None)
    changes = {k: v for k in ("model_profile", "launch_options") if (v := data.pop(k, None)) is not None}
    if version is None:
        version = rollout_services.create_version(endpoint=endpoint, user=actor, note="console", **changes)
    if data.get("canary_steps") is None:
        data.pop("canary_steps", None)
    return rollout_services.start_rollout(endpoint=endpoint, to_version=version, user=actor, **data)


def rollout_control_action(*, rollout, action: str, actor, reason: str = ""):
    """pause / resume / promote / rollback through the rollout services (event and audit entry there)."""
    run = {
        "pause": rollout_services.pause_rollout,
        "resume": rollout_services.resume_rollout,
        "promote": rollout_services.promote_rollout,
        "rollback": rollout_services.rollback_rollout,
    }[action]
    return run(rollout=rollout, user=actor, reason=reason)
