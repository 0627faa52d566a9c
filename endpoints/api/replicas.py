"""/api/v1/replicas/: read-only view of the replicas behind visible endpoints, with their lifecycle history."""

from rest_framework import serializers

from config.api_base import ScopedReadOnlyViewSet
from endpoints.models import Replica, ReplicaTransition
from endpoints.selectors import replicas_visible_to


class ReplicaTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReplicaTransition
        fields = ["from_state", "to_state", "at", "reason"]


class ReplicaSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)

    class Meta:
        model = Replica
        fields = [
            "id", "endpoint", "endpoint_name", "name", "url", "state", "state_changed_at", "is_standby", "actuator",
            "concurrency_limit", "last_probe_at", "last_probe_ok", "consecutive_probe_failures", "failure_reason",
            "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class ReplicaDetailSerializer(ReplicaSerializer):
    transitions = ReplicaTransitionSerializer(many=True, read_only=True)

    class Meta(ReplicaSerializer.Meta):
        fields = [*ReplicaSerializer.Meta.fields, "transitions"]
        read_only_fields = fields


class ReplicaViewSet(ScopedReadOnlyViewSet):
    model = Replica
    serializer_class = ReplicaSerializer
    filterset_fields = ["endpoint", "state", "is_standby", "actuator"]
    ordering_fields = ["name", "state_changed_at", "created_at"]

    def visible_queryset(self, principal):
        queryset = replicas_visible_to(principal)
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("transitions")
        return queryset

    def get_serializer_class(self):
        return ReplicaDetailSerializer if self.action == "retrieve" else ReplicaSerializer


def register(router) -> None:
    router.register("replicas", ReplicaViewSet, basename="replica")
