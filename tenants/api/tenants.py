"""/api/v1/tenants/: operators manage tenants; a tenant's users read their own."""

import math

from rest_framework import serializers

from tenants.api.base import WRITE, ScopedModelViewSet
from tenants.models import Tenant
from tenants.selectors import tenants_visible_to
from tenants.services import tenant_create, tenant_delete, tenant_update


class TenantSerializer(serializers.ModelSerializer):
    """A tenant; its monthly dollar budget (operators set it): an alert past ``budget_alert_fraction`` of it, and
    with ``budget_hard_stop`` the proxies refuse its requests once it is spent (docs/security.md, "Budgets")."""

    def validate_budget_usd(self, value):
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("must be a finite number")
        return value

    class Meta:
        model = Tenant
        fields = [
            "id", "name", "slug", "is_active", "accepts_fallback", "budget_usd", "budget_hard_stop",
            "budget_alert_fraction", "created_at",
        ]  # fmt: skip
        read_only_fields = ["id", "created_at"]


class TenantViewSet(ScopedModelViewSet):
    model = Tenant
    serializer_class = TenantSerializer
    write_access = WRITE.OPERATORS
    filterset_fields = ["is_active"]
    ordering_fields = ["name", "created_at"]

    def visible_queryset(self, principal):
        return tenants_visible_to(principal)

    def create_object(self, data):
        tenant = tenant_create(name=data["name"], slug=data["slug"], actor=self.request.user)
        if "is_active" in data and data["is_active"] != tenant.is_active:
            tenant = tenant_update(tenant=tenant, is_active=data["is_active"], actor=self.request.user)
        return tenant

    def update_object(self, instance, data):
        return tenant_update(tenant=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        tenant_delete(tenant=instance, actor=self.request.user)


def register(router) -> None:
    router.register("tenants", TenantViewSet, basename="tenant")
