"""P/D planner page: does prefill/decode disaggregation pay for a workload? A form over
capacity.planning.disaggregation (docs/disaggregation.md#planning), both designs side by side, and the verdict."""

from django import forms
from django.shortcuts import render

from capacity.hardware.profiles import PROFILES
from capacity.models import HardwareProfile, ModelProfile
from capacity.planning.barriers import Hardware, ModelShape, PlannerInputError
from capacity.planning.disaggregation import PDSLO, PDWorkload, StepModel, plan_disaggregation
from console.access import operator_required


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


@operator_required
def planner_pd_view(request):
    context = {"form": PDPlannerForm(), "result": None}
    if request.method != "POST":
        return render(request, "console/planner_pd.html", context)
    form = context["form"] = PDPlannerForm(request.POST)
    if not form.is_valid():
        return render(request, "console/planner_pd.html", context, status=400)
    data = form.cleaned_data
    model, hardware, link = _inputs(data)
    if not link:
        form.add_error("hardware_profile", "this hardware profile has no KV link bandwidth (kv_link_gbps)")
        return render(request, "console/planner_pd.html", context, status=400)
    try:
        context["result"] = plan_disaggregation(
            model=model,
            hardware=hardware,
            step=StepModel.from_profile(PROFILES[data["engine_profile"]]),
            workload=PDWorkload(
                data["arrival_rate_per_s"], data["input_tokens"], data["output_tokens"], data["input_tokens_sd"]
            ),
            slo=PDSLO(ttft_s=data["ttft_s"], tpot_s=data["tpot_ms"] / 1000, percentile=data["percentile"]),
            link_gbps=link,
        )
    except PlannerInputError as exc:
        form.add_error(None, "; ".join(f"{k}: {v}" for k, v in exc.errors.items()))
        return render(request, "console/planner_pd.html", context, status=400)
    context["percentile"] = data["percentile"]
    return render(request, "console/planner_pd.html", context)
