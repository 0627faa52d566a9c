"""/api/v1/slos/: latency and availability objectives per endpoint, or per tenant on an endpoint.

Operators manage every SLO, including endpoint-wide ones. A tenant's admins manage their tenant's SLOs on
endpoints they can see; endpoint-wide SLOs of those endpoints are visible to them read-only.
"""

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from billing.models import SLO
from billing.selectors import slos_visible_to
from billing.services import slo_create, slo_delete, slo_update
from endpoints.models import Endpoint
from endpoints.selectors import endpoints_visible_to
from tenants.api.base import (
    IdOrNameRelatedField,
    ScopedModelViewSet,
    ScopedPrimaryKeyRelatedField,
    default_tenant,
    principal_from,
)
from tenants.models import CapacityReservation, Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to


@extend_schema_serializer(component_name="ServiceLevelObjective")
class SLOSerializer(serializers.ModelSerializer):
    endpoint = IdOrNameRelatedField(scope=endpoints_visible_to, queryset=Endpoint.objects.all())
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

    def create_object(self, data):
        return slo_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        return slo_update(slo=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        slo_delete(slo=instance, actor=self.request.user)


def register(router) -> None:
    router.register("slos", SLOViewSet, basename="slo")
