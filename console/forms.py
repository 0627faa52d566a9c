"""Console forms. Validation lives here (field errors shown next to the field); writes go to console.actions."""

from __future__ import annotations

import datetime as dt

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone

from capacity.autoscaling.pins import DEFAULT_PIN_MINUTES, MAX_PIN_MINUTES
from capacity.models import HardwareProfile, ModelProfile
from endpoints.models import Endpoint, ReplicaRole, Runtime
from tenants.models import ApiKeyScope, CapacityReservation, PriorityClass, Tenant

PD_DEFAULTED = (
    "serving_mode",
    "kv_connector",
    "pd_min_uncached_tokens",
    "prefill_min_replicas",
    "prefill_max_replicas",
)


class EndpointCreateForm(forms.ModelForm):
    class Meta:
        model = Endpoint
        fields = [
            "name",
            "owner_tenant",
            "model_profile",
            "hardware_profile",
            "spot_hardware_profile",
            "fallback_hardware_profile",
            "runtime",
            "min_replicas",
            "max_replicas",
            "desired_replicas",
            "concurrency_limit",
            "routing_policy",
            "ttft_slo_ms",
            "tpot_slo_ms",
            "serving_mode",
            "kv_connector",
            "pd_min_uncached_tokens",
            "prefill_hardware_profile",
            "prefill_min_replicas",
            "prefill_max_replicas",
        ]
        help_texts = {
            "name": "The OpenAI “model” name tenants call.",
            "owner_tenant": "Empty = shared endpoint.",
            "serving_mode": "Disaggregated: a prefill pool and a decode pool (the replica fields above), KV handed over.",
        }
        labels = {
            "ttft_slo_ms": "TTFT SLO (ms)",
            "tpot_slo_ms": "TPOT SLO (ms)",
            "kv_connector": "KV connector",
            "pd_min_uncached_tokens": "Prefill pool from (uncached prompt tokens)",
            "prefill_hardware_profile": "Prefill hardware",
            "prefill_min_replicas": "Prefill min replicas",
            "prefill_max_replicas": "Prefill max replicas",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model_profile"].queryset = ModelProfile.objects.order_by("name")
        self.fields["hardware_profile"].queryset = HardwareProfile.objects.order_by("name")
        self.fields["spot_hardware_profile"].queryset = HardwareProfile.objects.filter(
            capacity_type=HardwareProfile.CapacityType.SPOT
        ).order_by("name")
        self.fields["spot_hardware_profile"].label = "Spot pool"
        self.fields["fallback_hardware_profile"].queryset = HardwareProfile.objects.order_by("name")
        self.fields["fallback_hardware_profile"].label = "Fallback hardware"
        self.fields["prefill_hardware_profile"].queryset = HardwareProfile.objects.order_by("name")
        for name in PD_DEFAULTED:  # an aggregated endpoint's form need not mention them
            self.fields[name].required = False
        self.fields["owner_tenant"].queryset = Tenant.objects.filter(is_active=True)
        self.fields["runtime"].initial = Runtime.SIM

    def clean(self):
        cleaned = super().clean()
        low, high, desired = (cleaned.get(k) for k in ("min_replicas", "max_replicas", "desired_replicas"))
        if None not in (low, high, desired) and not low <= desired <= high:
            self.add_error("desired_replicas", f"must lie within [min_replicas, max_replicas] = [{low}, {high}]")
        for name in PD_DEFAULTED:
            if cleaned.get(name) in (None, ""):
                cleaned[name] = Endpoint._meta.get_field(name).default
        low, high = cleaned.get("prefill_min_replicas"), cleaned.get("prefill_max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("prefill_min_replicas", "must not exceed the prefill max replicas")
        return cleaned


class ScaleForm(forms.Form):
    min_replicas = forms.IntegerField(min_value=0, max_value=1000)
    max_replicas = forms.IntegerField(min_value=1, max_value=1000)
    desired_replicas = forms.IntegerField(min_value=0, max_value=1000)
    pin_minutes = forms.IntegerField(
        min_value=1,
        max_value=MAX_PIN_MINUTES,
        initial=DEFAULT_PIN_MINUTES,
        required=False,
        help_text=f"how long the autoscaler holds this count before it decides on demand again (empty: "
        f"{DEFAULT_PIN_MINUTES})",
    )

    def clean_pin_minutes(self) -> int:
        return self.cleaned_data.get("pin_minutes") or DEFAULT_PIN_MINUTES

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


class ReplicaAttachForm(forms.Form):
    """A vLLM server that runs elsewhere, attached as a replica once it has shown to be one (the checks are the
    service's: endpoints.services.replica_attach)."""

    url = forms.CharField(label="URL", max_length=255, help_text="the server's base URL, such as http://10.0.0.7:8000")
    name = forms.CharField(max_length=120, required=False, help_text="empty: attached-<host>-<port>")
    concurrency_limit = forms.IntegerField(
        min_value=1, max_value=100_000, required=False, help_text="empty: the endpoint's concurrency limit"
    )
    role = forms.ChoiceField(
        choices=[("", "the endpoint's serving pool"), *ReplicaRole.choices],
        required=False,
        help_text="a disaggregated endpoint: prefill or decode (a server started with that KV connector role)",
    )


class ReservationSellForm(forms.ModelForm):
    class Meta:
        model = CapacityReservation
        fields = ["tenant", "endpoint", "adapter", "mu_per_min", "priority", "burst_minutes", "rpm_limit", "tpm_limit"]
        labels = {"mu_per_min": "MU per minute", "adapter": "LoRA adapter"}
        help_texts = {
            "adapter": "empty: the tenant's base-model traffic; else only this adapter's requests draw from it (the "
            "tenant's own adapter or a shared one, on this endpoint)"
        }

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
        tenant, endpoint, adapter = cleaned.get("tenant"), cleaned.get("endpoint"), cleaned.get("adapter")
        # One base-model reservation per tenant and endpoint, one per adapter (the model's clean() checks that the
        # adapter is on the endpoint and the tenant's to use).
        held = CapacityReservation.objects.filter(tenant=tenant, endpoint=endpoint, adapter=adapter)
        if tenant and endpoint and held.exists():
            on = f"adapter {adapter.name} on {endpoint}" if adapter else f"{endpoint}"
            self.add_error(
                "adapter" if adapter else "endpoint",
                f"{tenant} already holds a reservation for {on}; change that one instead",
            )
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


class StatementPeriodForm(forms.Form):
    """A statement's period: a calendar month (UTC), or a start and end date; empty: this month to date."""

    month = forms.RegexField(regex=r"^\d{4}-(0[1-9]|1[0-2])$", required=False, help_text="YYYY-MM")
    start = forms.DateField(required=False, help_text="YYYY-MM-DD (UTC, from midnight)")
    end = forms.DateField(required=False, help_text="YYYY-MM-DD (UTC, up to midnight after it)")

    MAX_DAYS = 366

    def clean(self):
        cleaned = super().clean()
        start, end = cleaned.get("start"), cleaned.get("end")
        if (start is None) != (end is None):
            raise ValidationError("give both a start and an end date, or a month")
        if start is not None and end is not None:
            if end < start:
                self.add_error("end", "must not be before the start")
            elif (end - start).days >= self.MAX_DAYS:
                self.add_error("end", f"a statement covers at most {self.MAX_DAYS} days")
        return cleaned

    def period(self, now):
        """(start, end, label) as aware UTC datetimes; the end never later than now."""
        cleaned = self.cleaned_data
        if cleaned.get("start"):
            start = dt.datetime.combine(cleaned["start"], dt.time(), tzinfo=dt.UTC)
            end = dt.datetime.combine(cleaned["end"] + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
            label = f"{cleaned['start']:%Y-%m-%d} – {cleaned['end']:%Y-%m-%d}"
        else:
            if cleaned.get("month"):
                year, month = (int(part) for part in cleaned["month"].split("-"))
            else:
                year, month = now.year, now.month
            start = dt.datetime(year, month, 1, tzinfo=dt.UTC)
            end = dt.datetime(year + month // 12, month % 12 + 1, 1, tzinfo=dt.UTC)
            label = f"{start:%B %Y}"
        return start, min(end, now), label


class RolloutStartForm(forms.Form):
    """Roll an endpoint out to one of its versions, or to a new one made here from a changed model / launch options."""

    to_version = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="— a new version from the fields below —"
    )
    model_profile = forms.ModelChoiceField(
        queryset=ModelProfile.objects.order_by("name"), required=False, help_text="new version: another model"
    )
    launch_options = forms.JSONField(
        required=False, help_text='new version: launch options as JSON, e.g. {"speed": 2, "cpus": 12}'
    )
    strategy = forms.ChoiceField(choices=[("all_at_once", "All at once"), ("canary", "Canary (traffic in steps)")])
    canary_steps = forms.CharField(
        required=False, initial="10, 50, 100", help_text="canary: percents of requests, rising, ending at 100"
    )
    max_surge = forms.IntegerField(
        min_value=1, max_value=64, initial=2, help_text="extra replicas alive at once (batch size)"
    )
    step_duration_s = forms.IntegerField(
        min_value=1, max_value=86400, initial=60, label="Step duration (s)", help_text="how long each step is watched"
    )

    def __init__(self, *args, endpoint: Endpoint, **kwargs):
        super().__init__(*args, **kwargs)
        self.endpoint = endpoint
        self.fields["to_version"].queryset = endpoint.versions.exclude(pk=endpoint.current_version_id)
        self.fields["to_version"].label_from_instance = lambda v: f"v{v.number} · {v.model_profile} · {v.runtime}"

    def clean_canary_steps(self):
        raw = (self.cleaned_data.get("canary_steps") or "").strip()
        if not raw:
            return None
        try:
            return [int(part) for part in raw.replace(";", ",").split(",") if part.strip()]
        except ValueError:
            raise ValidationError("whole percents separated by commas, e.g. 10, 50, 100") from None

    def clean_launch_options(self):
        value = self.cleaned_data.get("launch_options")
        if value is not None and not isinstance(value, dict):
            raise ValidationError("must be a JSON object")
        return value

    def clean(self):
        cleaned = super().clean()
        changes = {k: cleaned.get(k) for k in ("model_profile", "launch_options") if cleaned.get(k) is not None}
        if cleaned.get("to_version") is None and not changes and not self.errors:
            self.add_error("to_version", "choose a version, or change the model or launch options for a new one")
        if cleaned.get("to_version") is not None and changes:
            self.add_error("to_version", "either an existing version or changes for a new one, not both")
        return cleaned


class RolloutActionForm(forms.Form):
    reason = forms.CharField(max_length=200, required=False)
