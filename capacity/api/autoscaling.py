"""/api/v1/autoscaler-decisions/: every autoscaler decision with its inputs and reason, read-only, tenant-scoped.

A decision's inputs and reason carry the endpoint's whole demand (every tenant's requests and MU): operators see
every endpoint's, a tenant only those of the endpoints it owns, never a shared one it merely reserves on (the
console's endpoint page hides them the same way, ``console.selectors.shows_whole_endpoint``)."""

from rest_framework import serializers

from capacity.models import AutoscalerDecision
from endpoints.selectors import endpoints_owned_by
from tenants.api.base import ScopedReadOnlyViewSet


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
        return queryset.filter(endpoint__in=endpoints_owned_by(principal).values("pk"))


def register(router) -> None:
    router.register("autoscaler-decisions", AutoscalerDecisionViewSet, basename="autoscaler-decision")
