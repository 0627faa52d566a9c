"""Admin for endpoints, replicas and the replica lifecycle history."""

from django import forms
from django.contrib import admin
from django.db import models

from endpoints.models import VERSIONED_FIELDS, Endpoint, Replica, ReplicaTransition
from endpoints.validation import fallback_errors, placement_option_errors, prefill_placement_errors
from tenants.admin.base import OperatorAdmin, ReadOnlyOperatorAdmin

# Replicas sit on the cluster network and speak plain http to the proxy.
REPLICA_URL_FIELD = {models.URLField: {"assume_scheme": "http"}}


class ReplicaInline(admin.TabularInline):
    model = Replica
    formfield_overrides = REPLICA_URL_FIELD
    fields = ["name", "url", "role", "state", "state_changed_at", "concurrency_limit", "last_probe_ok", "is_standby"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        # Replicas are created by actuators, and their state moves only through replica_transition.
        return False


class EndpointAdminForm(forms.ModelForm):
    # No Meta: the admin's modelform_factory supplies the model and the fields it shows.

    def _post_clean(self) -> None:
        super()._post_clean()  # the instance now holds the form's values
        # The service's fallback rules (no loop, bounded depth, a fallback every caller may reach) as field errors.
        for field, messages in fallback_errors(self.instance).items():
            self.add_error(field if field in self.fields else None, messages)
        # The node selectors and tolerations, held to the Kubernetes launch's own check as on the REST API.
        options = self.instance.launch_options
        if "launch_options" in self.changed_data and isinstance(options, dict):
            if errors := placement_option_errors(options):
                self.add_error("launch_options", errors)
        if "prefill_launch_options" in self.changed_data:
            for field, messages in prefill_placement_errors(self.instance).items():
                self.add_error(field, messages)


@admin.register(Endpoint)
class EndpointAdmin(OperatorAdmin):
    form = EndpointAdminForm
    list_display = [
        "name",
        "owner_tenant",
        "model_profile",
        "hardware_profile",
        "runtime",
        "serving_mode",
        "min_replicas",
        "desired_replicas",
        "prefill_desired_replicas",
        "max_replicas",
        "concurrency_limit",
        "routing_policy",
        "ttft_slo_ms",
        "tpot_slo_ms",
        "fallback",
        "degrade_max_tokens",
        "degrade_slot_share",
    ]
    list_filter = ["runtime", "serving_mode", "routing_policy", "hardware_profile", "model_profile", "owner_tenant"]
    search_fields = ["name", "owner_tenant__name", "model_profile__name", "hardware_profile__name"]
    list_select_related = ["owner_tenant", "model_profile", "hardware_profile", "fallback"]
    raw_id_fields = ["fallback"]
    inlines = [ReplicaInline]

    def get_readonly_fields(self, request, obj=None):
        # Model, profiles, runtime and launch options form a version: changing them needs a rollout (console or
        # API), not a save here that would leave the running replicas on a version nobody recorded.
        if obj is None:
            return ["current_version"]
        return [*VERSIONED_FIELDS, "current_version"]


class ReplicaTransitionInline(admin.TabularInline):
    model = ReplicaTransition
    fields = ["at", "from_state", "to_state", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Replica)
class ReplicaAdmin(OperatorAdmin):
    list_display = [
        "name",
        "endpoint",
        "role",
        "state",
        "state_changed_at",
        "url",
        "actuator",
        "concurrency_limit",
        "last_probe_ok",
        "consecutive_probe_failures",
        "is_standby",
    ]
    list_filter = ["state", "role", "actuator", "is_standby", "endpoint"]
    search_fields = ["name", "url", "endpoint__name", "actuator_ref"]
    list_select_related = ["endpoint"]
    formfield_overrides = REPLICA_URL_FIELD
    # State is read-only here: edits would bypass the lifecycle state machine and its transition log.
    readonly_fields = [
        "state",
        "state_changed_at",
        "last_probe_at",
        "last_probe_ok",
        "consecutive_probe_failures",
        "failure_reason",
        "created_at",
    ]
    inlines = [ReplicaTransitionInline]


@admin.register(ReplicaTransition)
class ReplicaTransitionAdmin(ReadOnlyOperatorAdmin):
    list_display = ["at", "replica", "from_state", "to_state", "reason"]
    list_filter = ["to_state", "from_state"]
    search_fields = ["replica__name", "replica__endpoint__name", "reason"]
    list_select_related = ["replica__endpoint"]
    date_hierarchy = "at"
