"""Admin access for operators only: a tenant user must never reach the cross-tenant admin, even if flagged staff."""

from django.contrib import admin
from django.db import models


def _operator_only(request) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff and getattr(user, "is_operator", False))


# The default site is shared by every app's admin modules; gating it here keeps one rule for all of them.
admin.site.has_permission = _operator_only
admin.site.site_header = "infercap operations"
admin.site.site_title = "infercap admin"


class OperatorAdmin(admin.ModelAdmin):
    """Operators hold full rights on every model without per-model Django permissions to maintain."""

    list_per_page = 50
    # Say the scheme a bare host means now, as Django 6 will change the default (webhooks: https).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def has_module_permission(self, request) -> bool:
        return _operator_only(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return _operator_only(request)

    def has_add_permission(self, request) -> bool:
        return _operator_only(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return _operator_only(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return _operator_only(request)


class ReadOnlyOperatorAdmin(OperatorAdmin):
    """Records written by the platform itself (usage, transitions, decisions): viewing only."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
