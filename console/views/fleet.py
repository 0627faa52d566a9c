"""Fleet overview and endpoint pages (operators see every endpoint, tenants the ones they may see), and
the operator actions on them: create, scale (a pin) or release the pin, drain a replica, attach a running vLLM server."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST

from capacity.autoscaling import pins
from console import charts
from console.access import endpoint_for, operator_required
from console.actions import endpoint_create_action, endpoint_scale_action, replica_attach_action, replica_drain_action
from console.adapter_churn import replica_lora
from console.fleet_summary import SORTS, fleet_totals, shows_table, table_page
from console.forms import DrainForm, EndpointCreateForm, ReplicaAttachForm, ScaleForm
from console.pd_threshold import endpoint_threshold
from console.queue_history import queue_history
from console.selectors import (
    budgets_by_endpoint,
    endpoint_ledger,
    endpoint_replicas,
    endpoint_series,
    fleet_rows,
    queue_depth,
    recent_decisions,
    scale_pin_shown,
    shows_whole_endpoint,
    tenant_endpoint_ledger,
)
from console.views.common import confirm_then_run
from console.views.rollouts import rollout_panel
from endpoints import services as endpoint_services
from endpoints.models import Replica, ReplicaState
from endpoints.selectors import endpoints_visible_to


@login_required
def home(request):
    if request.user.is_operator:
        return redirect("console:fleet")
    return redirect("console:tenant-home")


@operator_required
def fleet(request):
    """Totals over the whole fleet, then the endpoints: cards while there are few, else a compact table sorted by
    any column (``?sort=used&dir=desc``), one page at a time; ``?view=cards`` or ``?view=table`` chooses."""
    now = timezone.now()
    rows = fleet_rows(user=request.user, endpoints=endpoints_visible_to(request.user), now=now)
    table = shows_table(request.GET.get("view"), len(rows))
    sort = request.GET.get("sort") if request.GET.get("sort") in SORTS else "name"
    descending = request.GET.get("dir") == "desc"
    page = table_page(rows, sort=sort, descending=descending, page=request.GET.get("page"))
    if not table:
        for row in page:
            row.chart = mark_safe(
                charts.bar_chart(
                    f"{row.endpoint.name} capacity",
                    [
                        charts.Bar("have", row.ledger.have_mu_per_min),
                        charts.Bar("sold", row.ledger.sold_mu_per_min, _sold_note(row.ledger)),
                        charts.Bar("used (1 h)", row.ledger.used_mu_per_min_1h),
                    ],
                    unit="MU/min",
                    width=340,
                )
            )
    context = {
        "rows": list(page),
        "page": page,
        "table": table,
        "sort": sort,
        "descending": descending,
        "sorts": {name: label for name, (label, _) in SORTS.items()},
        "totals": fleet_totals(rows),
        "states": ReplicaState,
        "now": now,
    }
    return render(request, "console/fleet.html", context)


def _sold_note(ledger) -> str:
    if ledger.overcommit_ratio is not None:
        return f"({ledger.overcommit_ratio:.0%} of have)"
    return "(no ready capacity)" if ledger.sold_mu_per_min else ""


@login_required
def endpoint_detail(request, endpoint_id: int):
    endpoint = endpoint_for(request.user, endpoint_id)
    now = timezone.now()
    minutes = 60
    whole = shows_whole_endpoint(user=request.user, endpoint=endpoint)
    # A tenant reserving on a shared endpoint: its own usage, sold and shed figures only (as the API's ledger), no
    # queue depth or autoscaler reasons (both are every tenant's demand).
    own = None if whole else request.user.tenant_id
    series = endpoint_series(endpoint=endpoint, now=now, minutes=minutes, tenant_id=own)
    decisions = recent_decisions(endpoint=endpoint, since=now - timedelta(minutes=minutes)) if whole else []
    replicas = endpoint_replicas(endpoint, viewer=request.user, include_stopped=request.GET.get("stopped") == "1")
    ledger = endpoint_ledger(endpoint=endpoint, now=now)
    lora = replica_lora(endpoint=endpoint, viewer=request.user)
    for replica in replicas:  # display rows (endpoint_replicas): never saved
        replica.lora = lora.get(replica.pk)
    context = {
        "endpoint": endpoint,
        "replicas": replicas,
        "lora_on": endpoint.lora[0] > 0,
        "decisions": decisions,
        "pin": scale_pin_shown(endpoint=endpoint, now=now) if whole else None,
        "whole_endpoint": whole,
        "ledger": ledger,
        "own": None if whole else tenant_endpoint_ledger(endpoint=endpoint, tenant_id=own, now=now),
        "budgets": budgets_by_endpoint(request.user).get(endpoint.name, []),
        "queue": queue_depth(endpoint.pk) if whole else {},
        "charts": _endpoint_charts(endpoint, series, decisions, ledger.replica_mu_per_min, whole=whole),
        "rollouts": rollout_panel(endpoint=endpoint, user=request.user),
        # The last hour's prompts are every tenant's: only for those who see the whole endpoint.
        "pd": endpoint_threshold(endpoint=endpoint, now=now) if whole else None,
        "now": now,
    }
    return render(request, "console/endpoint_detail.html", context)


def _endpoint_charts(endpoint, series, decisions, replica_mu_per_min: float, *, whole: bool = True) -> dict:
    xs = series.minutes
    markers = [
        charts.Marker(
            d.at.timestamp(),
            f"{d.at:%H:%M:%S} {d.get_axis_display()}: {d.current:g} → {d.desired:g} ({d.reason})",
            by_operator=d.tick.startswith(("manual-", "unpin-")),
        )
        for d in decisions
    ]
    capacity = [ready * replica_mu_per_min for ready in series.ready_replicas]
    window = (xs[0], xs[-1]) if xs else None
    specs = {
        "requests": charts.LineChart(
            "Requests per second",
            [
                charts.Series("requests/s", list(zip(xs, series.requests_per_s, strict=True))),
                charts.Series("errors/s", list(zip(xs, series.errors_per_s, strict=True))),
            ],
            y_label="req/s",
        ),
        "queue": charts.LineChart(
            "Queue depth by priority class",
            [
                charts.Series(cls, points)
                for cls, points in (queue_history(endpoint.pk, since=xs[0] if xs else 0) if whole else {}).items()
            ],
            y_label="queued requests",
        ),
        "ttft": charts.LineChart(
            "TTFT p95 (ms)",
            [charts.Series("TTFT p95", list(zip(xs, series.ttft_p95_ms, strict=True)))],
            y_label="ms",
            threshold=endpoint.ttft_slo_ms,
            threshold_label=f"SLO {endpoint.ttft_slo_ms} ms",
        ),
        "tpot": charts.LineChart(
            "TPOT p95 (ms)",
            [charts.Series("TPOT p95", list(zip(xs, series.tpot_p95_ms, strict=True)))],
            y_label="ms",
            threshold=endpoint.tpot_slo_ms,
            threshold_label=f"SLO {endpoint.tpot_slo_ms} ms",
        ),
        "replicas": charts.LineChart(
            "Ready replicas (▾ autoscaler decisions, ◆ operator scales)",
            [charts.Series("ready replicas", list(zip(xs, series.ready_replicas, strict=True)))],
            y_label="replicas",
            markers=markers,
        ),
        "mu": charts.LineChart(
            "MU used vs capacity" if whole else "MU used by your tenant vs capacity",
            [
                charts.Series("used MU/min", list(zip(xs, series.mu_per_min, strict=True))),
                charts.Series("capacity MU/min", list(zip(xs, capacity, strict=True))),
            ],
            y_label="MU/min",
        ),
    }
    for spec in specs.values():
        spec.x_range = window
    return {name: mark_safe(charts.line_chart(spec)) for name, spec in specs.items()}


@operator_required
def endpoint_create_view(request):
    if request.method != "POST":
        return render(request, "console/endpoint_form.html", {"form": EndpointCreateForm()})
    form = EndpointCreateForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/endpoint_form.html",
        context={},
        title="Create endpoint",
        summary=(
            f"Create endpoint “{form.data.get('name', '')}” with {form.data.get('desired_replicas', '?')} desired "
            "replica(s)? The autoscaler's actuator starts the replicas."
        ),
        run=lambda: endpoint_create_action(form_data=form.cleaned_data, actor=request.user),
        success_message=lambda e: f"Endpoint {e.name} created.",
        success_url=lambda e: reverse("console:endpoint", args=[e.pk]),
    )


@operator_required
def endpoint_scale_view(request, endpoint_id: int):
    endpoint = endpoint_for(request.user, endpoint_id)
    context = {"endpoint": endpoint}
    if request.method != "POST":
        initial = {k: getattr(endpoint, k) for k in ("min_replicas", "max_replicas", "desired_replicas")}
        return render(request, "console/scale_form.html", {**context, "form": ScaleForm(initial=initial)})
    form = ScaleForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/scale_form.html",
        context=context,
        title=f"Scale {endpoint.name}",
        summary=(
            f"Scale {endpoint.name} from {endpoint.desired_replicas} to {form.data.get('desired_replicas')} desired "
            f"replicas (bounds {form.data.get('min_replicas')}–{form.data.get('max_replicas')})? "
            + (
                f"The autoscaler holds this count for {form.data.get('pin_minutes')} minutes, then decides on demand."
                if pins.autoscaled(endpoint)
                else "Autoscaling is off: the count stays until changed."
            )
        ),
        run=lambda: endpoint_scale_action(endpoint=endpoint, actor=request.user, **form.cleaned_data),
        success_message=lambda e: f"{e.name} now wants {e.desired_replicas} replica(s); they start now.",
        success_url=reverse("console:endpoint", args=[endpoint.pk]),
    )


@operator_required
@require_POST
def endpoint_unpin_view(request, endpoint_id: int):
    """End an operator's pin now: the autoscaler decides on demand from its next tick."""
    endpoint = endpoint_for(request.user, endpoint_id)
    if endpoint_services.endpoint_unpin(endpoint=endpoint, actor=request.user):
        messages.success(request, f"{endpoint.name}: pin released; the autoscaler decides again within 5 s.")
    return redirect("console:endpoint", endpoint_id=endpoint.pk)


