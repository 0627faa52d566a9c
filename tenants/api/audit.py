"""/api/v1/audit/: who did what (read-only). Operators see every entry; a tenant's users see their tenant's."""

import django_filters
from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import serializers
from rest_framework.pagination import CursorPagination

from tenants.api.base import ScopedReadOnlyViewSet
from tenants.models import AuditEntry
from tenants.selectors import principal_is_operator, principal_tenant_id


def audit_visible_to(principal) -> QuerySet[AuditEntry]:
    queryset = AuditEntry.objects.all()
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    return queryset.filter(tenant_id=tenant_id) if tenant_id else queryset.none()


class AuditFilter(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")
    action = django_filters.CharFilter()
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()

    class Meta:
        model = AuditEntry
        fields = ["since", "until", "action", "object_type", "object_id"]


class AuditPagination(CursorPagination):
    ordering = ("-at", "-id")
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor_label", "tenant", "action", "object_type", "object_id", "detail"]
        read_only_fields = fields


class AuditEntryViewSet(ScopedReadOnlyViewSet):
    model = AuditEntry
    serializer_class = AuditEntrySerializer
    filterset_class = AuditFilter
    pagination_class = AuditPagination
    filter_backends = [DjangoFilterBackend]

    def visible_queryset(self, principal):
        return audit_visible_to(principal)


def register(router) -> None:
    router.register("audit", AuditEntryViewSet, basename="audit-entry")
