"""Admin for usage records (read-only), SLOs and alerts."""

from django.contrib import admin
from django.utils import timezone

from billing.models import SLO, Alert, UsageRecord
from tenants.admin.base import OperatorAdmin, ReadOnlyOperatorAdmin


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyOperatorAdmin):
    list_display = [
        "request_id",
        "finished_at",
        "tenant",
        "endpoint",
        "status",
        "priority",
        "input_tokens",
        "cached_tokens",
        "output_tokens",
        "mu",
        "ttft_ms",
        "tpot_ms",
        "e2e_ms",
        "slo_met",
    ]
    list_filter = ["status", "slo_met", "priority", "endpoint", "tenant"]
    search_fields = ["request_id", "tenant__name", "endpoint__name"]
    list_select_related = ["tenant", "endpoint"]
    date_hierarchy = "finished_at"
    # The change list of a big table must not run COUNT(*) over all of it on each page.
    show_full_result_count = False


@admin.register(SLO)
class SLOAdmin(OperatorAdmin):
    list_display = ["name", "endpoint", "tenant", "sli", "objective", "period_days", "ttft_ms", "tpot_ms", "enabled"]
    list_filter = ["sli", "enabled", "endpoint", "tenant"]
    search_fields = ["name", "endpoint__name", "tenant__name"]
    list_select_related = ["endpoint", "tenant"]


@admin.register(Alert)
class AlertAdmin(OperatorAdmin):
    list_display = [
        "slo",
        "severity",
        "state",
        "long_window",
        "short_window",
        "burn_rate_threshold",
        "burn_rate_long",
        "burn_rate_short",
        "started_at",
        "fired_at",
        "resolved_at",
        "acknowledged_at",
    ]
    list_filter = ["severity", "state"]
    search_fields = ["slo__name", "slo__endpoint__name"]
    list_select_related = ["slo__endpoint", "slo__tenant"]
    date_hierarchy = "started_at"
    actions = ["acknowledge"]

    @admin.action(description="Acknowledge selected alerts")
    def acknowledge(self, request, queryset):
        count = queryset.filter(acknowledged_at__isnull=True).update(
            acknowledged_at=timezone.now(), acknowledged_by=request.user
        )
        self.message_user(request, f"Acknowledged {count} alert(s).")
