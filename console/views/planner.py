"""Capacity planner page: a form over capacity.planning.barriers (the three barriers), its result table, and why."""

import math

from django import forms
from django.core.exceptions import ValidationError
from django.shortcuts import render

from capacity.models import HardwareProfile, ModelProfile
from capacity.planning import barriers, tensor_parallel
from console.access import operator_required
from console.views.planner_apply import apply_bounds, endpoint_initial
from endpoints.models import Endpoint
from placement import mig

WORKED_TABLE = "16 105 1680\n64 68 4352\n128 44 5632"


class PlannerForm(forms.Form):
    """Defaults reproduce docs/algorithms.md#the-worked-example (13B FP16 on an 80 GB GPU, λ = 20 req/s)."""

    n_layers = forms.IntegerField(min_value=1, initial=40, label="Layers")
    n_kv_heads = forms.IntegerField(min_value=1, initial=8, label="KV heads")
    d_head = forms.IntegerField(min_value=1, initial=128, label="Head dimension")
    dtype_bytes = forms.IntegerField(min_value=1, max_value=8, initial=2, label="Bytes per value")
    weights_gb = forms.FloatField(min_value=0, initial=26, label="Weights (GB)")
    gpu_memory_gb = forms.FloatField(min_value=1, initial=80, label="GPU memory (GB)")
    overhead_gb = forms.FloatField(min_value=0, initial=10, label="Overhead (GB)")
    gpus_per_replica = forms.IntegerField(min_value=1, initial=1, label="GPUs per replica")
    usd_per_gpu_hour = forms.FloatField(min_value=0, initial=2.5, label="USD per GPU-hour")
    gpus_per_node = forms.IntegerField(min_value=1, initial=8, required=False, label="GPUs per node")
    interconnect_domain_gpus = forms.IntegerField(
        min_value=1, initial=8, required=False, label="GPUs per NVLink domain"
    )
    mig_profile = forms.RegexField(
        regex=mig.PROFILE.pattern,
        required=False,
        label="MIG slice",
        help_text="e.g. 1g.10gb: a replica is one slice (memory and price then the slice's); empty: whole GPUs",
    )
    choose_tp = forms.BooleanField(
        required=False, label="Choose the TP size", help_text="plan at 1, 2, 4 or 8 GPUs: the fewest GPUs that fit"
    )
    arrival_rate_per_s = forms.FloatField(min_value=0, initial=20, label="Arrival rate λ (req/s)")
    input_tokens = forms.FloatField(min_value=0, initial=500, label="Input tokens (mean)")
    output_tokens = forms.FloatField(min_value=1, initial=300, label="Output tokens (mean)")
    context_tokens = forms.FloatField(min_value=1, initial=800, required=False, label="Context held (tokens)")
    min_stream_tok_s = forms.FloatField(min_value=0.001, initial=60, label="Min per-stream tok/s (SLO)")
    ttft_s = forms.FloatField(min_value=0, initial=0.3, required=False, label="TTFT (s)")
    headroom = forms.FloatField(min_value=0, max_value=10, initial=0.5, label="Headroom r")
    spike_multiplier = forms.FloatField(min_value=1, max_value=100, initial=3, required=False, label="Spike ×load")
    cold_start_s = forms.FloatField(min_value=0, initial=90, required=False, label="Cold start (s)")
    throughput_table = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 4, "cols": 24}),
        initial=WORKED_TABLE,
        help_text="one row per line: batch, per-stream tok/s, optional aggregate tok/s",
    )
    endpoint = forms.IntegerField(required=False, widget=forms.HiddenInput)  # planned for this live endpoint

    def clean_throughput_table(self):
        rows = []
        for n, line in enumerate(self.cleaned_data["throughput_table"].splitlines(), start=1):
            parts = line.replace(",", " ").split()
            if not parts:
                continue
            if len(parts) not in (2, 3):
                raise ValidationError(f"line {n}: expected 2 or 3 numbers, got {len(parts)}")
            try:
                batch, stream = int(parts[0]), float(parts[1])
                aggregate = float(parts[2]) if len(parts) == 3 else None
            except ValueError:
                raise ValidationError(f"line {n}: “{line.strip()}” is not numbers") from None
            if not all(math.isfinite(v) for v in (stream, aggregate or 0.0)):
                raise ValidationError(f"line {n}: numbers must be finite")
            rows.append(barriers.ThroughputRow(batch=batch, per_stream_tok_s=stream, aggregate_tok_s=aggregate))
        if not rows:
            raise ValidationError("needs at least one row")
        return rows


