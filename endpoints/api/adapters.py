"""/api/v1/adapters/: register, rename and delete LoRA adapters served on a base endpoint's replicas (docs/lora-serving.md).

Tenants register private adapters on endpoints they may call; operators also publish shared ones. The artifact is
a directory relative to its owner's part of the operators' LoRA storage root, checked on registration
(``endpoints.adapters``).
"""

from rest_framework import serializers

from endpoints.adapters import adapter_create, adapter_delete, adapter_update
from endpoints.models import Adapter, Endpoint, model_name_validator
from endpoints.selectors import adapters_visible_to, endpoints_visible_to
from tenants.api.base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, principal_from
from tenants.models import Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to


class AdapterSerializer(serializers.ModelSerializer):
    owner_tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to,
        queryset=Tenant.objects.all(),
        required=False,
        allow_null=True,
        help_text="empty = a shared adapter published by the operators (tenants always register their own)",
    )
    endpoint = ScopedPrimaryKeyRelatedField(
        scope=endpoints_visible_to,
        queryset=Endpoint.objects.all(),
        help_text="the base endpoint whose replicas serve it (LoRA on: launch option max_loras above 0)",
    )
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    rank = serializers.IntegerField(
        min_value=1, required=False, help_text="LoRA rank r (default: adapter_config.json's); at most max_lora_rank"
    )
    artifact_path = serializers.CharField(
        max_length=255,
        help_text="directory with adapter_config.json and adapter_model.safetensors, relative to the owner's part of "
        "the LoRA root (a tenant's: tenants/<tenant id>/; shared adapters: shared/)",
    )

    class Meta:
        model = Adapter
        fields = [
            "id", "name", "owner_tenant", "endpoint", "endpoint_name", "rank", "artifact_path", "base_model",
            "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["id", "base_model", "created_at", "updated_at"]
        # Uniqueness is the service's: adapters and endpoints share one namespace (``endpoints.validation``).
        extra_kwargs = {"name": {"validators": [model_name_validator]}}

    def validate(self, attrs):
        principal = principal_from(self)
        if not principal_is_operator(principal) and self.instance is None and "owner_tenant" not in attrs:
            attrs["owner_tenant"] = Tenant.objects.get(pk=principal_tenant_id(principal))
        return attrs


class AdapterViewSet(ScopedModelViewSet):
    model = Adapter
    serializer_class = AdapterSerializer
    filterset_fields = ["owner_tenant", "endpoint", "rank"]
    ordering_fields = ["name", "created_at", "rank"]

    def visible_queryset(self, principal):
        return adapters_visible_to(principal)

    def may_change(self, principal, obj) -> bool:
        # A shared adapter is the operators' to change; a tenant only uses it.
        return principal_is_operator(principal) or obj.owner_tenant_id == principal_tenant_id(principal)

    def create_object(self, data):
        return adapter_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        return adapter_update(adapter=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        adapter_delete(adapter=instance, actor=self.request.user)


def register(router) -> None:
    router.register("adapters", AdapterViewSet, basename="adapter")
