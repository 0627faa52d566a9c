"""/api/v1/me/: who the caller is, for clients and the console to adapt to the caller's role; a person changes their
own email address there (PATCH, with the current password); /api/v1/me/password/: a person changes their own
password. Wrong current passwords count as failed logins and share their lock-out (``tenants.throttling``)."""

from django.contrib.auth import update_session_auth_hash
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.keys import ApiKeyPrincipal
from tenants.operator_tokens import token_of
from tenants.selectors import principal_can_write, principal_is_credential, principal_is_operator
from tenants.services import user_email_change, user_password_change
from tenants.throttling import password_attempt


class TenantBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.CharField(help_text="where password reset links go (empty for an API key)")
    role = serializers.CharField(help_text="operator, tenant_admin, tenant_member, or api_key")
    tenant = TenantBriefSerializer(allow_null=True)
    is_operator = serializers.BooleanField()
    can_write = serializers.BooleanField()
    api_key_prefix = serializers.CharField(allow_null=True)
    operator_token_prefix = serializers.CharField(allow_null=True)
    scopes = serializers.ListField(child=serializers.CharField())


class EmailChangeSerializer(serializers.Serializer):
    email = serializers.EmailField(allow_blank=True)
    current_password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"})


class MeView(APIView):
    @extend_schema(responses={200: MeSerializer})
    def get(self, request):
        return Response(MeSerializer(_me(request.user)).data)

    @extend_schema(request=EmailChangeSerializer, responses={200: MeSerializer})
    def patch(self, request):
        """Change your own email address (where reset links go); your current password is required."""
        if principal_is_credential(request.user):
            raise PermissionDenied("an API key or operator token has no email address; sign in as a person")
        serializer = EmailChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        password_attempt(
            request=request,
            username=request.user.username,
            field="current_password",
            attempt=lambda: user_email_change(user=request.user, **serializer.validated_data),
        )
        return Response(MeSerializer(_me(request.user)).data)


def _me(principal) -> dict:
    is_key = isinstance(principal, ApiKeyPrincipal)
    token = token_of(principal)
    tenant = principal.tenant
    return {
        "username": principal.username,
        "email": "" if is_key else principal.email,
        "role": "api_key" if is_key else principal.role,
        "tenant": {"id": tenant.pk, "name": tenant.name, "slug": tenant.slug} if tenant else None,
        "is_operator": principal_is_operator(principal),
        "can_write": principal_can_write(principal),
        "api_key_prefix": principal.api_key.prefix if is_key else None,
        "operator_token_prefix": token.prefix if token else None,
        "scopes": sorted(principal.api_key.scopes) if is_key else (sorted(token.scopes) if token else []),
    }


class PasswordChangeSerializer(serializers.Serializer):
    old_password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"})
    new_password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"})


class PasswordChangedSerializer(serializers.Serializer):
    detail = serializers.CharField()


class PasswordChangeView(APIView):
    @extend_schema(request=PasswordChangeSerializer, responses={200: PasswordChangedSerializer})
    def post(self, request):
        """Change your own password; the current one is required, and your other sessions are signed out."""
        if principal_is_credential(request.user):
            raise PermissionDenied("an API key or operator token has no password; sign in as a person")
        serializer = PasswordChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = password_attempt(
            request=request,
            username=request.user.username,
            field="old_password",
            attempt=lambda: user_password_change(user=request.user, **serializer.validated_data),
        )
        # Keep the session that made the change; every other one (perhaps a thief's) ends with the old hash.
        if hasattr(request, "session"):
            update_session_auth_hash(request, user)
        return Response({"detail": "password changed"})


urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("me/password/", PasswordChangeView.as_view(), name="me-password"),
]
