"""Console forms. Validation lives here (field errors shown next to the field); writes go to console.actions."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint, Runtime
from tenants.models import ApiKeyScope, CapacityReservation, PriorityClass, Tenant


class EndpointCreateForm(forms.ModelForm):
    class Meta:
        model = Endpoint
        fields = [
            "name",
            "owner_tenant",
            "model_profile",
            "hardware_profile",
            "runtime",
            "min_replicas",
            "max_replicas",
            "desired_replicas",
            "concurrency_limit",
            "routing_policy",
            "ttft_slo_ms",
            "tpot_slo_ms",
        ]
        help_texts = {"name": "The OpenAI “model” name tenants call.", "owner_tenant": "Empty = shared endpoint."}
        labels = {"ttft_slo_ms": "TTFT SLO (ms)", "tpot_slo_ms": "TPOT SLO (ms)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model_profile"].queryset = ModelProfile.objects.order_by("name")
        self.fields["hardware_profile"].queryset = HardwareProfile.objects.order_by("name")
        self.fields["owner_tenant"].queryset = Tenant.objects.filter(is_active=True)
        self.fields["runtime"].initial = Runtime.SIM

    def clean(self):
        cleaned = super().clean()
        low, high, desired = (cleaned.get(k) for k in ("min_replicas", "max_replicas", "desired_replicas"))
        if None not in (low, high, desired) and not low <= desired <= high:
            self.add_error("desired_replicas", f"must lie within [min_replicas, max_replicas] = [{low}, {high}]")
        return cleaned


class ScaleForm(forms.Form):
    min_replicas = forms.IntegerField(min_value=0, max_value=1000)
    max_replicas = forms.IntegerField(min_value=1, max_value=1000)
    desired_replicas = forms.IntegerField(min_value=0, max_value=1000)

    def clean(self):
        cleaned = super().clean()
        low, high, desired = (cleaned.get(k) for k in ("min_replicas", "max_replicas", "desired_replicas"))
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", "must not exceed max_replicas")
        elif None not in (low, high, desired) and not low <= desired <= high:
            self.add_error("desired_replicas", f"must lie within [{low}, {high}]")
        return cleaned


class DrainForm(forms.Form):
    reason = forms.CharField(max_length=200, required=False, initial="drained from the console")


class ReservationSellForm(forms.ModelForm):
    class Meta:
        model = CapacityReservation
        fields = ["tenant", "endpoint", "mu_per_min", "priority", "burst_minutes", "rpm_limit", "tpm_limit"]
        labels = {"mu_per_min": "MU per minute"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["mu_per_min"].min_value = 0.001
        self.fields["mu_per_min"].widget.attrs["min"] = "0.001"
        self.fields["mu_per_min"].widget.attrs["step"] = "any"

    def clean_mu_per_min(self):
        value = self.cleaned_data["mu_per_min"]
        if value is None or value <= 0:
            raise ValidationError("must be greater than 0")
        return value

    def clean(self):
        cleaned = super().clean()
        tenant, endpoint = cleaned.get("tenant"), cleaned.get("endpoint")
        if tenant and endpoint and CapacityReservation.objects.filter(tenant=tenant, endpoint=endpoint).exists():
            self.add_error("endpoint", f"{tenant} already holds a reservation on {endpoint}; change that one instead")
        return cleaned

    def validate_unique(self):
        # clean() reports the duplicate on the endpoint field with a clearer message.
        pass


class AlertAckForm(forms.Form):
    note = forms.CharField(max_length=200, required=False)


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=120)
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple, initial=[ApiKeyScope.INFERENCE]
    )
    max_priority = forms.ChoiceField(choices=PriorityClass.choices, initial=PriorityClass.STANDARD)
    expires_at = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), help_text="optional, UTC"
    )

    def clean_name(self):
        name = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError("This field is required.")
        return name

    def clean_expires_at(self):
        value = self.cleaned_data.get("expires_at")
        if value is not None and value <= timezone.now():
            raise ValidationError("must be in the future")
        return value


class PeriodForm(forms.Form):
    """A report window: the last N hours, ending now."""

    hours = forms.IntegerField(min_value=1, max_value=24 * 90, initial=24)
