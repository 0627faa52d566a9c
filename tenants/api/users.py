"""/api/v1/users/: tenant admins manage their tenant's users; operators manage everyone."""

from rest_framework import serializers

from config.api_base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, default_tenant, principal_from
from tenants.models import Role, Tenant, User
from tenants.selectors import principal_is_operator, tenants_visible_to, users_visible_to
from tenants.services import user_create, user_delete, user_update


class UserSerializer(serializers.ModelSerializer):
    tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to, queryset=Tenant.objects.all(), required=False, allow_null=True
    )
    password = serializers.CharField(write_only=True, required=False, style={"input_type": "password"})

    class Meta:
        model = User
        fields = [
            "id", "username", "email", "first_name", "last_name", "role", "tenant", "is_active", "password",
            "date_joined", "last_login",
        ]  # fmt: skip
        read_only_fields = ["id", "date_joined", "last_login"]

    def validate(self, attrs):
        principal = principal_from(self)
        role = attrs.get("role", getattr(self.instance, "role", Role.TENANT_MEMBER))
        if role == Role.OPERATOR:
            if not principal_is_operator(principal):
                raise serializers.ValidationError({"role": ["only operators may grant the operator role"]})
            return attrs
        return default_tenant(self, attrs)


class UserViewSet(ScopedModelViewSet):
    model = User
    serializer_class = UserSerializer
    filterset_fields = ["role", "tenant", "is_active"]
    ordering_fields = ["username", "date_joined"]

    def visible_queryset(self, principal):
        return users_visible_to(principal)

    def may_change(self, principal, obj) -> bool:
        # A tenant admin must not edit an operator account, even one that somehow sits in the tenant's list.
        return principal_is_operator(principal) or obj.role != Role.OPERATOR

    def create_object(self, data):
        data.setdefault("role", Role.TENANT_MEMBER)
        data.setdefault("tenant", None)
        data.pop("is_active", None)  # new accounts start active
        return user_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        return user_update(user=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        user_delete(user=instance, actor=self.request.user)


def register(router) -> None:
    router.register("users", UserViewSet, basename="user")
