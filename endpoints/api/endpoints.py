"""/api/v1/endpoints/: create, update, scale and delete endpoints (the OpenAI ``model`` names tenants call)."""

import math

from django.db.models import Count, OuterRef, Q, Subquery
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.autoscaling import pins
from capacity.models import CapacityBenchmark, HardwareProfile, ModelProfile
from capacity.runtimes.launch_options import launch_options_shown_to_non_owners, tenant_launch_option_errors
from endpoints.models import (
    ROLLOUT_ACTIVE_STATES,
    Endpoint,
    ReplicaRole,
    ReplicaState,
    Rollout,
    model_name_validator,
)
from endpoints.selectors import endpoint_is_owned_by, endpoints_visible_to
from endpoints.services import endpoint_create, endpoint_delete, endpoint_scale, endpoint_unpin, endpoint_update
from gateway.admission.classes import CLASSES
from tenants.api.base import IdOrNameRelatedField, ScopedModelViewSet, ScopedPrimaryKeyRelatedField, principal_from
from tenants.models import Tenant
from tenants.selectors import principal_is_operator, principal_tenant_id, tenants_visible_to


class ScalePinSerializer(serializers.Serializer):
    replicas = serializers.IntegerField()
    until = serializers.DateTimeField()
    set_by = serializers.CharField(source="set_by_label")
    reason = serializers.CharField()


