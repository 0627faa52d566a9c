"""/api/v1/me/: who the caller is, for clients and the console to adapt to the caller's role."""

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants.keys import ApiKeyPrincipal
from tenants.selectors import principal_can_write, principal_is_operator


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


urlpatterns = [path("me/", MeView.as_view(), name="me")]
