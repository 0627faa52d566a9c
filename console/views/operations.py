"""Operator pages for tenants and reservations, SLOs and alerts, and cost and goodput reports."""
import csv
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from billing.models import Alert, UsageRecord
from console import charts
from console.access import endpoints_visible_to, operator_required
from console.actions import alert_acknowledge, reservation_sell
from console.forms import AlertAckForm, PeriodForm, ReservationSellForm, overcommit_limit
from console.reports import (
    BURN_RULES,
    BURN_WINDOWS,
    COST_CSV_HEADER,
    alerts_visible,
    cost_csv_rows,
    cost_rows,
    slo_statuses_for,
)
from console.selectors import capacity_ledger, replica_state_counts
from console.views.common import confirm_then_run
from endpoints.models import Endpoint, ReplicaState
from tenants.models import Tenant


@operator_required
def tenants(request):
    since = timezone.now() - timedelta(hours=24)
    rows = list(
        Tenant.objects.annotate(users_n=Count("users", distinct=True))
        .prefetch_related("reservations__endpoint")
        .order_by("name")
    )
    for tenant in rows:
        tenant.reserved = sum(r.mu_per_min for r in tenant.reservations.all())
    usage = {
        row["tenant_id"]: row
        for row in UsageRecord.objects.filter(finished_at__gte=since)
        .values("tenant_id")
        .annotate(used=Sum("mu"), n=Count("id"))
    }
    return render(request, "console/tenants.html", {"tenants": rows, "usage": usage})


def _have_for(endpoint: Endpoint) -> float:
    """Capacity a sale is checked against: ready replicas, or the desired count when more are on their way."""
    counts = replica_state_counts([endpoint.pk]).get(endpoint.pk, {})
    replicas = max(counts.get(ReplicaState.READY, 0), endpoint.desired_replicas)
    return capacity_ledger(endpoint=endpoint, ready_replicas=replicas, now=timezone.now()).have_mu_per_min


@operator_required
def reservation_sell_view(request):
    template = "console/reservation_form.html"
    if request.method != "POST":
        initial = {k: request.GET.get(k) for k in ("tenant", "endpoint") if request.GET.get(k)}
        return render(request, template, {"form": ReservationSellForm(initial=initial)})
    form = ReservationSellForm(request.POST)
    endpoint = None
    if form.is_valid():
        endpoint = form.cleaned_data["endpoint"]
    return confirm_then_run(
        request,
        form=form,
        template=template,
        context={},
        title="Sell a reservation",
        summary=(
            f"Sell {form.data.get('mu_per_min')} MU/min on {endpoint} to {form.cleaned_data.get('tenant')}?"
            if endpoint else ""
        ),
        run=lambda: reservation_sell(
            form_data=form.cleaned_data, have_mu_per_min=_have_for(endpoint), overcommit_limit=overcommit_limit(),
            actor=request.user,
        ),
        success_message=lambda r: f"Sold {r.mu_per_min:g} MU/min on {r.endpoint} to {r.tenant}.",
        success_url=reverse("console:tenants"),
    )


@login_required
def slos(request):
    now = timezone.now()
    endpoints = endpoints_visible_to(request.user)
    tenant = None if request.user.is_operator else request.user.tenant
    statuses = [s for endpoint in endpoints for s in slo_statuses_for(endpoint=endpoint, now=now, tenant=tenant)]
    budget_chart = mark_safe(
        charts.bar_chart(
            "Error budget remaining",
            [charts.Bar(f"{s.slo.name}"[:12], max(0.0, s.budget_remaining) * 100) for s in statuses],
            unit="%",
            width=480,
        )
    ) if statuses else ""
    context = {
        "statuses": statuses,
        "windows": list(BURN_WINDOWS),
        "rules": BURN_RULES,
        "alerts": alerts_visible(user=request.user, endpoints=endpoints),
        "budget_chart": budget_chart,
    }
    return render(request, "console/slos.html", context)


@operator_required
def alert_ack_view(request, alert_id: int):
    alert = get_object_or_404(Alert.objects.select_related("slo", "slo__endpoint"), pk=alert_id)
    context = {"alert": alert}
    if request.method != "POST":
        return render(request, "console/alert_ack_form.html", {**context, "form": AlertAckForm()})
    form = AlertAckForm(request.POST)
    return confirm_then_run(
        request,
        form=form,
        template="console/alert_ack_form.html",
        context=context,
        title="Acknowledge alert",
        summary=f"Acknowledge the {alert.get_severity_display().lower()} alert on {alert.slo}?",
        run=lambda: alert_acknowledge(alert=alert, actor=request.user, note=form.cleaned_data["note"]),
        success_message="Alert acknowledged.",
        success_url=reverse("console:slos"),
    )


@operator_required
def cost(request):
    form = PeriodForm(request.GET or None)
    hours = form.cleaned_data["hours"] if form.is_valid() else 24
    end = timezone.now()
    start = end - timedelta(hours=hours)
    rows = cost_rows(endpoints=endpoints_visible_to(request.user), start=start, end=end)
    if request.GET.get("format") == "csv" and (form.is_valid() or not request.GET.get("hours")):
        response = HttpResponse(content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="infercap-cost-{end:%Y%m%d-%H%M}-{hours}h.csv"'
        writer = csv.writer(response)
        writer.writerow(COST_CSV_HEADER)
        writer.writerows(cost_csv_rows(rows, start=start, end=end))
        return response
    usd_chart = charts.bar_chart("GPU cost (USD)", [charts.Bar(r.endpoint.name[:12], r.usd) for r in rows], unit="$")
    idle_chart = charts.bar_chart("Idle cost (USD)", [charts.Bar(r.endpoint.name[:12], r.idle_usd) for r in rows], unit="$")
    goodput_chart = charts.bar_chart(
        "Good tokens per USD", [charts.Bar(r.endpoint.name[:12], r.good_tokens_per_usd or 0.0) for r in rows]
    )
    context = {
        "form": form,
        "rows": rows,
        "hours": hours,
        "start": start,
        "end": end,
        "charts": [mark_safe(c) for c in (usd_chart, idle_chart, goodput_chart)] if rows else [],
        "totals": {
            "gpu_hours": sum(r.gpu_hours for r in rows),
            "usd": sum(r.usd for r in rows),
            "good": sum(r.good_output_tokens for r in rows),
            "idle_usd": sum(r.idle_usd for r in rows),
        },
    }
    return render(request, "console/cost.html", context, status=200 if form.is_valid() or not request.GET else 400)
