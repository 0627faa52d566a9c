"""/api/v1/replicas/: the replicas behind visible endpoints, with their lifecycle history; operators attach an
existing vLLM server by URL (POST: ``endpoint``, ``url``, optional ``name``, ``concurrency_limit`` and
``served_model_name``, the name it serves the model under when that is not the endpoint's, and
``kv_events_endpoint``, where it publishes its KV-cache events), which is ready only
once it has shown to be a vLLM server serving that name (``endpoints.services.replica_attach``). ``POST
/api/v1/replicas/{id}/interruption-notice/`` (operators, or the node agent watching the cloud's metadata): the
replica's instance is taken in ``notice_s`` seconds; the autoscaler replaces it now, it drains 30 s before and stops
then (``capacity.autoscaling.services.replica_interruption_notice``).

Where a replica runs (its URL, actuator, pod or process name, and failure or transition texts that quote pids,
ports and addresses) is shown to operators and the endpoint's owner only; a tenant that reserves on a shared
endpoint sees each replica's state and health under a neutral name (``replica-<id>``), and an ``actuator`` filter
matches only the replicas whose placement it may see.
"""

from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from capacity.autoscaling.services import MAX_NOTICE_S, replica_interruption_notice
from endpoints.models import Endpoint, Replica, ReplicaRole, ReplicaTransition
from endpoints.selectors import (
    replica_placement_redacted,
    replica_placement_visible,
    replicas_visible_to,
    replicas_with_placement_visible_to,
)
from endpoints.services import replica_attach
from tenants.api.base import WRITE, IdOrNameRelatedField, ScopedViewSetMixin


class ReplicaTransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReplicaTransition
        fields = ["from_state", "to_state", "at", "reason"]


class ReplicaSerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)
    # Empty until a replica has an address (a launch that failed) and for whoever may not see placement, so the
    # schema says a string, not a URI.
    url = serializers.CharField(read_only=True, help_text="the replica's base URL; empty when unknown or hidden")

    class Meta:
        model = Replica
        fields = [
            "id", "endpoint", "endpoint_name", "name", "url", "served_model_name", "kv_events_endpoint", "role",
            "state", "state_changed_at",
            "is_standby", "actuator", "concurrency_limit", "last_probe_at", "last_probe_ok",
            "consecutive_probe_failures", "failure_reason", "terminate_at", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    def to_representation(self, replica):
        data = super().to_representation(replica)
        request = self.context.get("request")
        if request is not None and not replica_placement_visible(replica=replica, principal=request.user):
            # Addresses, pids and pod names of a shared endpoint map the platform's internal network for whoever
            # reserves on it; its health is what such a tenant needs.
            data.update({k: v for k, v in replica_placement_redacted(replica).items() if k in data})
            data["served_model_name"] = ""  # what the operators run the endpoint on, like the launch options
            data["kv_events_endpoint"] = ""  # an internal address, like the URL
            for transition in data.get("transitions") or ():
                transition["reason"] = ""
        return data


class ReplicaDetailSerializer(ReplicaSerializer):
    transitions = ReplicaTransitionSerializer(many=True, read_only=True)

    class Meta(ReplicaSerializer.Meta):
        fields = [*ReplicaSerializer.Meta.fields, "transitions"]
        read_only_fields = fields


class ReplicaAttachSerializer(serializers.Serializer):
    """What an operator gives to attach a running vLLM server; the answer is the replica as the list shows it."""

    endpoint = IdOrNameRelatedField(queryset=Endpoint.objects.all())
    url = serializers.CharField(max_length=255, help_text="the server's base URL, e.g. http://10.0.0.7:8000")
    name = serializers.CharField(max_length=120, required=False, allow_blank=True)
    concurrency_limit = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    served_model_name = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        help_text="the model name the server serves (its --served-model-name) when it is not the endpoint's name",
    )
    kv_events_endpoint = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        help_text="where the server publishes its KV-cache events (tcp://host:port, its --kv-events-config)",
    )
    role = serializers.ChoiceField(
        choices=ReplicaRole.choices,
        required=False,
        help_text="its pool: prefill or decode on a disaggregated endpoint (default decode), mixed on an aggregated one",
    )

    def to_representation(self, replica):
        return ReplicaSerializer(replica, context=self.context).data


class InterruptionNoticeSerializer(serializers.Serializer):
    notice_s = serializers.FloatField(
        min_value=0.0,
        max_value=MAX_NOTICE_S,
        default=120.0,
        help_text="seconds until the instance is taken (AWS spot: 120; GCP, Azure: 30)",
    )


class ReplicaViewSet(
    ScopedViewSetMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.ListModelMixin,
    viewsets.GenericViewSet,
):
    model = Replica
    serializer_class = ReplicaSerializer
    write_access = WRITE.OPERATORS  # tenants read their replicas; only operators attach one
    filterset_fields = ["endpoint", "state", "is_standby", "actuator", "role"]
    ordering_fields = ["name", "state_changed_at", "created_at"]

    def visible_queryset(self, principal):
        queryset = replicas_visible_to(principal)
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("transitions")
        return queryset

    def get_serializer_class(self):
        if self.action == "create":
            return ReplicaAttachSerializer
        return ReplicaDetailSerializer if self.action == "retrieve" else ReplicaSerializer

    def create_object(self, data):
        return replica_attach(actor=self.request.user, **data)

    @action(detail=True, methods=["post"], url_path="interruption-notice")
    def interruption_notice(self, request, pk=None):
        """The replica's instance is taken in ``notice_s`` seconds: drain it now, stop it then, replace it."""
        replica = self.get_object()
        body = InterruptionNoticeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        replica_interruption_notice(replica=replica, notice_s=body.validated_data["notice_s"], actor=request.user)
        replica.refresh_from_db()
        return Response(ReplicaDetailSerializer(replica, context=self.get_serializer_context()).data)

    def filter_queryset(self, queryset):
        if "actuator" in self.request.query_params:
            # Filtering by actuator would tell which one runs a shared endpoint's replicas, which the rows hide.
            queryset = queryset.filter(pk__in=replicas_with_placement_visible_to(self.request.user).values("pk"))
        return super().filter_queryset(queryset)


def register(router) -> None:
    router.register("replicas", ReplicaViewSet, basename="replica")
