"""/api/v1/usage/: one record per proxied request, read-only, filterable by time, endpoint, tenant and status.

Paginated with a cursor on (finished_at, id): the table is large and append-mostly, so offsets and COUNT(*)
would get slower with every page while a cursor stays an index range scan.
"""

import django_filters
from django import forms
from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import serializers
from rest_framework.pagination import CursorPagination

from billing.models import UsageRecord, UsageStatus
from endpoints.selectors import endpoints_visible_to
from tenants.api.base import ScopedReadOnlyViewSet
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to


def usage_visible_to(principal) -> QuerySet[UsageRecord]:
    """Operators see all usage; a tenant sees its own requests only, even on shared endpoints."""
    queryset = UsageRecord.objects.select_related("tenant", "endpoint", "api_key")
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    return queryset.filter(tenant_id=tenant_id) if tenant_id else queryset.none()


def _visible_tenants(request):
    return tenants_visible_to(request.user) if request is not None else tenants_visible_to(None)


def _visible_endpoints(request):
    return endpoints_visible_to(request.user) if request is not None else endpoints_visible_to(None)


class UsageFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since >= until:
            raise forms.ValidationError({"until": "must be later than since"})
        return cleaned


class UsageFilter(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="finished_at", lookup_expr="gte", label="finished at or after")
    until = django_filters.IsoDateTimeFilter(field_name="finished_at", lookup_expr="lt", label="finished before")
    tenant = django_filters.ModelChoiceFilter(queryset=_visible_tenants)
    endpoint = django_filters.ModelChoiceFilter(queryset=_visible_endpoints)
    status = django_filters.MultipleChoiceFilter(choices=UsageStatus.choices)
    priority = django_filters.CharFilter()
    slo_met = django_filters.BooleanFilter()
    request_id = django_filters.CharFilter()
    adapter = django_filters.CharFilter(help_text="the LoRA adapter the requests named (docs/lora-serving.md)")

    class Meta:
        model = UsageRecord
        form = UsageFilterForm
        fields = ["since", "until", "tenant", "endpoint", "status", "priority", "slo_met", "request_id", "adapter"]


class UsagePagination(CursorPagination):
    ordering = ("-finished_at", "-id")
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000


class UsageRecordSerializer(serializers.ModelSerializer):
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True, default=None, allow_null=True)
    api_key_prefix = serializers.CharField(source="api_key.prefix", read_only=True, default=None, allow_null=True)

    class Meta:
        model = UsageRecord
        fields = [
            "id", "request_id", "tenant", "tenant_name", "api_key", "api_key_prefix", "endpoint", "endpoint_name",
            "replica", "priority", "input_tokens", "cached_tokens", "output_tokens", "mu", "queue_ms", "ttft_ms",
            "tpot_ms", "e2e_ms", "status", "slo_met", "adapter", "started_at", "finished_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class UsageRecordViewSet(ScopedReadOnlyViewSet):
    model = UsageRecord
    serializer_class = UsageRecordSerializer
    filterset_class = UsageFilter
    pagination_class = UsagePagination
    # The cursor fixes the order, so no client-chosen ordering.
    filter_backends = [DjangoFilterBackend]

    def visible_queryset(self, principal):
        return usage_visible_to(principal)


def register(router) -> None:
    router.register("usage", UsageRecordViewSet, basename="usage-record")
