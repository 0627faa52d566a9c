"""Admin for SLO statuses, webhooks and their notifications, cost reports and usage rollups (mostly read-only)."""

from django.contrib import admin

from billing.models import (
    AlertNotification,
    CostReport,
    RollupCursor,
    SLOStatus,
    UsageDay,
    UsageHour,
    UsageMinute,
    Webhook,
)
from tenants.admin.base import OperatorAdmin, ReadOnlyOperatorAdmin


@admin.register(SLOStatus)
class SLOStatusAdmin(ReadOnlyOperatorAdmin):
    list_display = ["slo", "evaluated_at", "budget_remaining", "exhausts_at", "period_good", "period_valid"]
    list_select_related = ["slo"]
    search_fields = ["slo__name"]


@admin.register(Webhook)
class WebhookAdmin(OperatorAdmin):
    list_display = ["name", "url", "tenant", "severities", "enabled", "created_at"]
    list_filter = ["enabled", "tenant"]
    search_fields = ["name", "url"]


@admin.register(AlertNotification)
class AlertNotificationAdmin(ReadOnlyOperatorAdmin):
    list_display = ["alert", "webhook", "event", "status", "attempts", "next_attempt_at", "sent_at", "last_error"]
    list_filter = ["status", "event"]
    list_select_related = ["alert__slo", "webhook"]


@admin.register(CostReport)
class CostReportAdmin(ReadOnlyOperatorAdmin):
    list_display = [
        "granularity", "start", "endpoint", "tenant", "gpu_hours", "usd", "utilization", "idle_usd",
        "good_output_tokens", "usd_per_1m_good_tokens",
    ]  # fmt: skip
    list_filter = ["granularity", "endpoint", "tenant"]
    list_select_related = ["endpoint", "tenant"]
    date_hierarchy = "start"
    show_full_result_count = False


@admin.register(RollupCursor)
class RollupCursorAdmin(ReadOnlyOperatorAdmin):
    list_display = ["name", "last_id", "previous_id", "updated_at"]


class RollupAdmin(ReadOnlyOperatorAdmin):
    list_display = [
        "start",
        "endpoint",
        "tenant",
        "requests",
        "ok",
        "good",
        "shed",
        "rate_limited",
        "mu",
        "output_tokens",
    ]
    list_filter = ["endpoint", "tenant"]
    list_select_related = ["endpoint", "tenant"]
    date_hierarchy = "start"
    show_full_result_count = False


admin.site.register(UsageMinute, RollupAdmin)
admin.site.register(UsageHour, RollupAdmin)
admin.site.register(UsageDay, RollupAdmin)
