"""Writes the console performs, each with an audit entry. Live events follow from console.signals on commit.

Where another app grows a service for the same write (endpoints.services, capacity.services), these
delegate to it so the console and the REST API behave the same.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from billing.models import Alert
from endpoints.models import Endpoint, Replica, ReplicaState
from endpoints.services import replica_transition
from tenants.models import CapacityReservation
from tenants.services import audit_log


class ActionRefused(Exception):
    """The request was well-formed but the platform's rules refuse it (message shown to the user)."""


@transaction.atomic
def endpoint_create(*, form_data: dict, actor) -> Endpoint:
    endpoint = Endpoint(**form_data)
    endpoint.full_clean()
    endpoint.save()
    audit_log(
        actor=actor, action="endpoint.create", obj=endpoint, tenant=endpoint.owner_tenant,
        detail={"name": endpoint.name, "desired_replicas": endpoint.desired_replicas},
    )
    return endpoint


@transaction.atomic
def endpoint_scale(*, endpoint: Endpoint, min_replicas: int, max_replicas: int, desired_replicas: int, actor) -> Endpoint:
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    before = {"min": locked.min_replicas, "max": locked.max_replicas, "desired": locked.desired_replicas}
    locked.min_replicas, locked.max_replicas, locked.desired_replicas = min_replicas, max_replicas, desired_replicas
    locked.full_clean()
    locked.save(update_fields=["min_replicas", "max_replicas", "desired_replicas", "updated_at"])
    audit_log(
        actor=actor, action="endpoint.scale", obj=locked, tenant=locked.owner_tenant,
        detail={"before": before, "after": {"min": min_replicas, "max": max_replicas, "desired": desired_replicas}},
    )
    return locked


def replica_drain(*, replica: Replica, actor, reason: str = "") -> Replica:
    """Stop routing new requests to a ready replica; the actuator stops it once its in-flight requests finish."""
    if replica.state != ReplicaState.READY:
        raise ActionRefused(f"{replica.name} is {replica.get_state_display().lower()}; only a ready replica drains")
    with transaction.atomic():
        replica_transition(replica=replica, to_state=ReplicaState.DRAINING, reason=reason or "console drain")
        audit_log(
            actor=actor, action="replica.drain", obj=replica, tenant=replica.endpoint.owner_tenant,
            detail={"endpoint": replica.endpoint.name, "replica": replica.name, "reason": reason},
        )
    return replica


@transaction.atomic
def reservation_sell(*, form_data: dict, have_mu_per_min: float, overcommit_limit: float, actor) -> CapacityReservation:
    """Refuse a sale that would take sold capacity above have × overcommit limit."""
    endpoint = Endpoint.objects.select_for_update().get(pk=form_data["endpoint"].pk)
    sold = sum(endpoint.reservations.values_list("mu_per_min", flat=True))
    ceiling = have_mu_per_min * overcommit_limit
    if sold + form_data["mu_per_min"] > ceiling + 1e-9:
        raise ActionRefused(
            f"overcommit: {sold:g} MU/min already sold on {endpoint.name}, capacity {have_mu_per_min:g} MU/min × "
            f"limit {overcommit_limit:g} = {ceiling:g}; at most {max(0.0, ceiling - sold):g} more can be sold"
        )
    reservation = CapacityReservation(**form_data)
    reservation.full_clean()
    reservation.save()
    audit_log(
        actor=actor, action="reservation.sell", obj=reservation, tenant=reservation.tenant,
        detail={"endpoint": endpoint.name, "mu_per_min": reservation.mu_per_min, "priority": reservation.priority},
    )
    return reservation


@transaction.atomic
def alert_acknowledge(*, alert: Alert, actor, note: str = "") -> Alert:
    locked = Alert.objects.select_for_update().select_related("slo").get(pk=alert.pk)
    if locked.acknowledged_at is not None:
        raise ActionRefused(f"already acknowledged by {locked.acknowledged_by} at {locked.acknowledged_at:%H:%M}")
    locked.acknowledged_at = timezone.now()
    locked.acknowledged_by = actor
    locked.save(update_fields=["acknowledged_at", "acknowledged_by"])
    audit_log(
        actor=actor, action="alert.acknowledge", obj=locked, tenant=locked.slo.tenant,
        detail={"slo": locked.slo.name, "note": note},
    )
    return locked
