"""Per-tenant provisioning quotas: the endpoints, serving replicas, GPUs and warm-pool replicas a tenant's own
endpoints may hold, so a tenant admin cannot make the autoscaler launch thousands of GPUs.

Platform defaults come from ``INFERCAP["TENANT_QUOTA"]``; an operator raises (or lowers) one tenant's with
``tenant_quota_update`` (audited). Two places enforce them: endpoint create / update refuse a change that takes
the tenant's committed floors beyond its quota (field errors), and the autoscaler never launches past what is left
of it (``serving_replica_ceiling``). Shared endpoints (no owner) are the operators' and count against no tenant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Case, Q, When
from django.db.models.functions import Coalesce

from capacity.models import HardwareProfile
from endpoints.models import Endpoint, Replica, ReplicaRole
from tenants.models import Tenant
from tenants.services import audit_log

DEFAULT_QUOTA = {"max_endpoints": 10, "max_replicas": 16, "max_gpus": 16, "max_warm_pool": 4}
QUOTA_NAMES = tuple(DEFAULT_QUOTA)
# Replica states that hold (or are about to hold) GPUs.
LIVE_STATES = ("pending", "starting", "ready", "draining")


@dataclass(frozen=True)
class Quota:
    max_endpoints: int
    max_replicas: int
    max_gpus: int
    max_warm_pool: int

    def as_dict(self) -> dict:
        return asdict(self)


def default_quota() -> Quota:
    configured = getattr(settings, "INFERCAP", {}).get("TENANT_QUOTA", {}) or {}
    return Quota(**{name: int(configured.get(name, default)) for name, default in DEFAULT_QUOTA.items()})


def quota_for(tenant) -> Quota:
    """The tenant's quota: its own value per field where an operator set one, else the platform default."""
    default = default_quota()
    return Quota(
        **{
            name: value if (value := getattr(tenant, f"quota_{name}", None)) is not None else getattr(default, name)
            for name in QUOTA_NAMES
        }
    )


# -- what an endpoint commits ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Commitment:
    """What one endpoint asks of its tenant's quota: the floors it keeps running and the ceiling it may reach."""

    min_replicas: int = 0
    max_replicas: int = 0
    warm_pool: int = 0
    gpus_per_replica: int = 1

    @property
    def floor_gpus(self) -> int:
        return (self.min_replicas + self.warm_pool) * self.gpus_per_replica

    @property
    def ceiling_gpus(self) -> int:
        return self.max_replicas * self.gpus_per_replica


def _gpus_per_replica(hardware_profile_id) -> int:
    value = HardwareProfile.objects.filter(pk=hardware_profile_id).values_list("gpus_per_replica", flat=True).first()
    return max(1, int(value or 1))


def commitment_of(endpoint) -> Commitment:
    return Commitment(
        min_replicas=int(endpoint.min_replicas or 0),
        max_replicas=int(endpoint.max_replicas or 0),
        warm_pool=int(endpoint.warm_pool_size or 0),
        gpus_per_replica=_gpus_per_replica(endpoint.hardware_profile_id),
    )


def endpoint_quota_errors(endpoint, *, before: Commitment | None, owner_before: int | None) -> dict[str, list[str]]:
    """Field errors for an endpoint create or update that would take its owner beyond quota.

    ``before``: the endpoint's commitment as stored (None for a new one). Only a dimension the change *raises* is
    checked, so an unrelated edit of an endpoint whose tenant's quota was lowered meanwhile still goes through.
    """
    tenant_id = endpoint.owner_tenant_id
    if tenant_id is None:
        return {}
    if owner_before != tenant_id:
        before = None  # new to this tenant: everything it commits is new
    tenant = Tenant.objects.get(pk=tenant_id)
    quota = quota_for(tenant)
    after = commitment_of(endpoint)
    before = before or Commitment()
    others = Endpoint.objects.filter(owner_tenant_id=tenant_id)
    if endpoint.pk is not None:
        others = others.exclude(pk=endpoint.pk)
    rows = list(others.values_list("min_replicas", "warm_pool_size", "hardware_profile__gpus_per_replica"))
    floors = sum(m for m, _, _ in rows)
    warm = sum(w for _, w, _ in rows)
    floor_gpus = sum((m + w) * max(1, g or 1) for m, w, g in rows)
    hint = "ask an operator to raise the tenant's quota"
    errors: dict[str, list[str]] = {}

    def refuse(field: str, message: str) -> None:
        errors.setdefault(field, []).append(f"{message}; {hint}")

    if owner_before != tenant_id and len(rows) + 1 > quota.max_endpoints:
        refuse("owner_tenant", f"the tenant's quota allows {quota.max_endpoints} endpoint(s)")
    if after.max_replicas > before.max_replicas and after.max_replicas > quota.max_replicas:
        refuse("max_replicas", f"exceeds the tenant's quota of {quota.max_replicas} replicas")
    elif after.ceiling_gpus > before.ceiling_gpus and after.ceiling_gpus > quota.max_gpus:
        refuse(
            "max_replicas",
            f"{after.max_replicas} replicas × {after.gpus_per_replica} GPU(s) exceeds the tenant's quota of "
            f"{quota.max_gpus} GPUs",
        )
    if after.min_replicas > before.min_replicas and floors + after.min_replicas > quota.max_replicas:
        refuse(
            "min_replicas",
            f"the tenant's endpoints would keep {floors + after.min_replicas} replicas running; its quota is "
            f"{quota.max_replicas}",
        )
    if after.warm_pool > before.warm_pool and warm + after.warm_pool > quota.max_warm_pool:
        refuse(
            "warm_pool_size",
            f"the tenant's warm pools would hold {warm + after.warm_pool} replicas; its quota is {quota.max_warm_pool}",
        )
    if after.floor_gpus > before.floor_gpus and floor_gpus + after.floor_gpus > quota.max_gpus and not errors:
        field = (
            "min_replicas"
            if after.min_replicas > before.min_replicas
            else "warm_pool_size"
            if after.warm_pool > before.warm_pool
            else "hardware_profile"
        )
        refuse(
            field,
            f"the tenant's endpoints would keep {floor_gpus + after.floor_gpus} GPUs busy; its quota is "
            f"{quota.max_gpus}",
        )
    return errors


