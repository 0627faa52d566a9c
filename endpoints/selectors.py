"""Reads for endpoints and replicas, scoped to what a principal may see.

Operators see every endpoint. A tenant's users see the endpoints their tenant owns and the shared
endpoints on which it holds a capacity reservation; they may change only the ones it owns.
"""

from django.db.models import Q, QuerySet

from endpoints.models import Adapter, Endpoint, Replica
from tenants.models import CapacityReservation
from tenants.selectors import principal_is_operator, principal_tenant_id


def endpoints_visible_to(principal) -> QuerySet[Endpoint]:
    queryset = Endpoint.objects.select_related("owner_tenant", "model_profile", "hardware_profile")
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return queryset.none()
    # A subquery rather than a join, so an endpoint with several matching rows is not listed twice.
    reserved = CapacityReservation.objects.filter(tenant_id=tenant_id).values("endpoint_id")
    return queryset.filter(Q(owner_tenant_id=tenant_id) | Q(pk__in=reserved))


def endpoints_owned_by(principal) -> QuerySet[Endpoint]:
    """The endpoints a principal's tenant may change (all of them for operators)."""
    queryset = Endpoint.objects.all()
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    return queryset.filter(owner_tenant_id=tenant_id) if tenant_id else queryset.none()


def endpoint_is_owned_by(*, endpoint: Endpoint, principal) -> bool:
    if principal_is_operator(principal):
        return True
    tenant_id = principal_tenant_id(principal)
    return tenant_id is not None and endpoint.owner_tenant_id == tenant_id


def replicas_visible_to(principal) -> QuerySet[Replica]:
    queryset = Replica.objects.select_related("endpoint")
    if principal_is_operator(principal):
        return queryset
    return queryset.filter(endpoint__in=endpoints_visible_to(principal).values("pk"))


def replicas_with_placement_visible_to(principal) -> QuerySet[Replica]:
    """Replicas whose placement (address, actuator, pod or process) the principal may see: the operators' all, a
    tenant's those of the endpoints it owns. On a shared endpoint it only reserves on, a tenant sees that replicas
    exist and how healthy they are, not where they run on the platform's network."""
    return Replica.objects.filter(endpoint__in=endpoints_owned_by(principal).values("pk"))


def replica_placement_visible(*, replica: Replica, principal) -> bool:
    """The per-row form of ``replicas_with_placement_visible_to``, without a query (the endpoint's owner is a column)."""
    return endpoint_is_owned_by(endpoint=replica.endpoint, principal=principal)


def replica_placement_redacted(replica: Replica) -> dict[str, str]:
    """What stands in for a replica's placement fields where ``replica_placement_visible`` is false (the REST API,
    the console page and its live events show the same): a neutral name, and no URL, actuator, pod or pid, nor a
    failure text that would quote them."""
    return {"name": f"replica-{replica.pk}", "url": "", "actuator": "", "actuator_ref": "", "failure_reason": ""}


def owned_or_shared(queryset: QuerySet, principal, *, owner: str) -> QuerySet:
    """Rows of ``queryset`` a principal may see: operators, all; a tenant, those its ``owner`` field names and the
    shared ones (no owner) on endpoints it may see; anyone else, none. Adapters and SLOs share this rule."""
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return queryset.none()
    shared = Q(**{f"{owner}__isnull": True}, endpoint__in=endpoints_visible_to(principal).values("pk"))
    return queryset.filter(Q(**{f"{owner}_id": tenant_id}) | shared)


def adapters_visible_to(principal) -> QuerySet[Adapter]:
    """Operators: every adapter. A tenant: its own, and the shared ones on endpoints it may see."""
    return owned_or_shared(Adapter.objects.select_related("owner_tenant", "endpoint"), principal, owner="owner_tenant")
