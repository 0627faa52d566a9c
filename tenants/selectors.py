"""Reads for tenants, users, API keys and reservations, scoped to what a principal may see.

A principal is a ``tenants.User`` or a ``tenants.keys.ApiKeyPrincipal``: operators see everything,
anyone else only their own tenant's rows. Querysets for another tenant's rows simply come back empty,
so views answer 404 rather than revealing that the object exists.
"""

from django.db.models import QuerySet

from tenants.keys import ApiKeyPrincipal
from tenants.models import ApiKey, CapacityReservation, Tenant, User
from tenants.operator_tokens import token_of


def principal_is_operator(principal) -> bool:
    return bool(getattr(principal, "is_authenticated", False) and getattr(principal, "is_operator", False))


def principal_is_api_key(principal) -> bool:
    """True for a key-authenticated caller: it acts for software, never as a person (no account or password)."""
    return isinstance(principal, ApiKeyPrincipal)


def principal_is_credential(principal) -> bool:
    """True for a caller authenticated by a credential made for software: a tenant API key or an operator token. It
    never acts as a person: no account, password or email of its own to change, and it manages no people."""
    return principal_is_api_key(principal) or token_of(principal) is not None


def principal_tenant_id(principal) -> int | None:
    """The tenant a non-operator principal acts for; None for operators and for users without a tenant."""
    if not getattr(principal, "is_authenticated", False) or principal_is_operator(principal):
        return None
    return getattr(principal, "tenant_id", None)


def user_tenant_active(user) -> bool:
    """False for a person whose tenant is suspended (``Tenant.is_active`` off); operators never are, whatever
    tenant they may be linked to."""
    if getattr(user, "is_operator", False) or getattr(user, "tenant_id", None) is None:
        return True
    return bool(user.tenant.is_active)


def principal_can_write(principal) -> bool:
    """Operators, tenant admins and API keys with the write scope may change things; members only read."""
    if principal_is_operator(principal):
        return True
    return bool(principal_tenant_id(principal) and getattr(principal, "is_tenant_admin", False))


def _scoped(queryset: QuerySet, principal, tenant_field: str) -> QuerySet:
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return queryset.none()
    return queryset.filter(**{tenant_field: tenant_id})


def tenants_visible_to(principal) -> QuerySet[Tenant]:
    return _scoped(Tenant.objects.all(), principal, "pk")


def users_visible_to(principal) -> QuerySet[User]:
    return _scoped(User.objects.select_related("tenant"), principal, "tenant_id")


def api_keys_visible_to(principal) -> QuerySet[ApiKey]:
    return _scoped(ApiKey.objects.select_related("tenant", "created_by"), principal, "tenant_id")


def reservations_visible_to(principal) -> QuerySet[CapacityReservation]:
    return _scoped(CapacityReservation.objects.select_related("tenant", "endpoint", "adapter"), principal, "tenant_id")
