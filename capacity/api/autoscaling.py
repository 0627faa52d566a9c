"""/api/v1/autoscaler-decisions/: every autoscaler decision with its inputs and reason, read-only, tenant-scoped."""

from rest_framework import serializers

from capacity.models import AutoscalerDecision
from config.api_base import ScopedReadOnlyViewSet
from endpoints.selectors import endpoints_visible_to
from tenants.selectors import principal_is_operator


class AutoscalerDecisionSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)

    class Meta:
        model = AutoscalerDecision
        fields = ["id", "endpoint", "endpoint_name", "at", "axis", "current", "desired", "reason", "inputs", "applied",
                  "tick"]  # fmt: skip
        read_only_fields = fields


class AutoscalerDecisionViewSet(ScopedReadOnlyViewSet):
    model = AutoscalerDecision
    serializer_class = AutoscalerDecisionSerializer
    filterset_fields = ["endpoint", "axis", "applied"]
    ordering_fields = ["at"]

    def visible_queryset(self, principal):
        queryset = AutoscalerDecision.objects.select_related("endpoint").order_by("-at", "-id")
        if principal_is_operator(principal):
            return queryset
        return queryset.filter(endpoint__in=endpoints_visible_to(principal).values("pk"))


def register(router) -> None:
    router.register("autoscaler-decisions", AutoscalerDecisionViewSet, basename="autoscaler-decision")
