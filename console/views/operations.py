"""Operator pages for tenants and reservations, SLOs and alerts, and cost and goodput reports."""

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from billing.cost import cost_csv
from billing.models import Alert, UsageMinute
from billing.selectors import (
    alert_acknowledger_shown,
    alerts_visible_to,
    cost_breakdown_for,
    cost_lines_for,
    slo_budgets,
)
from billing.slo import WINDOW_PAIRS, WINDOWS_S
from console import charts
from console.access import operator_required
from console.actions import alert_acknowledge_action, reservation_sell_action
from console.forms import AlertAckForm, PeriodForm, ReservationSellForm
from console.selectors import brownout_rows
from console.views.common import confirm_then_run
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
        for row in UsageMinute.objects.filter(start__gte=since)
        .values("tenant_id")
        .annotate(used=Sum("mu"), n=Sum("requests"))
        .order_by()
    }
    return render(request, "console/tenants.html", {"tenants": rows, "usage": usage})


@operator_required
def brownout(request):
    """Which tenants overload degraded, sent to a fallback or shed, and how often, against their reservations."""
    now = timezone.now()
    hours = 24 if request.GET.get("window") == "24h" else 1
    rows = brownout_rows(since=now - timedelta(hours=hours), now=now)
    return render(request, "console/brownout.html", {"rows": rows, "hours": hours})


@operator_required
def reservation_sell_view(request):
    template = "console/reservation_form.html"
    if request.method != "POST":
        initial = {k: request.GET.get(k) for k in ("tenant", "endpoint", "adapter") if request.GET.get(k)}
        return render(request, template, {"form": ReservationSellForm(initial=initial)})
    form = ReservationSellForm(request.POST)
    valid = form.is_valid()
    adapter = form.cleaned_data.get("adapter") if valid else None
    for_adapter = f" for adapter {adapter.name}" if adapter else ""
    return confirm_then_run(
        request,
        form=form,
        template=template,
        context={},
        title="Sell a reservation",
        summary=(
            f"Sell {form.cleaned_data['mu_per_min']:g} MU/min on {form.cleaned_data['endpoint']}{for_adapter} to "
            f"{form.cleaned_data['tenant']} ({form.cleaned_data['priority']})?"
            if valid
            else ""
        ),
        run=lambda: reservation_sell_action(form_data=form.cleaned_data, actor=request.user),
        success_message=lambda r: f"Sold {r.mu_per_min:g} MU/min on {r.endpoint} to {r.tenant}.",
        success_url=reverse("console:tenants"),
    )


@login_required
def slos(request):
    budgets = slo_budgets(request.user)
    evaluated = [b for b in budgets if b.budget_remaining is not None]
    budget_chart = ""
    if evaluated:
        budget_chart = mark_safe(
            charts.bar_chart(
                "Error budget remaining (%)",
                [charts.Bar(b.name[:24], max(0.0, b.budget_remaining) * 100) for b in evaluated],
                unit="%",
            )
        )
    context = {
        "budgets": budgets,
        "windows": list(WINDOWS_S),
        "pairs": WINDOW_PAIRS,
        "alerts": _alerts_shown(request.user),
        "budget_chart": budget_chart,
    }
    return render(request, "console/slos.html", context)


def _alerts_shown(user) -> list:
    """The latest alerts, each with who acknowledged it as this user may read it (never another tenant's person)."""
    alerts = list(alerts_visible_to(user).order_by("-started_at")[:200])
    for alert in alerts:  # display rows: never saved
        alert.acknowledger_shown = alert_acknowledger_shown(alert=alert, principal=user)
    return alerts


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
        run=lambda: alert_acknowledge_action(alert=alert, actor=request.user, note=form.cleaned_data["note"]),
        success_message="Alert acknowledged.",
        success_url=reverse("console:slos"),
    )


@operator_required
def cost(request):
    form = PeriodForm(request.GET or None)
    if request.GET and not form.is_valid():
        return render(request, "console/cost.html", {"form": form, "lines": [], "charts": []}, status=400)
    hours = form.cleaned_data["hours"] if form.is_bound else 24
    end = timezone.now()
    start = end - timedelta(hours=hours)
    lines = cost_lines_for(request.user, start=start, end=end)
    if request.GET.get("format") == "csv":
        response = HttpResponse(cost_csv(lines), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="infercap-cost-{end:%Y%m%d-%H%M}-{hours}h.csv"'
        return response
    endpoint_lines = [line for line in lines if line.tenant_id is None]
    chart_specs = [
        ("GPU cost (USD)", "usd", "$"),
        ("Idle cost (USD)", "idle_usd", "$"),
        ("Good tokens per USD", "good_tokens_per_usd", ""),
    ]
    context = {
        "form": form,
        "lines": lines,
        "breakdown": cost_breakdown_for(request.user, start=start, end=end, lines=lines),
        "hours": hours,
        "start": start,
        "end": end,
        "charts": [
            mark_safe(
                charts.bar_chart(
                    title,
                    [charts.Bar(line.endpoint[:24], getattr(line, attr) or 0.0) for line in endpoint_lines],
                    unit=unit,
                )
            )
            for title, attr, unit in chart_specs
        ]
        if endpoint_lines
        else [],
        "totals": {
            "gpu_hours": sum(line.gpu_hours for line in endpoint_lines),
            "usd": sum(line.usd for line in endpoint_lines),
            "good": sum(line.good_output_tokens for line in endpoint_lines),
            "idle_usd": sum(line.idle_usd for line in endpoint_lines),
        },
    }
    return render(request, "console/cost.html", context)
