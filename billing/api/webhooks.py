"""/api/v1/webhooks/: where alert notifications are POSTed. Tenant admins manage their tenant's; operators any."""

import httpx
from rest_framework import serializers

from billing.egress import EgressRefused, public_addresses
from billing.models import Webhook
from billing.selectors import webhooks_visible_to
from billing.services import webhook_create, webhook_delete, webhook_update
from billing.slo import WINDOW_PAIRS
from tenants.api.base import ScopedModelViewSet, ScopedPrimaryKeyRelatedField, principal_from
from tenants.models import Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to

SEVERITIES = sorted({p.severity for p in WINDOW_PAIRS})


def url_check_public(url: str) -> None:
    """Raise ``EgressRefused`` unless every address the URL's host resolves to now is public."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise EgressRefused(f"not a valid URL: {exc}") from exc
    public_addresses(parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80))


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
        return value

    def validate(self, attrs):
        principal = principal_from(self)
        if not principal_is_operator(principal):
            # Tenants' hooks are always their own: they never receive other tenants' alerts.
            attrs["tenant"] = Tenant.objects.get(pk=principal_tenant_id(principal))
        tenant = attrs["tenant"] if "tenant" in attrs else getattr(self.instance, "tenant", None)
        url = attrs.get("url", getattr(self.instance, "url", ""))
        if tenant is not None:
            # The worker POSTs from inside the platform's network. A tenant's hook is in its admins' hands (they
            # can edit it), so it must resolve to public addresses only; delivery checks again and connects to
            # the checked address (billing.notifiers). Operator-wide hooks (no tenant) may point inside: the
            # operators' alert router usually lives there.
            try:
                url_check_public(url)
            except EgressRefused as exc:
                raise serializers.ValidationError({"url": [f"webhooks must point at a public host: {exc}"]}) from exc
        return attrs


class WebhookViewSet(ScopedModelViewSet):
    model = Webhook
    serializer_class = WebhookSerializer
    filterset_fields = ["tenant", "enabled"]
    ordering_fields = ["name", "created_at"]

    def visible_queryset(self, principal):
        return webhooks_visible_to(principal)

    def create_object(self, data):
        return webhook_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        return webhook_update(webhook=instance, actor=self.request.user, **data)

    def delete_object(self, instance):
        webhook_delete(webhook=instance, actor=self.request.user)


def register(router) -> None:
    router.register("webhooks", WebhookViewSet, basename="webhook")
