"""Receivers that turn committed writes into live console events (replica states, alerts, autoscaler decisions),
and close a suspended tenant's sockets.

Each event goes to the operators group and to the groups of the tenants allowed to see its endpoint,
after the transaction commits (console.live.publish).
"""

from django.db.models.signals import post_save
from django.dispatch import receiver

from billing.models import Alert
from capacity.models import AutoscalerDecision
from console.access import tenant_ids_seeing
from console.live import publish, tenant_sockets_close
from endpoints.models import Endpoint, Replica, RolloutEvent
from endpoints.selectors import replica_placement_redacted
from tenants.models import Tenant


@receiver(post_save, sender=Replica, dispatch_uid="console.replica_saved")
def replica_saved(sender, instance: Replica, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    endpoint = instance.endpoint
    payload = {
        "endpoint_id": endpoint.pk,
        "endpoint": endpoint.name,
        "replica_id": instance.pk,
        "replica": instance.name,
        "state": instance.state,
        "created": created,
    }
    # Operators and the owner hear the replica's name; a tenant reserving on a shared endpoint hears of its state
    # under the API's neutral name (endpoints.selectors.replica_placement_visible), since pod and process names
    # tell where the platform runs it.
    owner = endpoint.owner_tenant_id
    publish(kind="replica", payload=payload, tenant_ids={owner} if owner else set())
    if reserving := tenant_ids_seeing(endpoint) - {owner}:
        redacted = {**payload, "replica": replica_placement_redacted(instance)["name"]}
        publish(kind="replica", payload=redacted, tenant_ids=reserving, operators=False)


@receiver(post_save, sender=Endpoint, dispatch_uid="console.endpoint_saved")
def endpoint_saved(sender, instance: Endpoint, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    payload = {
        "endpoint_id": instance.pk,
        "endpoint": instance.name,
        "created": created,
        "desired_replicas": instance.desired_replicas,
    }
    publish(kind="endpoint", payload=payload, tenant_ids=tenant_ids_seeing(instance))


@receiver(post_save, sender=Alert, dispatch_uid="console.alert_saved")
def alert_saved(sender, instance: Alert, created: bool, raw: bool = False, **kwargs) -> None:
    if raw:
        return
    slo = instance.slo
    tenant_ids = [slo.tenant_id] if slo.tenant_id else tenant_ids_seeing(slo.endpoint)
    payload = {
        "alert_id": instance.pk,
        "endpoint_id": slo.endpoint_id,
        "slo": slo.name,
        "severity": instance.severity,
        "state": instance.state,
        "acknowledged": instance.acknowledged_at is not None,
    }
    publish(kind="alert", payload=payload, tenant_ids=tenant_ids)


@receiver(post_save, sender=AutoscalerDecision, dispatch_uid="console.decision_saved")
def decision_saved(sender, instance: AutoscalerDecision, created: bool, raw: bool = False, **kwargs) -> None:
    # One decision is stored every tick; only a change is worth waking every open console page for.
    if raw or not created or instance.desired == instance.current:
        return
    payload = {
        "endpoint_id": instance.endpoint_id,
        "axis": instance.axis,
        "current": instance.current,
        "desired": instance.desired,
        "reason": instance.reason,
    }
    # The reason carries the endpoint's whole demand: operators and the owner only, not tenants reserving on it.
    owner = instance.endpoint.owner_tenant_id
    publish(kind="decision", payload=payload, tenant_ids={owner} if owner else set())


@receiver(post_save, sender=RolloutEvent, dispatch_uid="console.rollout_event_saved")
def rollout_event_saved(sender, instance: RolloutEvent, created: bool, raw: bool = False, **kwargs) -> None:
    """A rollout decision refreshes the endpoint page of operators and of the endpoint's owner (who see rollouts)."""
    if raw or not created:
        return
    rollout = instance.rollout
    endpoint = rollout.endpoint
    payload = {
        "endpoint_id": endpoint.pk,
        "endpoint": endpoint.name,
        "rollout_id": rollout.pk,
        "kind": instance.kind,
        "state": instance.to_state,
        "message": instance.message,
    }
    publish(kind="rollout", payload=payload, tenant_ids=[endpoint.owner_tenant_id] if endpoint.owner_tenant_id else [])


@receiver(post_save, sender=Tenant, dispatch_uid="console.tenant_saved")
def tenant_saved(sender, instance: Tenant, created: bool, raw: bool = False, **kwargs) -> None:
    """A suspended tenant's open console sockets close (new ones are refused: ``tenants.backends``)."""
    if raw or created or instance.is_active:
        return
    tenant_sockets_close(instance.pk)
