"""/api/v1/alerts/: burn-rate alerts of the SLOs a principal can see (read-only), and acknowledging one (operators
any; a tenant's admins and write keys those of its own SLOs and of its own endpoints' endpoint-wide SLOs), audited.
Who acknowledged is shown as ``billing.selectors.alert_acknowledger_shown`` says: never another tenant's person."""

from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from billing.alerts import alert_acknowledge
from billing.models import Alert
from billing.selectors import alert_acknowledgeable_by, alert_acknowledger_shown, alerts_visible_to
from tenants.api.base import ScopedReadOnlyViewSet, principal_from
from tenants.selectors import principal_can_write


class AlertSerializer(serializers.ModelSerializer):
    slo_name = serializers.CharField(source="slo.name", read_only=True)
    endpoint = serializers.CharField(source="slo.endpoint.name", read_only=True)
    acknowledged_by = serializers.SerializerMethodField(
        help_text="who acknowledged it: a tenant sees its own people's usernames and 'an operator' for the operators"
    )

    class Meta:
        model = Alert
        fields = [
            "id", "slo", "slo_name", "endpoint", "severity", "state", "long_window", "short_window",
            "burn_rate_threshold", "burn_rate_long", "burn_rate_short", "started_at", "fired_at", "resolved_at",
            "acknowledged_at", "acknowledged_by",
        ]  # fmt: skip
        read_only_fields = fields

    def get_acknowledged_by(self, alert: Alert) -> str | None:
        return alert_acknowledger_shown(alert=alert, principal=principal_from(self))


class AlertViewSet(ScopedReadOnlyViewSet):
    model = Alert
    serializer_class = AlertSerializer
    filterset_fields = ["slo", "severity", "state"]
    ordering_fields = ["started_at", "fired_at", "severity"]

    def visible_queryset(self, principal):
        return alerts_visible_to(principal)

    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        alert = self.get_object()  # a foreign alert is a 404 before any permission talk
        if not principal_can_write(request.user):
            raise PermissionDenied("your role may only read alerts")
        if not alert_acknowledgeable_by(alert=alert, principal=request.user):
            raise PermissionDenied(
                "only operators acknowledge this alert: an endpoint-wide SLO of an endpoint not yours"
            )
        alert = alert_acknowledge(alert=alert, user=request.user)
        return Response(self.get_serializer(alert).data)


def register(router) -> None:
    router.register("alerts", AlertViewSet, basename="alert")