@operator_required
def replica_drain_view(request, endpoint_id: int, replica_id: int):
    endpoint = endpoint_for(request.user, endpoint_id)
    replica = get_object_or_404(Replica, pk=replica_id, endpoint=endpoint)
    context = {"endpoint": endpoint, "replica": replica}
    if request.method != "POST":
        return render(request, "console/drain_form.html", {**context, "form": DrainForm()})
    form = DrainForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/drain_form.html",
        context=context,
        title=f"Drain {replica.name}",
        summary=f"Drain replica {replica.name} of {endpoint.name}? It stops taking new requests and stops when idle.",
        run=lambda: replica_drain_action(replica=replica, actor=request.user, reason=form.cleaned_data["reason"]),
        success_message=f"Replica {replica.name} is draining.",
        success_url=reverse("console:endpoint", args=[endpoint.pk]),
    )


@operator_required
def replica_attach_view(request, endpoint_id: int):
    endpoint = endpoint_for(request.user, endpoint_id)
    context = {"endpoint": endpoint}
    if request.method != "POST":
        return render(request, "console/replica_attach_form.html", {**context, "form": ReplicaAttachForm()})
    form = ReplicaAttachForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/replica_attach_form.html",
        context=context,
        title=f"Attach a vLLM server to {endpoint.name}",
        summary=(
            f"Attach the vLLM server at {form.data.get('url', '')} to {endpoint.name}? It must answer /health, list "
            f"{endpoint.name} at /v1/models and expose vllm: metrics; then it takes traffic at once."
        ),
        run=lambda: replica_attach_action(endpoint=endpoint, form_data=form.cleaned_data, actor=request.user),
        success_message=lambda r: f"Replica {r.name} attached and ready.",
        success_url=reverse("console:endpoint", args=[endpoint.pk]),
    )
