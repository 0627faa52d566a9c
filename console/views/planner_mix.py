"""Mix planner page: a form over the heterogeneous planner (capacity.planning.mix via plan_mix_from_profiles), the
replicas per type beside the best single type, and why (docs/algorithms.md#the-heterogeneous-planner)."""

from django import forms
from django.core.exceptions import ValidationError
from django.shortcuts import render

from capacity.hardware.profiles import PROFILES, ROOFLINES
from capacity.models import HardwareProfile
from capacity.planning.inputs import plan_mix_from_profiles
from capacity.planning.mix import PlanError
from console.access import operator_required

SIM_PROFILES = sorted(p for p in PROFILES if p in ROOFLINES)
CHAT_BUCKETS = "chat-128 128 64 40\nchat-512 512 128 40\nchat-1k 1024 256 20\npaste-6k 6144 256 2"


class MixForm(forms.Form):
    profiles = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 40}),
        help_text="one per line: hardware profile name, simulator profile (" + ", ".join(SIM_PROFILES) + ")",
    )
    buckets = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "cols": 40}),
        initial=CHAT_BUCKETS,
        help_text="one per line: name, prompt tokens, output tokens, requests per second",
    )
    ttft_s = forms.FloatField(min_value=0.001, max_value=3600, initial=1.0, label="TTFT SLO (s)")
    tpot_s = forms.FloatField(min_value=0.0001, max_value=60, initial=0.05, label="TPOT SLO (s)")

    def clean_profiles(self):
        pairs = []
        for n, line in enumerate(self.cleaned_data["profiles"].splitlines(), start=1):
            parts = line.replace(",", " ").split()
            if not parts:
                continue
            if len(parts) != 2:
                raise ValidationError(f"line {n}: expected a hardware profile and a simulator profile")
            hardware = HardwareProfile.objects.filter(name=parts[0]).first()
            if hardware is None:
                raise ValidationError(f"line {n}: no hardware profile “{parts[0]}”")
            if parts[1] not in SIM_PROFILES:
                raise ValidationError(f"line {n}: unknown simulator profile “{parts[1]}”")
            pairs.append((hardware, parts[1]))
        if not pairs:
            raise ValidationError("needs at least one profile")
        return pairs

    def clean_buckets(self):
        rows = []
        for n, line in enumerate(self.cleaned_data["buckets"].splitlines(), start=1):
            parts = line.replace(",", " ").split()
            if not parts:
                continue
            try:
                name, prompt, output, rate = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
                if len(parts) != 4 or prompt < 0 or output < 1 or not 0 <= rate < 1e6:
                    raise ValueError
            except (ValueError, IndexError):
                raise ValidationError(f"line {n}: expected name, prompt ≥ 0, output ≥ 1, rate ≥ 0") from None
            rows.append({"name": name, "prompt_tokens": prompt, "output_tokens": output, "rate_rps": rate})
        if not rows or len({r["name"] for r in rows}) != len(rows):
            raise ValidationError("needs at least one bucket, each with its own name")
        return rows


@operator_required
def planner_mix_view(request):
    initial = {"profiles": "\n".join(f"{h.name} " for h in HardwareProfile.objects.all())}
    context = {"form": MixForm(initial=initial), "result": None}
    if request.method != "POST":
        return render(request, "console/planner_mix.html", context)
    form = context["form"] = MixForm(request.POST)
    if not form.is_valid():
        return render(request, "console/planner_mix.html", context, status=400)
    data = form.cleaned_data
    try:
        context["result"] = plan_mix_from_profiles(
            profiles=data["profiles"], buckets=data["buckets"], ttft_s=data["ttft_s"], tpot_s=data["tpot_s"]
        )
    except PlanError as exc:
        form.add_error("buckets" if exc.field == "buckets" else "profiles", f"{exc.field}: {exc.message}")
        return render(request, "console/planner_mix.html", context, status=400)
    return render(request, "console/planner_mix.html", context)
