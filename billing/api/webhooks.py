"""/api/v1/webhooks/: where alert notifications are POSTed. Tenant admins manage their tenant's; operators any."""

import ipaddress
from urllib.parse import urlsplit

from django.db import transaction
from rest_framework import serializers

from billing.models import Webhook
from billing.selectors import webhooks_visible_to
from billing.slo import WINDOW_PAIRS
from config.api_base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, principal_from
from tenants.models import Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to
from tenants.services import audit_log

SEVERITIES = sorted({p.severity for p in WINDOW_PAIRS})


def _is_internal(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in ("localhost", "") or host.endswith((".localhost", ".local", ".internal")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_private or address.is_loopback or address.is_link_local or address.is_reserved


class WebhookSerializer(serializers.ModelSerializer):
    tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to,
        queryset=Tenant.objects.all(),
        required=False,
        allow_null=True,
        help_text="empty = every alert (operators only)",
    )
    secret = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=128)
    severities = serializers.ListField(child=serializers.ChoiceField(choices=SEVERITIES), required=False)

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "tenant", "secret", "severities", "enabled", "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate_url(self, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise serializers.ValidationError("use an http(s) URL")
        if not principal_is_operator(principal_from(self)) and _is_internal(urlsplit(value).hostname or ""):
            # The worker POSTs from inside the platform's network: tenants may not aim it at internal services.
            raise serializers.ValidationError("webhooks must point at a public host")
        return value

    def validate(self, attrs):
        principal = principal_from(self)
        if not principal_is_operator(principal):
            # Tenants' hooks are always their own: they never receive other tenants' alerts.
            attrs["tenant"] = Tenant.objects.get(pk=principal_tenant_id(principal))
        return attrs


class WebhookViewSet(ScopedModelViewSet):
    model = Webhook
    serializer_class = WebhookSerializer
    filterset_fields = ["tenant", "enabled"]
    ordering_fields = ["name", "created_at"]

    def visible_queryset(self, principal):
        return webhooks_visible_to(principal)

    @transaction.atomic
    def create_object(self, data):
        hook = Webhook(**data)
        hook.full_clean()
        hook.save()
        audit_log(actor=self.request.user, action="webhook.create", obj=hook, detail={"url": hook.url})
        return hook

    @transaction.atomic
    def update_object(self, instance, data):
        for name, value in data.items():
            setattr(instance, name, value)
        instance.full_clean()
        instance.save()
        audit_log(actor=self.request.user, action="webhook.update", obj=instance, detail={"fields": sorted(data)})
        return instance

    @transaction.atomic
    def delete_object(self, instance):
        audit_log(actor=self.request.user, action="webhook.delete", obj=instance, detail={"name": instance.name})
        instance.delete()


def register(router) -> None:
    router.register("webhooks", WebhookViewSet, basename="webhook")
