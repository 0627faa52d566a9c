"""The planner acts on a live endpoint: its form filled from what the endpoint runs and serves (model and hardware
profiles, the last hour's measured workload, its SLOs), and the plan's replica bounds applied to the endpoint
through the audited service, after a confirmation."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.db.models import Sum
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone

from billing.models import UsageMinute
from console.access import operator_required
from console.views.common import confirm_then_run
from endpoints import services as endpoint_services
from endpoints.models import Endpoint

WINDOW = timedelta(hours=1)


def endpoint_initial(endpoint: Endpoint, *, now=None) -> dict:
    """The planner's inputs for a live endpoint: its profiles' shape and price, its SLOs as the planner takes them,
    and the workload its usage rollups measured over the last hour (left at the form's defaults when it served
    nothing)."""
    now = now or timezone.now()
    model, hardware = endpoint.model_profile, endpoint.hardware_profile
    initial = {
        "n_layers": model.n_layers,
        "n_kv_heads": model.n_kv_heads,
        "d_head": model.d_head,
        "dtype_bytes": model.dtype_bytes,
        "weights_gb": model.weights_gb,
        "gpu_memory_gb": hardware.gpu_memory_gb,
        "gpus_per_replica": hardware.gpus_per_replica,
        "overhead_gb": hardware.memory_overhead_gb,
        "min_stream_tok_s": round(1000.0 / max(1, endpoint.tpot_slo_ms), 3),
        "ttft_s": endpoint.ttft_slo_ms / 1000.0,
    }
    if hardware.usd_per_gpu_hour is not None:
        initial["usd_per_gpu_hour"] = hardware.usd_per_gpu_hour
    served = UsageMinute.objects.filter(endpoint=endpoint, start__gte=now - WINDOW, start__lt=now).aggregate(
        requests=Sum("requests"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens")
    )
    requests = served["requests"] or 0
    if requests:
        initial.update(
            arrival_rate_per_s=round(requests / WINDOW.total_seconds(), 4),
            input_tokens=round((served["input_tokens"] or 0) / requests, 1),
            output_tokens=max(1.0, round((served["output_tokens"] or 0) / requests, 1)),
        )
    return initial


def apply_bounds(result) -> tuple[int, int] | None:
    """(min, max) replicas from a feasible plan: the base count as the floor, the count with headroom (or the spike's,
    when larger) as the ceiling; None when the plan is not feasible."""
    if not result.feasible or result.n_base is None:
        return None
    ceiling = result.n_with_headroom
    if result.spike is not None:
        ceiling = max(ceiling, result.spike.replicas_needed)
    return max(1, result.n_base), max(1, result.n_base, ceiling)


class PlanApplyForm(forms.Form):
    min_replicas = forms.IntegerField(min_value=0, max_value=1000)
    max_replicas = forms.IntegerField(min_value=1, max_value=1000)

    def clean(self):
        cleaned = super().clean()
        low, high = cleaned.get("min_replicas"), cleaned.get("max_replicas")
        if low is not None and high is not None and low > high:
            self.add_error("min_replicas", "must not exceed max_replicas")
        return cleaned


@operator_required
def planner_apply_view(request, endpoint_id: int):
    """Set the endpoint's replica bounds to the plan's, confirmed first; ``endpoint_update`` audits the change."""
    endpoint = get_object_or_404(Endpoint, pk=endpoint_id)
    form = PlanApplyForm(request.POST or None)
    if request.method != "POST":
        form = PlanApplyForm()
    bounds = form.cleaned_data if form.is_bound and form.is_valid() else {}
    low, high = bounds.get("min_replicas"), bounds.get("max_replicas")
    return confirm_then_run(
        request,
        form=form,
        template="console/plan_apply_form.html",
        context={"endpoint": endpoint},
        title=f"Apply the plan to {endpoint.name}",
        summary=(
            f"Set {endpoint.name}'s replicas to {low}–{high} (now {endpoint.min_replicas}–{endpoint.max_replicas}); "
            "the autoscaler works within the new bounds from its next tick."
        ),
        run=lambda: endpoint_services.endpoint_update(
            endpoint=endpoint, actor=request.user, min_replicas=low, max_replicas=high
        ),
        success_message=lambda e: f"{e.name}: replicas {e.min_replicas}–{e.max_replicas}, from the plan.",
        success_url=lambda e: reverse("console:endpoint", args=[e.pk]),
    )
