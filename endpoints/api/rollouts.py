"""/api/v1/endpoint-versions/ (an endpoint's version history, read-only) and /api/v1/rollouts/ (start a rollout,
follow its progress and decisions, pause / resume / promote / roll back).

Operators act; a tenant sees the versions and rollouts of the endpoints it owns (anything else is a 404) and
cannot act on them. Every action goes through ``endpoints.rollouts.services``, which records a RolloutEvent and an
audit entry.
"""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from endpoints.models import Endpoint, EndpointVersion, Rollout, RolloutEvent, RolloutStrategy
from endpoints.rollouts import services as rollout_services
from endpoints.rollouts.selectors import rollouts_visible_to, versions_visible_to
from endpoints.selectors import endpoints_owned_by
from tenants.api.base import WRITE, IdOrNameRelatedField, ScopedPrimaryKeyRelatedField, ScopedViewSetMixin


# -- versions -----------------------------------------------------------------------------------------------------
class EndpointVersionSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    model_profile_name = serializers.CharField(source="model_profile.name", read_only=True)
    hardware_profile_name = serializers.CharField(source="hardware_profile.name", read_only=True)
    is_current = serializers.BooleanField(read_only=True, default=False, help_text="the version serving traffic")
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True)

    class Meta:
        model = EndpointVersion
        fields = [
            "id", "endpoint", "endpoint_name", "number", "model_profile", "model_profile_name", "hardware_profile",
            "hardware_profile_name", "runtime", "launch_options", "is_current", "note", "created_by", "created_at",
        ]  # fmt: skip
        read_only_fields = fields


class EndpointVersionViewSet(ScopedViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """Versions are immutable: a change of model, profiles, runtime or launch options (PATCH on the endpoint)
    creates the next one."""

    model = EndpointVersion
    serializer_class = EndpointVersionSerializer
    filterset_fields = ["endpoint", "runtime", "model_profile", "hardware_profile"]
    ordering_fields = ["number", "created_at"]

    def visible_queryset(self, principal):
        return versions_visible_to(principal)


# -- rollouts -----------------------------------------------------------------------------------------------------
class RolloutEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RolloutEvent
        fields = ["id", "at", "kind", "from_state", "to_state", "message", "data"]
        read_only_fields = fields


class RolloutSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    from_version_number = serializers.IntegerField(source="from_version.number", read_only=True)
    to_version_number = serializers.IntegerField(source="to_version.number", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True)
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = Rollout
        fields = [
            "id", "endpoint", "endpoint_name", "from_version", "from_version_number", "to_version",
            "to_version_number", "strategy", "canary_steps", "step_index", "step_duration_s", "traffic_percent",
            "max_surge", "baseline_ready", "health_timeout_s", "error_rate_margin", "latency_burn_margin",
            "min_samples", "state", "is_active", "paused_from", "reason", "created_by", "created_at", "started_at",
            "finished_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields


class RolloutDetailSerializer(RolloutSerializer):
    events = RolloutEventSerializer(many=True, read_only=True, help_text="every decision, oldest first")

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "events"]
        read_only_fields = fields


class RolloutStartSerializer(serializers.Serializer):
    """Start moving an endpoint's traffic to one of its versions."""

    endpoint = IdOrNameRelatedField(scope=endpoints_owned_by, queryset=Endpoint.objects.all())
    to_version = ScopedPrimaryKeyRelatedField(scope=versions_visible_to, queryset=EndpointVersion.objects.all())
    strategy = serializers.ChoiceField(choices=RolloutStrategy.choices, default=RolloutStrategy.ALL_AT_ONCE)
    canary_steps = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=100),
        required=False,
        min_length=1,
        max_length=20,
        help_text="canary: percents of requests to the new version, rising, ending at 100 (default 10, 50, 100)",
    )
    step_duration_s = serializers.IntegerField(min_value=1, max_value=86400, default=60)
    max_surge = serializers.IntegerField(min_value=1, max_value=64, default=2)
    health_timeout_s = serializers.IntegerField(min_value=1, max_value=86400, default=600)
    error_rate_margin = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.05)
    latency_burn_margin = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.10)
    min_samples = serializers.IntegerField(min_value=1, max_value=1_000_000, default=20)

    def validate(self, attrs):
        if attrs["to_version"].endpoint_id != attrs["endpoint"].pk:
            raise serializers.ValidationError({"to_version": ["is a version of another endpoint"]})
        return attrs


class RolloutActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


ACTIONS = {
    "pause": rollout_services.pause_rollout,
    "resume": rollout_services.resume_rollout,
    "promote": rollout_services.promote_rollout,
    "rollback": rollout_services.rollback_rollout,
}


class RolloutViewSet(
    ScopedViewSetMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,
):
    """A rollout is started (POST), followed (GET, with its events on the detail) and steered with the pause /
    resume / promote / rollback actions; it is never edited or deleted."""

    model = Rollout
    serializer_class = RolloutSerializer
    write_access = WRITE.OPERATORS
    filterset_fields = ["endpoint", "state", "strategy", "to_version"]
    ordering_fields = ["created_at", "finished_at"]

    def visible_queryset(self, principal):
        queryset = rollouts_visible_to(principal)
        if self.action != "list":
            queryset = queryset.prefetch_related("events")
        return queryset

    def get_serializer_class(self):
        if self.action in ("create", "metadata"):  # OPTIONS describes what a POST takes
            return RolloutStartSerializer
        if self.action in ACTIONS:
            return RolloutActionSerializer
        return RolloutDetailSerializer if self.action == "retrieve" else RolloutSerializer

    @extend_schema(request=RolloutStartSerializer, responses={201: RolloutDetailSerializer})
    def create(self, request, *args, **kwargs):
        body = RolloutStartSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        rollout = rollout_services.start_rollout(
            endpoint=data.pop("endpoint"), to_version=data.pop("to_version"), user=request.user, **data
        )
        return Response(self._detail(rollout.pk), status=status.HTTP_201_CREATED)

    def _detail(self, pk: int) -> dict:
        rollout = rollouts_visible_to(self.request.user).prefetch_related("events").get(pk=pk)
        return RolloutDetailSerializer(rollout, context=self.get_serializer_context()).data

    def _act(self, request, name: str) -> Response:
        rollout = self.get_object()  # a foreign rollout is a 404 before anything else
        body = RolloutActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        ACTIONS[name](rollout=rollout, user=request.user, reason=body.validated_data["reason"])
        return Response(self._detail(rollout.pk))

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Hold the rollout where it is: no replica is started or drained and traffic stays split as it is."""
        return self._act(request, "pause")

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Continue a paused rollout from the state it was paused in (a canary step is observed afresh)."""
        return self._act(request, "resume")

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def promote(self, request, pk=None):
        """Skip the remaining canary steps: all traffic to the new version (once its replicas are warmed up)."""
        return self._act(request, "promote")

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        """Traffic back to the old version; the new version's replicas are drained."""
        return self._act(request, "rollback")


def register(router) -> None:
    router.register("endpoint-versions", EndpointVersionViewSet, basename="endpoint-version")
    router.register("rollouts", RolloutViewSet, basename="rollout")