def _field_for(key: str, form: PlannerForm) -> str | None:
    name = key.split("[")[0]
    for prefix in ("model.", "hardware.", "workload.", "slo."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name if name in form.fields else None


def _int(value) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def _profile_initial(request) -> dict:
    initial = {}
    model = ModelProfile.objects.filter(pk=request.GET.get("model_profile") or 0).first()
    if model:
        initial.update(
            n_layers=model.n_layers,
            n_kv_heads=model.n_kv_heads,
            d_head=model.d_head,
            dtype_bytes=model.dtype_bytes,
            weights_gb=model.weights_gb,
        )
    hardware = HardwareProfile.objects.filter(pk=request.GET.get("hardware_profile") or 0).first()
    if hardware:
        initial.update(
            gpu_memory_gb=hardware.gpu_memory_gb,
            gpus_per_replica=hardware.gpus_per_replica,
            usd_per_gpu_hour=hardware.usd_per_gpu_hour,
            gpus_per_node=hardware.gpus_per_node,
            interconnect_domain_gpus=hardware.interconnect_domain_gpus,
            mig_profile=hardware.mig_profile,
        )
    return initial


@operator_required
def planner_view(request):
    context = {
        "models": ModelProfile.objects.all(),
        "hardware": HardwareProfile.objects.all(),
        "endpoints": Endpoint.objects.order_by("name").only("pk", "name")[:200],
        "result": None,
    }
    if request.method != "POST":
        initial = _profile_initial(request)
        endpoint = Endpoint.objects.filter(pk=_int(request.GET.get("endpoint"))).first()
        if endpoint is not None:
            initial.update(endpoint_initial(endpoint), endpoint=endpoint.pk)
            context["endpoint"] = endpoint
        context["form"] = PlannerForm(initial=initial)
        return render(request, "console/planner.html", context)
    form = PlannerForm(request.POST)
    context["form"] = form
    if not form.is_valid():
        return render(request, "console/planner.html", context, status=400)
    try:
        result, context["tp"], context["topology"] = _plan(form.cleaned_data)
    except barriers.PlannerInputError as exc:
        for key, message in exc.errors.items():
            form.add_error(_field_for(key, form), f"{key}: {message}" if _field_for(key, form) is None else message)
        return render(request, "console/planner.html", context, status=400)
    data = form.cleaned_data
    context["result"] = result
    endpoint = Endpoint.objects.filter(pk=data.get("endpoint") or 0).first()
    if endpoint is not None:
        context["endpoint"] = endpoint
        # Replicas of another TP size are not the endpoint's replicas: their bounds are not offered.
        if context["tp"] is None or context["tp"].chosen == data["gpus_per_replica"]:
            context["apply"] = apply_bounds(result)
    context["barriers"] = [("memory", result.n_mem), ("throughput", result.n_thr), ("latency", result.n_lat)]
    if result.n_ttft is not None:
        context["barriers"].append(("ttft", result.n_ttft))
    return render(request, "console/planner.html", context)


def _plan(data: dict):
    """(result, the TP choice or None, the topology answer): the three barriers at the form's GPUs per replica, or,
    with "choose the TP size", at the size needing the fewest GPUs (capacity.planning.tensor_parallel)."""
    spike = None
    if data.get("spike_multiplier"):
        spike = barriers.SpikeInput(
            load_multiplier=data["spike_multiplier"], cold_start_s=data.get("cold_start_s") or 0.0
        )
    args = {
        "model": barriers.ModelShape(
            n_layers=data["n_layers"],
            n_kv_heads=data["n_kv_heads"],
            d_head=data["d_head"],
            dtype_bytes=data["dtype_bytes"],
            weights_gb=data["weights_gb"],
        ),
        "hardware": barriers.Hardware(
            gpu_memory_gb=data["gpu_memory_gb"],
            overhead_gb=data["overhead_gb"],
            gpus_per_replica=data["gpus_per_replica"],
            usd_per_gpu_hour=data["usd_per_gpu_hour"],
        ),
        "workload": barriers.Workload(
            arrival_rate_per_s=data["arrival_rate_per_s"],
            input_tokens=data["input_tokens"],
            output_tokens=data["output_tokens"],
            context_tokens=data.get("context_tokens"),
        ),
        "slo": barriers.SLO(min_stream_tok_s=data["min_stream_tok_s"]),
        "throughput_table": data["throughput_table"],
        "headroom": data["headroom"],
        "ttft_s": data.get("ttft_s"),
        "spike": spike,
    }
    topology = tensor_parallel.Topology(
        gpus_per_node=data.get("gpus_per_node") or 8,
        domain_gpus=data.get("interconnect_domain_gpus") or 8,
        mig_profile=data.get("mig_profile") or "",
    )
    if not data.get("choose_tp"):
        result = barriers.plan(**args)
        return result, None, tensor_parallel.topology_answer(topology, data["gpus_per_replica"])
    choice = tensor_parallel.choose_tp(topology=topology, **args)
    result = choice.chosen_plan or barriers.PlanResult(feasible=False, explanation=choice.explanation)
    if choice.chosen is not None:
        result.explanation = f"{choice.explanation} {result.explanation}"
    tp = choice.chosen or data["gpus_per_replica"]
    return result, choice, tensor_parallel.topology_answer(topology, tp)
