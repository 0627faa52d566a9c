"""Admin for endpoint versions, rollouts and their decision log: viewing only (versions are immutable; a rollout
moves through its services, from the console or the API, so every step is recorded and audited)."""

from django.contrib import admin

from endpoints.models import EndpointVersion, Rollout, RolloutEvent
from tenants.admin.base import ReadOnlyOperatorAdmin


@admin.register(EndpointVersion)
class EndpointVersionAdmin(ReadOnlyOperatorAdmin):
    list_display = ["endpoint", "number", "model_profile", "hardware_profile", "runtime", "created_at", "created_by"]
    list_filter = ["runtime", "model_profile", "hardware_profile"]
    search_fields = ["endpoint__name", "model_profile__name", "note"]
    list_select_related = ["endpoint", "model_profile", "hardware_profile", "created_by"]
    date_hierarchy = "created_at"

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # replicas and rollouts refer to it; history must stay whole


class RolloutEventInline(admin.TabularInline):
    model = RolloutEvent
    fields = ["at", "kind", "from_state", "to_state", "message", "data"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Rollout)
class RolloutAdmin(ReadOnlyOperatorAdmin):
    list_display = [
        "id",
        "endpoint",
        "from_version",
        "to_version",
        "strategy",
        "state",
        "traffic_percent",
        "created_at",
        "finished_at",
        "reason",
    ]
    list_filter = ["state", "strategy"]
    search_fields = ["endpoint__name", "reason"]
    list_select_related = ["endpoint", "from_version__endpoint", "to_version__endpoint"]
    date_hierarchy = "created_at"
    inlines = [RolloutEventInline]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(RolloutEvent)
class RolloutEventAdmin(ReadOnlyOperatorAdmin):
    list_display = ["at", "rollout", "kind", "from_state", "to_state", "message"]
    list_filter = ["kind", "to_state"]
    search_fields = ["rollout__endpoint__name", "message"]
    list_select_related = ["rollout__endpoint", "rollout__from_version", "rollout__to_version"]
    date_hierarchy = "at"

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
