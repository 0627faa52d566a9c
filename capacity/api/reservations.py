"""/api/v1/reservations/: capacity sold to tenants (MU/min per endpoint, or per LoRA adapter on it). Operators sell;
tenants read theirs."""

from rest_framework import serializers

from capacity.services import reservation_create, reservation_delete, reservation_update
from endpoints.models import Adapter, Endpoint
from endpoints.selectors import adapters_visible_to, endpoints_visible_to
from tenants.api.base import WRITE, IdOrNameRelatedField, ScopedModelViewSet, ScopedPrimaryKeyRelatedField
from tenants.models import CapacityReservation, Tenant
from tenants.selectors import reservations_visible_to, tenants_visible_to


class ReservationSerializer(serializers.ModelSerializer):
    tenant = ScopedPrimaryKeyRelatedField(scope=tenants_visible_to, queryset=Tenant.objects.all())
    endpoint = IdOrNameRelatedField(scope=endpoints_visible_to, queryset=Endpoint.objects.all())
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    # Scoped like every foreign key: an adapter the caller may not see answers as a missing one. Whether the
    # reservation's tenant may use it is the model's check (its own or a shared adapter, on this endpoint).
    adapter = ScopedPrimaryKeyRelatedField(
        scope=adapters_visible_to,
        queryset=Adapter.objects.all(),
        required=False,
        allow_null=True,
        help_text="empty = the tenant's base-model traffic; else the LoRA adapter whose requests draw from it",
    )
    adapter_name = serializers.CharField(source="adapter.name", read_only=True, default=None, allow_null=True)

    class Meta:
        model = CapacityReservation
        fields = [
            "id", "tenant", "tenant_name", "endpoint", "endpoint_name", "adapter", "adapter_name", "mu_per_min",
            "priority", "burst_minutes", "rpm_limit", "tpm_limit", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at", "updated_at"]
        # Uniqueness of (tenant, endpoint[, adapter]) is checked by the service, with a message that says what to do.
        validators = []

    def validate(self, attrs):
        if self.instance is not None:
            for field in ("tenant", "endpoint", "adapter"):
                if field in attrs and attrs[field] != getattr(self.instance, field):
                    raise serializers.ValidationError({field: ["cannot change; delete and sell a new reservation"]})
        return attrs


class ReservationViewSet(ScopedModelViewSet):
    model = CapacityReservation
    serializer_class = ReservationSerializer
    write_access = WRITE.OPERATORS
    # ?adapter=<id>: that adapter's reservations; ?adapter__isnull=true: the base-model ones.
    filterset_fields = {
        "tenant": ["exact"],
        "endpoint": ["exact"],
        "adapter": ["exact", "isnull"],
        "priority": ["exact"],
    }
    ordering_fields = ["mu_per_min", "created_at"]

    def visible_queryset(self, principal):
        return reservations_visible_to(principal)

    def create_object(self, data):
        return reservation_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        for fixed in ("tenant", "endpoint", "adapter"):
            data.pop(fixed, None)
        return reservation_update(reservation=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        reservation_delete(reservation=instance, actor=self.request.user)


def register(router) -> None:
    router.register("reservations", ReservationViewSet, basename="reservation")
