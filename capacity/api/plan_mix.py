"""POST /api/v1/capacity/plan-mix: the heterogeneous planner (docs/algorithms.md#the-heterogeneous-planner).

Body: ``profiles`` (hardware profile ids, each with the simulator roofline profile its per-bucket capacity comes
from), ``buckets`` (the workload's request-size histogram), ``slo`` (TTFT, TPOT) and an optional solver
``time_limit_s``. A profile without a price, a bucket no profile serves within the SLO, too little availability or
a solver time-out is a 400 naming the field.
"""

import math

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.hardware.profiles import PROFILES, ROOFLINES
from capacity.models import HardwareProfile
from capacity.planning.inputs import plan_mix_from_profiles
from capacity.planning.mix import PlanError
from tenants.api.base import IdOrNameRelatedField


def _finite(value: float) -> None:
    if not math.isfinite(value):
        raise serializers.ValidationError("must be a finite number")


FINITE = {"validators": [_finite]}


class MixProfileSerializer(serializers.Serializer):
    hardware_profile = IdOrNameRelatedField(queryset=HardwareProfile.objects.all())
    sim_profile = serializers.ChoiceField(choices=sorted(p for p in PROFILES if p in ROOFLINES))


class MixBucketSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    prompt_tokens = serializers.IntegerField(min_value=0, max_value=1_000_000)
    output_tokens = serializers.IntegerField(min_value=1, max_value=1_000_000)
    rate_rps = serializers.FloatField(min_value=0, max_value=1e6, **FINITE)


class MixSloSerializer(serializers.Serializer):
    ttft_s = serializers.FloatField(min_value=0.001, max_value=3600, **FINITE)
    tpot_s = serializers.FloatField(min_value=0.0001, max_value=60, **FINITE)


class PlanMixRequestSerializer(serializers.Serializer):
    profiles = MixProfileSerializer(many=True, allow_empty=False)
    buckets = MixBucketSerializer(many=True, allow_empty=False)
    slo = MixSloSerializer()
    time_limit_s = serializers.FloatField(min_value=0.01, max_value=60, default=10.0, **FINITE)

    def validate_profiles(self, value):
        ids = [item["hardware_profile"].pk for item in value]
        if len(set(ids)) != len(ids):
            raise serializers.ValidationError("each hardware profile may appear once")
        return value

    def validate_buckets(self, value):
        names = [item["name"] for item in value]
        if len(set(names)) != len(names):
            raise serializers.ValidationError("bucket names must be unique")
        return value


class PlanMixView(APIView):
    @extend_schema(request=PlanMixRequestSerializer, responses={200: dict})
    def post(self, request):
        serializer = PlanMixRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            result = plan_mix_from_profiles(
                profiles=[(item["hardware_profile"], item["sim_profile"]) for item in data["profiles"]],
                buckets=[dict(b) for b in data["buckets"]],
                ttft_s=data["slo"]["ttft_s"],
                tpot_s=data["slo"]["tpot_s"],
                time_limit_s=data["time_limit_s"],
            )
        except PlanError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from exc
        return Response(result)


urlpatterns = [path("capacity/plan-mix", PlanMixView.as_view(), name="capacity-plan-mix")]
