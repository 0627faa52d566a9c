"""/api/v1/capacity/benchmarks/: stored replica benchmarks (read by everyone: catalogue data per model and
hardware), and ``POST …/run`` to benchmark a live replica of an endpoint in a worker (operators).

A sweep runs against one endpoint's replica, and its ``detail`` records which (the endpoint's name, the replica's
URL, progress lines naming its adapters, error texts quoting addresses): operators see all of it, anyone else only
the measured figures (``DETAIL_SHOWN_TO_TENANTS``), since the endpoint may be another tenant's."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from capacity.models import CapacityBenchmark
from capacity.services import benchmark_enqueue
from endpoints.models import Endpoint, Replica
from tenants.api.base import IdOrNameRelatedField, ScopedReadOnlyViewSet
from tenants.selectors import principal_is_operator

# The figures a sweep measured, the same whichever endpoint it ran on; the rest of ``detail`` names where it ran.
DETAIL_SHOWN_TO_TENANTS = frozenset(
    {"driver", "feasible", "slo", "fit", "mu_per_min", "tables", "capacity", "lora_overhead", "time_scale", "quick"}
)


class BenchmarkSerializer(serializers.ModelSerializer):
    model_profile_name = serializers.CharField(source="model_profile.name", read_only=True)
    hardware_profile_name = serializers.CharField(source="hardware_profile.name", read_only=True)

    class Meta:
        model = CapacityBenchmark
        fields = [
            "id", "model_profile", "model_profile_name", "hardware_profile", "hardware_profile_name", "version",
            "status", "created_at", "finished_at", "throughput_table", "b_max", "alpha", "alpha_cached", "beta",
            "gamma", "mu_per_min", "fit_error", "detail",
        ]  # fmt: skip
        read_only_fields = fields

    def to_representation(self, instance):
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not principal_is_operator(request.user):
            data["detail"] = {k: v for k, v in (data.get("detail") or {}).items() if k in DETAIL_SHOWN_TO_TENANTS}
        return data


class BenchmarkRunSerializer(serializers.Serializer):
    endpoint = IdOrNameRelatedField(queryset=Endpoint.objects.select_related("hardware_profile"))
    replica = serializers.PrimaryKeyRelatedField(queryset=Replica.objects.all(), required=False)
    quick = serializers.BooleanField(default=False)
    pin = serializers.BooleanField(default=False)

    def validate(self, attrs):
        replica = attrs.get("replica")
        if replica is not None and replica.endpoint_id != attrs["endpoint"].pk:
            raise serializers.ValidationError({"replica": ["belongs to another endpoint"]})
        return attrs


class BenchmarkViewSet(ScopedReadOnlyViewSet):
    model = CapacityBenchmark
    serializer_class = BenchmarkSerializer
    filterset_fields = ["model_profile", "hardware_profile", "status"]
    ordering_fields = ["created_at", "version"]

    def visible_queryset(self, principal):
        return CapacityBenchmark.objects.select_related("model_profile", "hardware_profile")

    @extend_schema(request=BenchmarkRunSerializer, responses={202: dict})
    @action(detail=False, methods=["post"])
    def run(self, request):
        if not principal_is_operator(request.user):
            raise PermissionDenied("only operators benchmark replicas (a sweep loads a serving replica)")
        serializer = BenchmarkRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        benchmark_enqueue(
            endpoint=data["endpoint"], replica=data.get("replica"), quick=data["quick"], pin=data["pin"],
            actor=request.user,
        )  # fmt: skip
        return Response({"queued": True, "endpoint": data["endpoint"].pk}, status=status.HTTP_202_ACCEPTED)


def register(router) -> None:
    router.register("capacity/benchmarks", BenchmarkViewSet, basename="capacity-benchmark")
