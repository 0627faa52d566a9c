"""POST /api/v1/capacity/plan-disaggregation: does prefill/decode disaggregation pay for a workload?
(docs/disaggregation.md#planning)

Body: ``workload`` (``arrival_rate_per_s``, ``input_tokens``, ``output_tokens``, optional ``input_tokens_sd`` and
``context_tokens``), an ``endpoint`` the caller can see (its model, hardware and prefill hardware profiles and its
SLO, each unless given), ``slo`` (``ttft_s``, ``tpot_s`` or ``tpot_ms``, ``percentile`` 50/90/95/99), the model (a stored
``model_profile`` or explicit ``model`` shape), the hardware (a stored ``hardware_profile``, whose ``kv_link_gbps``
is the link, or explicit ``hardware`` figures; ``prefill_hardware_profile`` for a prefill pool on other GPUs), the
step times (``engine_profile``: a calibrated simulator profile by name, or explicit ``step_model``) and
``link_latency_s``; ``min_uncached_tokens`` (the endpoint's ``pd_min_uncached_tokens`` unless given, else 0): prompts
under it skip the prefill pool, and the answer's ``threshold`` recommends one. The answer names the recommended design with both designs' replicas, GPUs, dollars and latencies
at the percentile. Bad input is a 400 naming the field; a workload neither design can serve is a 200 saying so.
"""

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from capacity.hardware.profiles import PROFILES
from capacity.models import HardwareProfile, ModelProfile
from capacity.planning.barriers import Hardware, ModelShape, PlannerInputError
from capacity.planning.disaggregation import PDSLO, PDWorkload, StepModel, plan_disaggregation
from endpoints.selectors import endpoints_visible_to
from tenants.api.base import IdOrNameRelatedField


def _float(**kwargs):
    return serializers.FloatField(**kwargs)


class PDModelSerializer(serializers.Serializer):
    n_layers = serializers.IntegerField(min_value=1)
    n_kv_heads = serializers.IntegerField(min_value=1)
    d_head = serializers.IntegerField(min_value=1)
    dtype_bytes = serializers.IntegerField(min_value=1, default=2)
    weights_gb = _float(min_value=0, default=0.0)


class PDHardwareSerializer(serializers.Serializer):
    gpu_memory_gb = _float(min_value=0.001)
    overhead_gb = _float(min_value=0, default=0.0)
    gpus_per_replica = serializers.IntegerField(min_value=1, default=1)
    usd_per_gpu_hour = _float(min_value=0, default=0.0)
    kv_link_gbps = _float(min_value=0.001, required=False)


class PDStepSerializer(serializers.Serializer):
    decode_t0_s = _float(min_value=1e-6)
    decode_per_seq_s = _float(min_value=0)
    decode_per_ctx_token_s = _float(min_value=0)
    prefill_tokens_per_s = _float(min_value=0.001)
    prefill_overhead_s = _float(min_value=0, default=0.0)
    chunk_tokens = serializers.IntegerField(min_value=1, default=8192)
    max_batch = serializers.IntegerField(min_value=1, default=256)


class PDWorkloadSerializer(serializers.Serializer):
    arrival_rate_per_s = _float(min_value=0.0001, max_value=1e6)
    input_tokens = _float(min_value=1, max_value=10_000_000)
    output_tokens = _float(min_value=1, max_value=10_000_000)
    input_tokens_sd = _float(min_value=0, default=0.0)
    context_tokens = _float(min_value=1, required=False)


class PDSloSerializer(serializers.Serializer):
    ttft_s = _float(min_value=0.001, max_value=3600)
    tpot_s = _float(min_value=0.0001, max_value=60, required=False)
    tpot_ms = _float(min_value=0.1, max_value=60_000, required=False)
    percentile = serializers.ChoiceField(choices=[50, 90, 95, 99], default=90)

    def validate(self, attrs):
        if "tpot_ms" in attrs:
            attrs.setdefault("tpot_s", attrs.pop("tpot_ms") / 1000)
        if "tpot_s" not in attrs:
            raise serializers.ValidationError({"tpot_s": ["give tpot_s or tpot_ms"]})
        return attrs


