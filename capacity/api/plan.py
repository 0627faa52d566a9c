"""POST /api/v1/capacity/plan: the three-barrier planner over HTTP.

Give a workload and either explicit model/hardware/throughput-table figures or stored objects (endpoint, model and
hardware profiles, benchmark); explicit figures win. Bad input is a 400 naming the field; an SLO no measured batch
meets is a 200 with ``feasible: false`` and the reason, since that is an answer, not an error. ``topology`` says the shape the plan assumed (GPUs per node,
interconnect domain, where one replica's GPUs go); with ``choose_tp`` the planner sizes every TP size (1, 2, 4, 8)
and plans at the one needing the fewest GPUs (``tensor_parallel``: each size's figures and why).
"""

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.planning.barriers import PlannerInputError
from capacity.planning.inputs import PlanRequest, plan_from_request
from endpoints.selectors import endpoints_visible_to
from placement import mig
from tenants.api.base import IdOrNameRelatedField

finite = {"allow_nan": False, "allow_infinity": False} if hasattr(serializers.FloatField, "allow_nan") else {}


def _float(**kwargs):
    return serializers.FloatField(**kwargs)


class ModelShapeSerializer(serializers.Serializer):
    n_layers = serializers.IntegerField(min_value=1)
    n_kv_heads = serializers.IntegerField(min_value=1)
    d_head = serializers.IntegerField(min_value=1)
    dtype_bytes = serializers.IntegerField(min_value=1, default=2)
    weights_gb = _float(min_value=0, default=0.0)


class HardwareSerializer(serializers.Serializer):
    gpu_memory_gb = _float(min_value=0.001, required=False)
    overhead_gb = _float(min_value=0, required=False)
    gpus_per_replica = serializers.IntegerField(min_value=1, required=False)
    usd_per_gpu_hour = _float(min_value=0, required=False)
    # The shape and links TP groups are placed on (the hardware profile's where one is given).
    gpus_per_node = serializers.IntegerField(min_value=1, required=False)
    interconnect_domain_gpus = serializers.IntegerField(min_value=1, required=False)
    domain_link_gb_s = _float(min_value=0.001, required=False)
    cross_link_gb_s = _float(min_value=0.001, required=False)
    mig_profile = serializers.RegexField(
        mig.PROFILE.pattern, required=False, allow_blank=True, help_text="a MIG slice (1g.10gb): one replica a slice"
    )


class WorkloadSerializer(serializers.Serializer):
    arrival_rate_per_s = _float(min_value=0)
    input_tokens = _float(min_value=0)
    output_tokens = _float(min_value=1)
    context_tokens = _float(min_value=1, required=False)


class SLOSerializer(serializers.Serializer):
    min_stream_tok_s = _float(min_value=0.001, required=False)
    tpot_ms = _float(min_value=0.001, required=False)
    ttft_s = _float(min_value=0.001, required=False)
    ttft_ms = _float(min_value=0.001, required=False)


class RowSerializer(serializers.Serializer):
    batch = serializers.IntegerField(min_value=1)
    per_stream_tok_s = _float(min_value=0.001)
    aggregate_tok_s = _float(min_value=0.001, required=False)
    ttft_p50_s = _float(min_value=0, required=False)
    ttft_p95_s = _float(min_value=0, required=False)


class SpikeSerializer(serializers.Serializer):
    load_multiplier = _float(min_value=1, default=3.0)
    cold_start_s = _float(min_value=0, default=90.0)
    utilization_ceiling = _float(min_value=0.01, max_value=1, default=0.8)


class PlanRequestSerializer(serializers.Serializer):
    endpoint = IdOrNameRelatedField(queryset=endpoints_visible_to(None), required=False)
    model_profile = IdOrNameRelatedField(queryset=ModelProfile.objects.all(), required=False)
    hardware_profile = IdOrNameRelatedField(queryset=HardwareProfile.objects.all(), required=False)
    benchmark = serializers.PrimaryKeyRelatedField(
        queryset=CapacityBenchmark.objects.filter(status=CapacityBenchmark.Status.SUCCEEDED), required=False
    )
    model = ModelShapeSerializer(required=False)
    hardware = HardwareSerializer(required=False)
    workload = WorkloadSerializer()
    slo = SLOSerializer(required=False)
    throughput_table = RowSerializer(many=True, required=False, allow_empty=False)
    headroom = _float(min_value=0, max_value=10, default=0.0)
    ttft_s = _float(min_value=0, required=False)
    spike = SpikeSerializer(required=False)
    choose_tp = serializers.BooleanField(default=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        # A tenant plans only on endpoints it can see; another tenant's endpoint "does not exist".
        self.fields["endpoint"].queryset = endpoints_visible_to(request.user if request else None)


class PlanView(APIView):
    @extend_schema(request=PlanRequestSerializer, responses={200: dict})
    def post(self, request):
        serializer = PlanRequestSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        for nested in ("model", "hardware", "workload", "slo", "spike"):
            if nested in data:
                data[nested] = dict(data[nested])
        if "throughput_table" in data:
            data["throughput_table"] = [dict(row) for row in data["throughput_table"]]
        try:
            result, sources = plan_from_request(PlanRequest(**data))
        except PlannerInputError as exc:
            raise serializers.ValidationError({field: [message] for field, message in exc.errors.items()}) from exc
        answer = {key: sources.pop(key) for key in ("topology", "tensor_parallel") if key in sources}
        return Response({**result.as_dict(), "sources": sources, **answer})


urlpatterns = [path("capacity/plan", PlanView.as_view(), name="capacity-plan")]
