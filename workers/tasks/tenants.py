"""Tenant suspension: when an operator sets a tenant inactive, its active rollouts pause and its replicas drain at
once (``tenants.services.tenant_update`` enqueues this on commit); the autoscaler's ticks hold them at zero from
then on. docs/security.md, "Suspended tenants"."""

from celery import shared_task
from django.core.exceptions import ValidationError

from capacity.autoscaling.services import tenant_replicas_drain
from endpoints.models import ROLLOUT_ACTIVE_STATES, Rollout, RolloutState
from endpoints.rollouts.services import pause_rollout

SUSPENDED = "the endpoint's tenant is suspended"


@shared_task(name="tenants.suspension_apply", ignore_result=True, soft_time_limit=60, time_limit=90)
def suspension_apply(tenant_id: int) -> list[str]:
    """Pause the tenant's rollouts (else they would launch new-version replicas) and drain its replicas; a tenant
    that is active again by the time this runs is left alone."""
    rollouts = Rollout.objects.filter(
        endpoint__owner_tenant_id=tenant_id, endpoint__owner_tenant__is_active=False, state__in=ROLLOUT_ACTIVE_STATES
    ).exclude(state=RolloutState.PAUSED)
    paused = []
    for rollout in rollouts:
        try:
            pause_rollout(rollout=rollout, reason=SUSPENDED)
        except ValidationError:  # it moved past pausing meanwhile (promoting, rolling back): the drain still holds
            continue
        paused.append(f"paused rollout {rollout.pk}")
    return paused + tenant_replicas_drain(tenant_id=tenant_id)
