"""/api/v1/tenant-quotas/: each tenant's provisioning quota (endpoints, replicas, GPUs, warm pool) and what its
endpoints commit against it. A tenant's users read their own; operators change it (an audited approval of capacity
beyond the platform default). Rows are tenants: ``/tenant-quotas/<tenant id>/``."""

from rest_framework import mixins, serializers, viewsets

from tenants.api.base import WRITE, ScopedViewSetMixin
from tenants.models import Tenant
from tenants.quotas import QUOTA_NAMES, committed_usage, quota_for, tenant_quota_update
from tenants.selectors import tenants_visible_to


class TenantQuotaSerializer(serializers.ModelSerializer):
    tenant = serializers.IntegerField(source="pk", read_only=True)
    max_endpoints = serializers.IntegerField(
        source="quota_max_endpoints", min_value=0, allow_null=True, required=False
    )
    max_replicas = serializers.IntegerField(source="quota_max_replicas", min_value=0, allow_null=True, required=False)
    max_gpus = serializers.IntegerField(source="quota_max_gpus", min_value=0, allow_null=True, required=False)
    max_warm_pool = serializers.IntegerField(
        source="quota_max_warm_pool", min_value=0, allow_null=True, required=False
    )
    effective = serializers.SerializerMethodField(help_text="the quota in force (empty fields: platform default)")
    committed = serializers.SerializerMethodField(help_text="endpoints, min replicas, warm pool and GPUs committed")

    class Meta:
        model = Tenant
        fields = ["id", "tenant", "name", "max_endpoints", "max_replicas", "max_gpus", "max_warm_pool", "effective",
                  "committed"]  # fmt: skip
        read_only_fields = ["id", "tenant", "name"]

    def get_effective(self, tenant) -> dict:
        return quota_for(tenant).as_dict()

    def get_committed(self, tenant) -> dict:
        return committed_usage(tenant)


class TenantQuotaViewSet(
    ScopedViewSetMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Read by the tenant; set by operators (PATCH a field to a number, or to null for the platform default)."""

    model = Tenant
    serializer_class = TenantQuotaSerializer
    write_access = WRITE.OPERATORS
    ordering_fields = ["name"]

    def visible_queryset(self, principal):
        return tenants_visible_to(principal)

    def update_object(self, instance, data):
        values = {name: data[f"quota_{name}"] for name in QUOTA_NAMES if f"quota_{name}" in data}
        return tenant_quota_update(tenant=instance, actor=self.request.user, **values)


def register(router) -> None:
    router.register("tenant-quotas", TenantQuotaViewSet, basename="tenant-quota")
