"""Writes for tenants, users, API keys and reservations. Views, serializers and the console call these."""
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from tenants.keys import generate_key
from tenants.models import ApiKey, AuditEntry, PriorityClass, Tenant


def audit_log(*, actor=None, action: str, obj, tenant=None, detail: dict | None = None) -> AuditEntry:
    label = getattr(actor, "username", "") or "system"
    user = actor if getattr(actor, "pk", None) and not isinstance(actor, str) and hasattr(actor, "role") else None
    return AuditEntry.objects.create(
        actor=user,
        actor_label=label,
        tenant=tenant if tenant is not None else getattr(obj, "tenant", None),
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        detail=detail or {},
    )


def tenant_create(*, name: str, slug: str, actor=None) -> Tenant:
    tenant = Tenant.objects.create(name=name, slug=slug)
    audit_log(actor=actor, action="tenant.create", obj=tenant, tenant=tenant)
    return tenant


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    max_priority: str = PriorityClass.STANDARD,
    expires_at: datetime | None = None,
    actor=None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with the full secret, which is never retrievable again."""
    raw, prefix, digest = generate_key()
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=prefix,
        key_hash=digest,
        scopes=list(scopes) if scopes is not None else ["inference"],
        max_priority=max_priority,
        expires_at=expires_at,
        created_by=actor if getattr(actor, "role", None) else None,
    )
    audit_log(actor=actor, action="api_key.create", obj=key, detail={"prefix": prefix, "scopes": key.scopes})
    return key, raw


def api_key_revoke(*, api_key: ApiKey, actor=None) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
        audit_log(actor=actor, action="api_key.revoke", obj=api_key, detail={"prefix": api_key.prefix})
    return api_key
