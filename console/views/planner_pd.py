"""P/D planner page: does prefill/decode disaggregation pay for a workload? A form over
capacity.planning.disaggregation (docs/disaggregation.md#planning), both designs side by side, the verdict, and the
prompt-length threshold: the one planned with (an endpoint's own) and the one the planner recommends. Opened from an
endpoint (``?endpoint=<id>``), the form starts from its profiles, SLOs, last hour's prompts and threshold, and the
recommendation is kept for the endpoint's page."""

from django import forms
from django.http import Http404
from django.shortcuts import render
from django.utils import timezone

from capacity.hardware.profiles import PROFILES
from capacity.models import HardwareProfile, ModelProfile
from capacity.planning.barriers import Hardware, ModelShape, PlannerInputError
from capacity.planning.disaggregation import PDSLO, PDWorkload, StepModel, plan_disaggregation
from console.access import operator_required
from console.pd_threshold import prompt_mix, ranges_text, remember_recommendation
from endpoints.models import Endpoint
from endpoints.selectors import endpoints_visible_to


class PDPlannerForm(forms.Form):
    """Defaults: long-context RAG on Llama 3.1 8B over H100s with 400 Gb/s links (bench pd's long_rag)."""

    model_profile = forms.ModelChoiceField(queryset=ModelProfile.objects.all(), required=False, label="Model profile")
    n_layers = forms.IntegerField(min_value=1, initial=32, label="Layers")
    n_kv_heads = forms.IntegerField(min_value=1, initial=8, label="KV heads")
    d_head = forms.IntegerField(min_value=1, initial=128, label="Head dimension")
    weights_gb = forms.FloatField(min_value=0, initial=16.06, label="Weights (GB)")
    hardware_profile = forms.ModelChoiceField(
        queryset=HardwareProfile.objects.all(), required=False, label="Hardware profile",
        help_text="its memory, price and KV link replace the four fields below",
    )  # fmt: skip
    gpu_memory_gb = forms.FloatField(min_value=1, initial=80, label="GPU memory (GB)")
    overhead_gb = forms.FloatField(min_value=0, initial=10, label="Overhead (GB)")
    usd_per_gpu_hour = forms.FloatField(min_value=0, initial=0, label="USD per GPU-hour")
    kv_link_gbps = forms.FloatField(min_value=0.001, initial=400, label="KV link (Gb/s)")
    engine_profile = forms.ChoiceField(
        choices=[(p, p) for p in sorted(PROFILES)], initial="llama-8b-h100", label="Step times (engine profile)"
    )
    arrival_rate_per_s = forms.FloatField(min_value=0.0001, max_value=1e6, initial=8, label="Arrival rate λ (req/s)")
    input_tokens = forms.FloatField(min_value=1, max_value=1e7, initial=10240, label="Prompt tokens (mean)")
    input_tokens_sd = forms.FloatField(min_value=0, initial=3547, label="Prompt tokens (std. dev.)")
    output_tokens = forms.FloatField(min_value=1, max_value=1e7, initial=320, label="Output tokens (mean)")
    ttft_s = forms.FloatField(min_value=0.001, max_value=3600, initial=3.0, label="TTFT SLO (s)")
    tpot_ms = forms.FloatField(min_value=0.1, max_value=60_000, initial=15, label="TPOT SLO (ms)")
    percentile = forms.TypedChoiceField(choices=[(90, "p90"), (95, "p95"), (99, "p99")], coerce=int, initial=90)
    prompt_ranges = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 4}), label="Prompt lengths (uncached tokens)",
        help_text="one range a line: prompts, lowest, highest (from an endpoint: its last hour, split at the thresholds "
        "tried, so each one's share straight to decode is the measured one); empty: one range of the mean and spread",
    )  # fmt: skip
    min_uncached_tokens = forms.IntegerField(
        min_value=0, max_value=10_000_000, required=False, label="Prefill pool from (uncached prompt tokens)",
        help_text="prompts with fewer go straight to decode; empty: the endpoint's own, else 0 (every prompt)",
    )  # fmt: skip
    endpoint = forms.ModelChoiceField(
        queryset=Endpoint.objects.none(), required=False, label="Endpoint",
        help_text="planned for this endpoint: its threshold is the default, and the recommendation shows on its page",
    )  # fmt: skip

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["endpoint"].queryset = endpoints_visible_to(user)

    def clean_prompt_ranges(self) -> tuple[tuple[float, float, float], ...] | None:
        ranges = []
        for number, line in enumerate(self.cleaned_data["prompt_ranges"].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                weight, low, high = (float(x) for x in line.split())
            except ValueError:
                raise forms.ValidationError(f"line {number}: three numbers, prompts lowest highest") from None
            if not (weight > 0 and 0 <= low <= high < 1e7):
                raise forms.ValidationError(f"line {number}: prompts > 0 and 0 ≤ lowest ≤ highest < 10,000,000")
            ranges.append((weight, low, high))
        return tuple(ranges) or None


def endpoint_initial(endpoint: Endpoint, *, now) -> dict:
    """The form's start for a live endpoint: its profiles, SLOs and threshold, and its last hour's prompts (their rate,
    uncached tokens' mean and spread, output), left at the defaults when it served none."""
    initial = {
        "endpoint": endpoint.pk,
        "model_profile": endpoint.model_profile_id,
        "hardware_profile": endpoint.hardware_profile_id,
        "ttft_s": endpoint.ttft_slo_ms / 1000,
        "tpot_ms": endpoint.tpot_slo_ms,
        "min_uncached_tokens": endpoint.pd_min_uncached_tokens,
    }
    mix = prompt_mix(endpoint=endpoint, now=now)
    if mix.prompts:
        initial.update(
            arrival_rate_per_s=round(max(mix.arrival_rate_per_s, 0.0001), 4),
            input_tokens=round(max(1.0, mix.uncached_mean or 1.0), 1),
            input_tokens_sd=round(mix.uncached_sd or 0.0, 1),
            output_tokens=round(max(1.0, mix.output_mean or 1.0), 1),
            prompt_ranges=ranges_text(mix.ranges),
        )
    return initial


def _inputs(data) -> tuple[ModelShape, Hardware, float | None]:
    m = data.get("model_profile")
    model = (
        ModelShape(m.n_layers, m.n_kv_heads, m.d_head, m.dtype_bytes, m.weights_gb)
        if m
        else ModelShape(data["n_layers"], data["n_kv_heads"], data["d_head"], 2, data["weights_gb"])
    )
    h = data.get("hardware_profile")
    if h:
        hardware = Hardware(h.gpu_memory_gb, h.memory_overhead_gb, h.gpus_per_replica, h.usd_per_gpu_hour or 0.0)
        return model, hardware, h.kv_link_gbps
    return (
        model,
        Hardware(data["gpu_memory_gb"], data["overhead_gb"], 1, data["usd_per_gpu_hour"]),
        data["kv_link_gbps"],
    )


def _start(request) -> dict:
    """The form's initial values: its defaults, or the endpoint's named by ``?endpoint=`` (404 where it is not one
    this user sees)."""
    raw = request.GET.get("endpoint")
    if not raw:
        return {}
    endpoint = (
        endpoints_visible_to(request.user).filter(pk=int(raw)).first() if raw.isascii() and raw.isdigit() else None
    )
    if endpoint is None:
        raise Http404("No such endpoint")
    return endpoint_initial(endpoint, now=timezone.now())


@operator_required
def planner_pd_view(request):
    context = {"form": PDPlannerForm(initial=_start(request), user=request.user), "result": None}
    if request.method != "POST":
        return render(request, "console/planner_pd.html", context)
    form = context["form"] = PDPlannerForm(request.POST, user=request.user)
    if not form.is_valid():
        return render(request, "console/planner_pd.html", context, status=400)
    data = form.cleaned_data
    model, hardware, link = _inputs(data)
    if not link:
        form.add_error("hardware_profile", "this hardware profile has no KV link bandwidth (kv_link_gbps)")
        return render(request, "console/planner_pd.html", context, status=400)
    endpoint = data.get("endpoint")
    threshold = data.get("min_uncached_tokens")
    if threshold is None:
        threshold = endpoint.pd_min_uncached_tokens if endpoint else 0
    try:
        result = plan_disaggregation(
            model=model,
            hardware=hardware,
            step=StepModel.from_profile(PROFILES[data["engine_profile"]]),
            workload=PDWorkload(
                data["arrival_rate_per_s"],
                data["input_tokens"],
                data["output_tokens"],
                data["input_tokens_sd"],
                prompt_ranges=data["prompt_ranges"],
            ),
            slo=PDSLO(ttft_s=data["ttft_s"], tpot_s=data["tpot_ms"] / 1000, percentile=data["percentile"]),
            link_gbps=link,
            min_uncached_tokens=threshold,
        )
    except PlannerInputError as exc:
        form.add_error(None, "; ".join(f"{k}: {v}" for k, v in exc.errors.items()))
        return render(request, "console/planner_pd.html", context, status=400)
    context.update(result=result, percentile=data["percentile"], endpoint=endpoint)
    if endpoint is not None and _as_served(data, endpoint):  # a plan for other profiles is not the endpoint's
        remember_recommendation(
            endpoint_id=endpoint.pk, plan=result, engine_profile=data["engine_profile"], at=timezone.now()
        )
    return render(request, "console/planner_pd.html", context)


def _as_served(data, endpoint) -> bool:
    """Whether the form planned with the endpoint's own model and hardware profiles."""
    model, hardware = data.get("model_profile"), data.get("hardware_profile")
    return getattr(model, "pk", None) == endpoint.model_profile_id and getattr(hardware, "pk", None) == (
        endpoint.hardware_profile_id
    )