class PlanPDRequestSerializer(serializers.Serializer):
    endpoint = IdOrNameRelatedField(queryset=endpoints_visible_to(None), required=False)
    model_profile = IdOrNameRelatedField(queryset=ModelProfile.objects.all(), required=False)
    hardware_profile = IdOrNameRelatedField(queryset=HardwareProfile.objects.all(), required=False)
    prefill_hardware_profile = IdOrNameRelatedField(queryset=HardwareProfile.objects.all(), required=False)
    model = PDModelSerializer(required=False)
    hardware = PDHardwareSerializer(required=False)
    engine_profile = serializers.ChoiceField(choices=sorted(PROFILES), required=False)
    step_model = PDStepSerializer(required=False)
    workload = PDWorkloadSerializer()
    slo = PDSloSerializer(required=False)
    link_latency_s = _float(min_value=0, max_value=10, default=0.0)
    min_uncached_tokens = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        # A tenant plans only on endpoints it can see; another tenant's endpoint "does not exist".
        self.fields["endpoint"].queryset = endpoints_visible_to(request.user if request else None)

    def validate(self, attrs):
        endpoint = attrs.get("endpoint")
        if endpoint is not None:  # its profiles and SLO, unless given
            attrs.setdefault("model_profile", endpoint.model_profile)
            attrs.setdefault("min_uncached_tokens", endpoint.pd_min_uncached_tokens)
            attrs.setdefault("hardware_profile", endpoint.hardware_profile)
            if endpoint.prefill_hardware_profile is not None:
                attrs.setdefault("prefill_hardware_profile", endpoint.prefill_hardware_profile)
            attrs.setdefault(
                "slo", {"ttft_s": endpoint.ttft_slo_ms / 1000, "tpot_s": endpoint.tpot_slo_ms / 1000, "percentile": 90}
            )
        errors = {}
        if "slo" not in attrs:
            errors["slo"] = ["give slo (ttft_s, tpot_s) or an endpoint"]
        if "model" not in attrs and "model_profile" not in attrs:
            errors["model"] = ["give model_profile or model (n_layers, n_kv_heads, d_head)"]
        if "hardware" not in attrs and "hardware_profile" not in attrs:
            errors["hardware"] = ["give hardware_profile or hardware (gpu_memory_gb, kv_link_gbps)"]
        if "step_model" not in attrs and "engine_profile" not in attrs:
            errors["step_model"] = ["give engine_profile (a calibrated profile's name) or step_model"]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


def _model(data) -> ModelShape:
    if "model" in data:
        return ModelShape(**data["model"])
    p = data["model_profile"]
    return ModelShape(p.n_layers, p.n_kv_heads, p.d_head, p.dtype_bytes, p.weights_gb)


def _hardware(profile: HardwareProfile | None, given: dict | None) -> tuple[Hardware, float | None]:
    if given is not None:
        link = given.get("kv_link_gbps")
        return Hardware(**{k: v for k, v in given.items() if k != "kv_link_gbps"}), link
    hw = Hardware(
        gpu_memory_gb=profile.gpu_memory_gb,
        overhead_gb=profile.memory_overhead_gb,
        gpus_per_replica=profile.gpus_per_replica,
        usd_per_gpu_hour=profile.usd_per_gpu_hour or 0.0,
    )
    return hw, profile.kv_link_gbps


class PlanPDView(APIView):
    @extend_schema(request=PlanPDRequestSerializer, responses={200: dict})
    def post(self, request):
        serializer = PlanPDRequestSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        hardware, link = _hardware(data.get("hardware_profile"), data.get("hardware"))
        if not link:
            raise serializers.ValidationError(
                {"hardware.kv_link_gbps": ["no KV link bandwidth: set the hardware profile's kv_link_gbps or give it"]}
            )
        prefill_hardware = None
        if "prefill_hardware_profile" in data:
            prefill_hardware, _ = _hardware(data["prefill_hardware_profile"], None)
        if "step_model" in data:
            step = StepModel(**data["step_model"])
        else:
            step = StepModel.from_profile(PROFILES[data["engine_profile"]])
        try:
            result = plan_disaggregation(
                model=_model(data),
                hardware=hardware,
                prefill_hardware=prefill_hardware,
                step=step,
                workload=PDWorkload(**data["workload"]),
                slo=PDSLO(**data["slo"]),
                link_gbps=link,
                link_latency_s=data["link_latency_s"],
                min_uncached_tokens=data.get("min_uncached_tokens", 0),
            )
        except PlannerInputError as exc:
            raise serializers.ValidationError({field: [message] for field, message in exc.errors.items()}) from exc
        return Response({**result.as_dict(), "kv_link_gbps": link})


urlpatterns = [path("capacity/plan-disaggregation", PlanPDView.as_view(), name="capacity-plan-disaggregation")]