class EndpointSerializer(serializers.ModelSerializer):
    owner_tenant = ScopedPrimaryKeyRelatedField(
        scope=tenants_visible_to,
        queryset=Tenant.objects.all(),
        required=False,
        allow_null=True,
        help_text="empty = a shared endpoint run by the operators (tenant users always create their own)",
    )
    model_profile = IdOrNameRelatedField(queryset=ModelProfile.objects.all())
    hardware_profile = IdOrNameRelatedField(queryset=HardwareProfile.objects.all())
    spot_hardware_profile = IdOrNameRelatedField(
        queryset=HardwareProfile.objects.all(),
        required=False,
        allow_null=True,
        help_text="a spot pool (capacity type spot, the endpoint's GPU type) for the replicas above the on-demand "
        "floor; empty: on-demand only",
    )
    fallback_hardware_profile = IdOrNameRelatedField(
        queryset=HardwareProfile.objects.all(),
        required=False,
        allow_null=True,
        help_text="hardware the replicas a scale-up cannot place as whole TP groups on the endpoint's own start on "
        "instead (its own GPUs per replica; it must hold the model); empty: such a scale-up waits",
    )
    pinned_benchmark = serializers.PrimaryKeyRelatedField(
        queryset=CapacityBenchmark.objects.all(), required=False, allow_null=True
    )
    launch_options = serializers.DictField(required=False, help_text="runtime launch options (JSON object)")
    prefill_hardware_profile = IdOrNameRelatedField(
        queryset=HardwareProfile.objects.all(),
        required=False,
        allow_null=True,
        help_text="disaggregated mode: the prefill pool's hardware (empty: the endpoint's)",
    )
    prefill_pinned_benchmark = serializers.PrimaryKeyRelatedField(
        queryset=CapacityBenchmark.objects.all(), required=False, allow_null=True
    )
    prefill_launch_options = serializers.DictField(
        required=False, help_text="disaggregated mode: the prefill pool's launch options (same allowlist)"
    )
    ready_prefill_replicas = serializers.IntegerField(read_only=True, default=0)
    fallback = IdOrNameRelatedField(
        scope=endpoints_visible_to,
        queryset=Endpoint.objects.all(),
        required=False,
        allow_null=True,
        help_text="endpoint that serves this one's requests when it would shed them, is failing or has no ready "
        "replica (for the fallback classes, for tenants that accept fallbacks); a shared endpoint or one of the same "
        "owner's; chains have no loop and at most 2 steps",
    )
    fallback_classes = serializers.ListField(
        child=serializers.ChoiceField(choices=list(CLASSES)),
        required=False,
        help_text="priority classes that may be served by the fallback",
    )
    ready_replicas = serializers.IntegerField(read_only=True, default=0)
    scale_pin = serializers.SerializerMethodField(
        help_text="an operator's manual scale the autoscaler holds until `until` (POST scale/; DELETE scale/ ends it)"
    )
    current_version = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="the version serving traffic (see /endpoint-versions/)"
    )
    active_rollout = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        default=None,
        help_text="the rollout in progress, if any: a PATCH of model, profiles, runtime or launch options creates a "
        "new version and starts one when running replicas must be replaced",
    )

    class Meta:
        model = Endpoint
        fields = [
            "id", "name", "owner_tenant", "model_profile", "hardware_profile", "spot_hardware_profile",
            "fallback_hardware_profile", "pinned_benchmark", "runtime", "launch_options", "min_replicas", "max_replicas", "desired_replicas",
            "desired_spot_replicas", "ready_replicas", "scale_pin", "scale_to_zero",
            "provisioned_concurrency", "concurrency_min", "concurrency_max", "concurrency_limit", "warm_pool_size",
            "routing_policy", "routing_plan", "ttft_slo_ms", "tpot_slo_ms", "fallback", "fallback_classes",
            "degrade_max_tokens", "degrade_slot_share", "current_version", "active_rollout",
            "serving_mode", "kv_connector", "pd_min_uncached_tokens", "prefill_hardware_profile",
            "prefill_pinned_benchmark", "prefill_launch_options", "prefill_min_replicas", "prefill_max_replicas",
            "prefill_desired_replicas", "ready_prefill_replicas", "created_at", "updated_at",
        ]  # fmt: skip
        # desired_replicas moves only through the scale action (or the autoscaler), within [min, max]; the prefill
        # pool's count only through the autoscaler, within [prefill_min, prefill_max].
        read_only_fields = [
            "id", "desired_replicas", "desired_spot_replicas", "prefill_desired_replicas", "current_version",
            "created_at", "updated_at",
        ]  # fmt: skip
        # Uniqueness is the services' (endpoints.services.NAME_TAKEN): DRF's validator would say "endpoint with
        # this name already exists" about another tenant's endpoint.
        extra_kwargs = {"name": {"validators": [model_name_validator]}}

    @extend_schema_field(ScalePinSerializer(allow_null=True))
    def get_scale_pin(self, instance) -> dict | None:
        pin = getattr(instance, "scale_pin", None)  # select_related: None when there is none
        if pin is None or pin.until <= timezone.now():
            return None
        return ScalePinSerializer(pin).data

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if "launch_options" in data and not endpoint_is_owned_by(endpoint=instance, principal=principal_from(self)):
            # Where and how the operators run a shared endpoint (actuator, Deployment, namespace, CPU placement) is
            # none of a reserving tenant's business; the allowlisted tuning, such as max_model_len, is.
            data["launch_options"] = launch_options_shown_to_non_owners(data["launch_options"])
            data["prefill_launch_options"] = launch_options_shown_to_non_owners(data.get("prefill_launch_options"))
            # The fleet's GPU types and prices behind a shared endpoint are the operators' too.
            data["routing_plan"] = {}
            data["spot_hardware_profile"] = None
            data["fallback_hardware_profile"] = None
            data["scale_pin"] = None  # which operator pinned a shared endpoint, and why, is the operators' own
        return data

    def validate_degrade_slot_share(self, value):
        if value is not None and not math.isfinite(value):  # NaN passes the model's [0, 1] validators
            raise serializers.ValidationError("must be a number in [0, 1]")
        return value

    def validate(self, attrs):
        principal = principal_from(self)
        if not principal_is_operator(principal):
            if self.instance is None:
                attrs["owner_tenant"] = Tenant.objects.get(pk=principal_tenant_id(principal))
            elif "owner_tenant" in attrs and attrs["owner_tenant"] != self.instance.owner_tenant:
                raise serializers.ValidationError({"owner_tenant": ["only operators may move an endpoint"]})
            if "launch_options" in attrs:
                # An allowlist (capacity.runtimes.launch_options): where and how replicas run on the operators'
                # machines, and what they load, is the operators' call; tenants resend those values unchanged.
                current = (self.instance.launch_options or {}) if self.instance is not None else {}
                if errors := tenant_launch_option_errors(attrs["launch_options"], current=current):
                    raise serializers.ValidationError({"launch_options": errors})
            if "prefill_launch_options" in attrs:
                current = (self.instance.prefill_launch_options or {}) if self.instance is not None else {}
                if errors := tenant_launch_option_errors(attrs["prefill_launch_options"], current=current):
                    raise serializers.ValidationError({"prefill_launch_options": errors})
        return attrs


