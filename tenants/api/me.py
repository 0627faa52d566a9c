"""/api/v1/me/: who the caller is, for clients and the console to adapt to the caller's role;
/api/v1/me/password/: a person changes their own password."""

from django.contrib.auth import update_session_auth_hash
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.keys import ApiKeyPrincipal
from tenants.selectors import principal_can_write, principal_is_api_key, principal_is_operator
from tenants.services import user_password_change


class TenantBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="operator, tenant_admin, tenant_member, or api_key")
    tenant = TenantBriefSerializer(allow_null=True)
    is_operator = serializers.BooleanField()
    can_write = serializers.BooleanField()
    api_key_prefix = serializers.CharField(allow_null=True)
    scopes = serializers.ListField(child=serializers.CharField())


class MeView(APIView):
    @extend_schema(responses={200: MeSerializer})
    def get(self, request):
        principal = request.user
        is_key = isinstance(principal, ApiKeyPrincipal)
        tenant = principal.tenant
        body = {
            "username": principal.username,
            "role": "api_key" if is_key else principal.role,
            "tenant": {"id": tenant.pk, "name": tenant.name, "slug": tenant.slug} if tenant else None,
            "is_operator": principal_is_operator(principal),
            "can_write": principal_can_write(principal),
            "api_key_prefix": principal.api_key.prefix if is_key else None,
            "scopes": sorted(principal.api_key.scopes) if is_key else [],
        }
        return Response(MeSerializer(body).data)


class PasswordChangeSerializer(serializers.Serializer):
    old_password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"})
    new_password = serializers.CharField(write_only=True, trim_whitespace=False, style={"input_type": "password"})


class PasswordChangedSerializer(serializers.Serializer):
    detail = serializers.CharField()


class PasswordChangeView(APIView):
    @extend_schema(request=PasswordChangeSerializer, responses={200: PasswordChangedSerializer})
    def post(self, request):
        """Change your own password; the current one is required, and your other sessions are signed out."""
        if principal_is_api_key(request.user):
            raise PermissionDenied("an API key has no password; sign in as a person")
        serializer = PasswordChangeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = user_password_change(user=request.user, **serializer.validated_data)
        # Keep the session that made the change; every other one (perhaps a thief's) ends with the old hash.
        if hasattr(request, "session"):
            update_session_auth_hash(request, user)
        return Response({"detail": "password changed"})


urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("me/password/", PasswordChangeView.as_view(), name="me-password"),
]
