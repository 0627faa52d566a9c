"""Admin for LoRA adapters: the same checks as the API (``endpoints.adapters.adapter_validate``), audited."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from endpoints.adapters import adapter_validate
from endpoints.models import Adapter
from tenants.admin.base import OperatorAdmin
from tenants.services import audit_log


class AdapterAdminForm(forms.ModelForm):
    def _post_clean(self) -> None:
        super()._post_clean()
        try:
            # The artifact is read on registration, and again for a new owner (it lies in the owner's root).
            recheck = self.instance._state.adding or "owner_tenant" in self.changed_data
            adapter_validate(self.instance, check_artifact=recheck)
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                self.add_error(field if field in self.fields else None, messages)


@admin.register(Adapter)
class AdapterAdmin(OperatorAdmin):
    form = AdapterAdminForm
    list_display = ["name", "owner_tenant", "endpoint", "rank", "artifact_path", "base_model", "created_at"]
    list_filter = ["endpoint", "owner_tenant"]
    search_fields = ["name", "artifact_path", "endpoint__name", "owner_tenant__name"]
    list_select_related = ["owner_tenant", "endpoint"]
    readonly_fields = ["base_model", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.readonly_fields
        return [*self.readonly_fields, "endpoint", "rank", "artifact_path"]

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        action = "adapter.update" if change else "adapter.create"
        audit_log(actor=request.user, action=action, obj=obj, tenant=obj.owner_tenant, detail={"name": obj.name})

    def delete_model(self, request, obj) -> None:
        audit_log(
            actor=request.user, action="adapter.delete", obj=obj, tenant=obj.owner_tenant, detail={"name": obj.name}
        )
        super().delete_model(request, obj)
