"""/api/v1/users/: tenant admins manage their tenant's users; operators manage everyone.

People only: an API key or operator token may list users but never create, change or delete one, and nobody sets another
person's password here (a new account's first password aside), nor, unless an operator, an email address (it is
where reset links go: each person changes their own at PATCH /api/v1/me/). Each person changes their own at
/api/v1/me/password/; an admin who must get someone back in resets it (a mailed one-time link).
"""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from tenants.api.base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, default_tenant, principal_from
from tenants.models import Role, Tenant, User
from tenants.selectors import principal_is_credential, principal_is_operator, tenants_visible_to, users_visible_to
from tenants.services import user_create, user_delete, user_password_reset, user_update


class UserSerializer(serializers.ModelSerializer):
    tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to, queryset=Tenant.objects.all(), required=False, allow_null=True
    )
    password = serializers.CharField(
        write_only=True,
        required=False,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="the first password of a new account; afterwards only its owner changes it (/api/v1/me/password/)",
    )

    class Meta:
        model = User
        fields = [
            "id", "username", "email", "first_name", "last_name", "role", "tenant", "is_active", "password",
            "date_joined", "last_login",
        ]  # fmt: skip
        read_only_fields = ["id", "date_joined", "last_login"]

    def validate(self, attrs):
        principal = principal_from(self)
        if self.instance is not None and "password" in attrs:
            # Setting someone's password is taking over their account, whoever does it.
            raise serializers.ValidationError(
                {
                    "password": [
                        "cannot be changed here: the user changes it at /api/v1/me/password/, "
                        "or an admin sends a reset link (POST /api/v1/users/{id}/reset-password/)"
                    ]
                }
            )
        role = attrs.get("role", getattr(self.instance, "role", Role.TENANT_MEMBER))
        if role == Role.OPERATOR:
            if not principal_is_operator(principal):
                raise serializers.ValidationError({"role": ["only operators may grant the operator role"]})
            return attrs
        return default_tenant(self, attrs)


class PasswordResetSentSerializer(serializers.Serializer):
    detail = serializers.CharField()


class UserViewSet(ScopedModelViewSet):
    model = User
    serializer_class = UserSerializer
    filterset_fields = ["role", "tenant", "is_active"]
    ordering_fields = ["username", "date_joined"]

    def visible_queryset(self, principal):
        return users_visible_to(principal)

    def may_write(self, principal) -> bool:
        if principal_is_credential(principal):
            # A leaked key or operator token must not become a person: an account it created or took over would log
            # in to the console and mint keys without the limits (scopes, expiry) a credential has.
            raise PermissionDenied("API keys cannot create, change or delete users, nor can operator tokens; sign in")
        return super().may_write(principal)

    def may_change(self, principal, obj) -> bool:
        # A tenant admin must not edit an operator account (a superuser included), even one in the tenant's list.
        return principal_is_operator(principal) or not obj.is_operator

    def create_object(self, data):
        data.setdefault("role", Role.TENANT_MEMBER)
        data.setdefault("tenant", None)
        data.pop("is_active", None)  # new accounts start active
        return user_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        return user_update(user=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        user_delete(user=instance, actor=self.request.user)

    @extend_schema(request=None, responses={200: PasswordResetSentSerializer})
    @action(detail=True, methods=["post"], url_path="reset-password")
    def reset_password(self, request, pk=None):
        """Lock the user's password at once and mail them a one-time link to choose a new one."""
        user = self.get_object()
        user_password_reset(user=user, actor=request.user, domain=request.get_host(), use_https=request.is_secure())
        return Response({"detail": f"password locked; a reset link was mailed to {user.email}"})


def register(router) -> None:
    router.register("users", UserViewSet, basename="user")
