"""/api/v1/slos/: latency and availability objectives per endpoint, or per tenant on an endpoint.

Operators manage every SLO, including endpoint-wide ones. A tenant's admins manage their tenant's SLOs on
endpoints they can see; endpoint-wide SLOs of those endpoints are visible to them read-only.
"""

from django.db import transaction
from django.db.models import Q, QuerySet
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from billing.models import SLO
from config.api_base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, default_tenant, principal_from
from endpoints.models import Endpoint
from endpoints.selectors import endpoints_visible_to
from tenants.models import CapacityReservation, Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to
from tenants.services import audit_log


def slos_visible_to(principal) -> QuerySet[SLO]:
    queryset = SLO.objects.select_related("endpoint", "tenant")
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return queryset.none()
    endpoint_wide = Q(tenant__isnull=True, endpoint__in=endpoints_visible_to(principal).values("pk"))
    return queryset.filter(Q(tenant_id=tenant_id) | endpoint_wide)


@extend_schema_serializer(component_name="ServiceLevelObjective")
class SLOSerializer(serializers.ModelSerializer):
    endpoint = ScopedPrimaryKeyRelatedField(scope=endpoints_visible_to, queryset=Endpoint.objects.all())
    tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to,
        queryset=Tenant.objects.all(),
        required=False,
        allow_null=True,
        help_text="empty = the whole endpoint (operators only)",
    )

    class Meta:
        model = SLO
        fields = [
            "id", "name", "endpoint", "tenant", "sli", "objective", "period_days", "ttft_ms", "tpot_ms", "enabled",
            "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]

    def validate(self, attrs):
        principal = principal_from(self)
        if not principal_is_operator(principal):
            attrs = default_tenant(self, attrs)
            if attrs.get("tenant", getattr(self.instance, "tenant", None)) is None:
                raise serializers.ValidationError({"tenant": ["only operators define endpoint-wide SLOs"]})
        tenant = attrs.get("tenant", getattr(self.instance, "tenant", None))
        endpoint = attrs.get("endpoint", getattr(self.instance, "endpoint", None))
        if tenant is not None and endpoint is not None and not _tenant_uses(tenant, endpoint):
            raise serializers.ValidationError(
                {"tenant": ["this tenant neither owns nor reserves capacity on this endpoint"]}
            )
        return attrs


def _tenant_uses(tenant: Tenant, endpoint: Endpoint) -> bool:
    if endpoint.owner_tenant_id == tenant.pk:
        return True
    return CapacityReservation.objects.filter(tenant=tenant, endpoint=endpoint).exists()


class SLOViewSet(ScopedModelViewSet):
    model = SLO
    serializer_class = SLOSerializer
    filterset_fields = ["endpoint", "tenant", "sli", "enabled"]
    ordering_fields = ["name", "objective", "created_at"]

    def visible_queryset(self, principal):
        return slos_visible_to(principal)

    def may_change(self, principal, obj) -> bool:
        return principal_is_operator(principal) or obj.tenant_id == principal_tenant_id(principal)

    @transaction.atomic
    def create_object(self, data):
        slo = SLO(**data)
        slo.full_clean()
        slo.save()
        audit_log(actor=self.request.user, action="slo.create", obj=slo, detail={"endpoint": slo.endpoint_id})
        return slo

    @transaction.atomic
    def update_object(self, instance, data):
        for name, value in data.items():
            setattr(instance, name, value)
        instance.full_clean()
        instance.save()
        audit_log(actor=self.request.user, action="slo.update", obj=instance, detail={"fields": sorted(data)})
        return instance

    @transaction.atomic
    def delete_object(self, instance):
        audit_log(actor=self.request.user, action="slo.delete", obj=instance, detail={"name": instance.name})
        instance.delete()


def register(router) -> None:
    router.register("slos", SLOViewSet, basename="slo")