def lock_tenant(tenant_id: int | None) -> None:
    """Serialise quota checks of one tenant (two concurrent creates must not both fit in the last slot)."""
    if tenant_id is not None:
        Tenant.objects.select_for_update().filter(pk=tenant_id).first()


# -- what a tenant holds right now ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LiveUsage:
    serving_replicas: int
    standby_replicas: int
    gpus: int


def replica_gpus_held():
    """A replica's GPUs as the quota counts them, as an expression over ``Replica`` rows: the profile the replica
    was launched on where it records one (a spot pool, a fallback, a local prefill pool), else its pool's or
    version's (a Kubernetes prefill pod, a rollout's new version on another profile), else its endpoint's."""
    return Coalesce(
        "hardware_profile__gpus_per_replica",
        Case(When(role=ReplicaRole.PREFILL, then="endpoint__prefill_hardware_profile__gpus_per_replica")),
        "version__hardware_profile__gpus_per_replica",
        "endpoint__hardware_profile__gpus_per_replica",
    )


def live_usage(tenant_id: int, *, exclude_serving_of: int | None = None) -> LiveUsage:
    """Replicas and GPUs the tenant's endpoints hold now (pending to draining). ``exclude_serving_of``: leave out
    that endpoint's non-draining serving replicas (the ones its autoscaler decision counts itself)."""
    rows = Replica.objects.filter(endpoint__owner_tenant_id=tenant_id, state__in=LIVE_STATES)
    if exclude_serving_of is not None:
        rows = rows.exclude(
            Q(endpoint_id=exclude_serving_of, is_standby=False) & ~Q(state="draining"),
        )
    serving = standby = gpus = 0
    for is_standby, per_replica in rows.values_list("is_standby", replica_gpus_held()):
        if is_standby:
            standby += 1
        else:
            serving += 1
        gpus += max(1, per_replica or 1)
    return LiveUsage(serving_replicas=serving, standby_replicas=standby, gpus=gpus)


def committed_usage(tenant) -> dict:
    """The floors the tenant's endpoints commit (what create / update check against the quota)."""
    rows = list(
        Endpoint.objects.filter(owner_tenant=tenant).values_list(
            "min_replicas", "warm_pool_size", "hardware_profile__gpus_per_replica"
        )
    )
    return {
        "endpoints": len(rows),
        "min_replicas": sum(m for m, _, _ in rows),
        "warm_pool": sum(w for _, w, _ in rows),
        "floor_gpus": sum((m + w) * max(1, g or 1) for m, w, g in rows),
    }


# -- operators change a tenant's quota -------------------------------------------------------------------------
def tenant_quota_update(*, tenant, actor=None, **values):
    """Set (an int) or reset (None: back to the platform default) quota fields of one tenant, audited. This is how
    an operator approves tenant-owned capacity beyond the default."""
    unknown = set(values) - set(QUOTA_NAMES)
    if unknown:
        raise ValidationError({name: ["not a quota field"] for name in sorted(unknown)})
    errors = {
        name: ["must be a whole number of at least 0, or empty for the platform default"]
        for name, value in values.items()
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0)
    }
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
        diff = {}
        for name, value in values.items():
            field = f"quota_{name}"
            if getattr(locked, field) != value:
                diff[name] = [getattr(locked, field), value]
                setattr(locked, field, value)
        if diff:
            locked.save(update_fields=[f"quota_{name}" for name in diff])
            audit_log(actor=actor, action="tenant.quota.update", obj=locked, tenant=locked, detail={"changes": diff})
    for name in values:
        setattr(tenant, f"quota_{name}", getattr(locked, f"quota_{name}"))
    return tenant
