"""Admin for tenants, users, API keys and operator tokens (prefix only, never the hash), reservations and the audit
trail."""

from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Group

from tenants.admin.base import OperatorAdmin, ReadOnlyOperatorAdmin
from tenants.models import ApiKey, AuditEntry, CapacityReservation, OperatorToken, Tenant, User
from tenants.quotas import QUOTA_NAMES, tenant_quota_update
from tenants.services import api_key_create, api_key_revoke, tenant_update

# Access follows User.role, not Django groups; an unused Group page would only mislead.
if admin.site.is_registered(Group):
    admin.site.unregister(Group)


@admin.register(Tenant)
class TenantAdmin(OperatorAdmin):
    list_display = ["name", "slug", "is_active", "accepts_fallback", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    fieldsets = [
        (None, {"fields": ["name", "slug", "is_active", "accepts_fallback", "created_at"]}),
        (
            "Quotas (empty = platform default)",
            {"fields": ["quota_max_endpoints", "quota_max_replicas", "quota_max_gpus", "quota_max_warm_pool"]},
        ),
    ]

    def save_model(self, request, obj, form, change):
        # A quota change approves (or withdraws) tenant capacity: it goes through the audited service.
        quota = {
            name: form.cleaned_data[f"quota_{name}"] for name in QUOTA_NAMES if f"quota_{name}" in form.changed_data
        }
        if change and quota:
            for name in quota:
                setattr(obj, f"quota_{name}", form.initial.get(f"quota_{name}"))
        # Suspending (or reactivating) is audited and drains the tenant's replicas: through the service too.
        is_active = obj.is_active
        suspension = change and "is_active" in form.changed_data
        if suspension:
            obj.is_active = form.initial.get("is_active", True)
        super().save_model(request, obj, form, change)
        if quota:
            tenant_quota_update(tenant=obj, actor=request.user, **quota)
        if suspension:
            tenant_update(tenant=obj, actor=request.user, is_active=is_active)


@admin.register(User)
class UserAdmin(OperatorAdmin, DjangoUserAdmin):
    list_display = ["username", "email", "role", "tenant", "is_staff", "is_active", "last_login"]
    list_filter = ["role", "tenant", "is_staff", "is_active"]
    search_fields = ["username", "email", "first_name", "last_name", "tenant__name"]
    list_select_related = ["tenant"]
    fieldsets = DjangoUserAdmin.fieldsets + (("infercap", {"fields": ("role", "tenant")}),)
    add_fieldsets = DjangoUserAdmin.add_fieldsets + (("infercap", {"fields": ("role", "tenant")}),)


@admin.register(ApiKey)
class ApiKeyAdmin(OperatorAdmin):
    list_display = ["name", "prefix", "tenant", "scopes", "max_priority", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["tenant", "max_priority", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "tenant__name"]
    list_select_related = ["tenant"]
    # The hash is deliberately absent: it is never shown, not even to operators.
    fields = [
        "tenant",
        "name",
        "prefix",
        "scopes",
        "max_priority",
        "expires_at",
        "revoked_at",
        "created_by",
        "created_at",
        "last_used_at",
    ]
    readonly_fields = ["prefix", "revoked_at", "created_by", "created_at", "last_used_at"]
    actions = ["revoke_keys"]

    def get_readonly_fields(self, request, obj=None):
        # An existing key belongs to its tenant for good; moving it would hand a live secret to someone else.
        return self.readonly_fields + (["tenant"] if obj else [])

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw = api_key_create(
            tenant=obj.tenant,
            name=obj.name,
            scopes=obj.scopes,
            max_priority=obj.max_priority,
            expires_at=obj.expires_at,
            actor=request.user,
        )
        obj.pk, obj.prefix, obj.key_hash = key.pk, key.prefix, key.key_hash
        # Shown exactly once: only its hash is stored.
        self.message_user(request, f"New API key (copy it now, it will not be shown again): {raw}", messages.WARNING)

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request, queryset):
        for key in queryset:
            api_key_revoke(api_key=key, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")


@admin.register(CapacityReservation)
class CapacityReservationAdmin(OperatorAdmin):
    list_display = [
        "tenant",
        "endpoint",
        "adapter",
        "mu_per_min",
        "priority",
        "burst_minutes",
        "rpm_limit",
        "tpm_limit",
        "updated_at",
    ]
    # The form's full_clean runs the model's adapter check (on this endpoint, the tenant's own or shared).
    list_filter = ["priority", "endpoint", "tenant", "adapter"]
    search_fields = ["tenant__name", "endpoint__name", "adapter__name"]
    list_select_related = ["tenant", "endpoint", "adapter"]
    autocomplete_fields = ["tenant"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyOperatorAdmin):
    list_display = ["at", "actor_label", "tenant", "action", "object_type", "object_id"]
    list_filter = ["action", "object_type", "tenant"]
    search_fields = ["actor_label", "action", "object_type", "object_id"]
    list_select_related = ["tenant"]
    date_hierarchy = "at"


# Read only: tokens are minted and revoked through the API or create_operator_token, which audit it
# (tenants/operator_tokens.py); here an operator sees who holds which, its scopes, expiry and last use.
@admin.register(OperatorToken)
class OperatorTokenAdmin(ReadOnlyOperatorAdmin):
    list_display = ["prefix", "name", "user", "scopes", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "user__username"]
    list_select_related = ["user"]
    exclude = ["token_hash"]