class ScaleSerializer(serializers.Serializer):
    desired_replicas = serializers.IntegerField(min_value=0)
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    pin_minutes = serializers.IntegerField(
        min_value=1,
        max_value=pins.MAX_PIN_MINUTES,
        default=pins.DEFAULT_PIN_MINUTES,
        help_text="how long the autoscaler holds this count before deciding on demand again (autoscaled endpoints; "
        "DELETE on this path ends it sooner)",
    )


class EndpointViewSet(ScopedModelViewSet):
    model = Endpoint
    serializer_class = EndpointSerializer
    filterset_fields = [
        "name", "owner_tenant", "runtime", "routing_policy", "model_profile", "hardware_profile", "serving_mode",
    ]  # fmt: skip
    ordering_fields = ["name", "created_at", "desired_replicas"]

    def visible_queryset(self, principal):
        active = Rollout.objects.filter(endpoint=OuterRef("pk"), state__in=ROLLOUT_ACTIVE_STATES).values("pk")[:1]
        return (
            endpoints_visible_to(principal)
            .select_related("scale_pin")
            .annotate(
                ready_replicas=Count(
                    "replicas", filter=Q(replicas__state=ReplicaState.READY) & ~Q(replicas__role=ReplicaRole.PREFILL)
                ),
                ready_prefill_replicas=Count(
                    "replicas", filter=Q(replicas__state=ReplicaState.READY, replicas__role=ReplicaRole.PREFILL)
                ),
                active_rollout=Subquery(active),
            )
        )

    def may_change(self, principal, obj) -> bool:
        # A tenant sees shared endpoints it reserves capacity on, but only the operators run them.
        return endpoint_is_owned_by(endpoint=obj, principal=principal)

    def create_object(self, data):
        return endpoint_create(actor=self.request.user, **data)

    def update_object(self, instance, data):
        """Live settings apply at once (the proxy follows within a second, nothing restarts); a change of model,
        profiles, runtime or launch options makes a new version, rolled out when running replicas must be replaced:
        both in one transaction, in ``endpoint_update``."""
        instance = endpoint_update(endpoint=instance, actor=self.request.user, **data)
        return self.visible_queryset(self.request.user).get(pk=instance.pk)  # with the new version and rollout

    def delete_object(self, instance):
        endpoint_delete(endpoint=instance, actor=self.request.user)

    @extend_schema(request=ScaleSerializer, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"])
    def scale(self, request, pk=None):
        """Set the desired replica count within [min_replicas, max_replicas]; replicas start (or drain) at once. On an
        autoscaled endpoint the count is pinned for `pin_minutes` (default 60): the autoscaler holds it, says so in
        each decision, and decides on demand again when the pin expires (docs/algorithms.md#manual-scaling-pins)."""
        endpoint = self.get_object()
        body = ScaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        endpoint_scale(endpoint=endpoint, actor=request.user, **body.validated_data)
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(request=None, responses={200: EndpointSerializer})
    @scale.mapping.delete
    def unpin(self, request, pk=None):
        """End the operator's pin now: the autoscaler decides on demand from its next tick (a no-op without one)."""
        endpoint_unpin(endpoint=self.get_object(), actor=request.user)
        return Response(self.get_serializer(self.get_object()).data)


def register(router) -> None:
    router.register("endpoints", EndpointViewSet, basename="endpoint")
