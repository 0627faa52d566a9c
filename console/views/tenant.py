"""Tenant pages: their endpoints and SLO status, usage over time, API keys (shown once), statement."""

import csv
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.utils.text import slugify

from billing.spend import key_spend, tenant_spend_usd
from billing.statements import statement_for
from console import charts
from console.access import tenant_admin_required, user_tenant
from console.forms import ApiKeyCreateForm, StatementPeriodForm
from console.selectors import budgets_by_endpoint, replica_state_counts, tenant_usage_by_hour
from console.views.common import confirm_then_run
from endpoints.selectors import endpoints_visible_to
from tenants.models import ApiKey
from tenants.services import api_key_create, api_key_revoke

SHOWN_KEY_SESSION = "console.new_api_key"


@login_required
def tenant_home(request):
    tenant = user_tenant(request.user)
    now = timezone.now()
    endpoints = list(endpoints_visible_to(request.user))
    counts = replica_state_counts([e.pk for e in endpoints])
    budgets = budgets_by_endpoint(request.user)
    reservations = {r.endpoint_id: r for r in tenant.reservations.filter(adapter__isnull=True)}
    rows = [
        {
            "endpoint": e,
            "ready": counts.get(e.pk, {}).get("ready", 0),
            "budgets": budgets.get(e.name, []),
            "reservation": reservations.get(e.pk),
        }
        for e in endpoints
    ]
    start = now - timedelta(hours=24)
    usage = tenant_usage_by_hour(tenant=tenant, start=start, end=now)
    chart = charts.line_chart(
        charts.LineChart(
            "Usage, last 24 hours (MU per hour)",
            [charts.Series("MU/hour", [(hour.timestamp(), mu) for hour, mu, _ in usage])],
            y_label="MU",
            x_range=(start.timestamp(), now.timestamp()),
        )
    )
    context = {"tenant": tenant, "rows": rows, "usage_chart": mark_safe(chart), "usage": usage}
    return render(request, "console/tenant_home.html", context)


@login_required
def api_keys(request):
    tenant = user_tenant(request.user)
    keys = list(ApiKey.objects.filter(tenant=tenant).order_by("-created_at"))
    for spent in key_spend(keys):  # display rows: never saved
        spent.key.spent = spent
    new_key = request.session.pop(SHOWN_KEY_SESSION, None)  # shown on this one response, then gone
    month_spend = tenant_spend_usd([tenant.pk]).get(tenant.pk, 0.0)
    context = {
        "tenant": tenant,
        "keys": keys,
        "new_key": new_key,
        "form": ApiKeyCreateForm(),
        "now": timezone.now(),
        "month_spend": month_spend,
    }
    return render(request, "console/api_keys.html", context)


@tenant_admin_required
def api_key_create_view(request):
    tenant = user_tenant(request.user)
    if request.method != "POST":
        return redirect("console:api-keys")
    form = ApiKeyCreateForm(request.POST)
    context = {"tenant": tenant, "keys": ApiKey.objects.filter(tenant=tenant), "now": timezone.now()}

    def run():
        key, raw = api_key_create(
            tenant=tenant,
            name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"],
            max_priority=form.cleaned_data["max_priority"],
            expires_at=form.cleaned_data["expires_at"],
            actor=request.user,
        )
        request.session[SHOWN_KEY_SESSION] = {"name": key.name, "raw": raw, "prefix": key.prefix}
        return key

    return confirm_then_run(
        request,
        form=form,
        template="console/api_keys.html",
        context=context,
        title="Create API key",
        summary=f"Create key “{form.data.get('name', '')}” for {tenant}? It is shown once, right after.",
        run=run,
        success_message=lambda k: f"Key {k.name} created. Copy it now: it will not be shown again.",
        success_url=reverse("console:api-keys"),
    )


@tenant_admin_required
def api_key_revoke_view(request, key_id: int):
    tenant = user_tenant(request.user)
    key = get_object_or_404(ApiKey, pk=key_id, tenant=tenant)
    if request.method != "POST":
        return render(
            request,
            "console/confirm.html",
            {
                "title": f"Revoke {key.name}",
                "summary": f"Revoke key {key.prefix}…? Applications using it stop working at once.",
                "form": None,
                "cancel_url": reverse("console:api-keys"),
            },
        )
    if key.revoked_at is not None:
        messages.info(request, f"Key {key.name} was already revoked.")
    else:
        api_key_revoke(api_key=key, actor=request.user)
        messages.success(request, f"Key {key.name} revoked.")
    return redirect("console:api-keys")


@login_required
def statement(request):
    """The tenant's statement for a month or a date range (``StatementPeriodForm``), as a page or as CSV
    (``?format=csv``: one row per endpoint, then the total)."""
    tenant = user_tenant(request.user)
    now = timezone.now()
    form = StatementPeriodForm(request.GET)
    form_errors = None
    if not form.is_valid():  # said next to the picker; the statement shown is this month's
        form_errors, form = form.errors, StatementPeriodForm({})
        form.is_valid()
    start, end, label = form.period(now)
    context = {"tenant": tenant, "form": form, "form_errors": form_errors, "label": label, "statement": None}
    if start >= now:
        return render(request, "console/statement.html", context)  # a period that has not begun: nothing yet
    statement = statement_for(tenant=tenant, start=start, end=end, now=now)
    if request.GET.get("format") == "csv" and form_errors is None:
        return statement_csv(statement)
    return render(request, "console/statement.html", {**context, "statement": statement})


STATEMENT_COLUMNS = [
    "endpoint", "reserved_mu_per_min", "reserved_mu", "used_mu", "overage_mu", "requests", "output_tokens",
    "good_output_tokens", "reserved_usd", "overage_usd", "total_usd",
]  # fmt: skip


def statement_csv(statement) -> HttpResponse:
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"statement-{slugify(statement.tenant)}-{statement.start:%Y%m%d}-{statement.end:%Y%m%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(["period_start", "period_end", "currency", *STATEMENT_COLUMNS])
    period = [statement.start.isoformat(), statement.end.isoformat(), "USD"]
    for line in statement.lines:
        row = [_cell(getattr(line, column)) for column in STATEMENT_COLUMNS]
        row[0] = _safe_text(row[0])
        writer.writerow([*period, *row])
    totals = {"reserved_mu": statement.reserved_mu, "used_mu": statement.used_mu}
    totals |= {"overage_mu": statement.overage_mu, "total_usd": statement.total_usd}
    writer.writerow([*period, "TOTAL", *[_cell(totals.get(c, "")) for c in STATEMENT_COLUMNS[1:]]])
    return response


def _cell(value):
    return round(value, 6) if isinstance(value, float) else value


def _safe_text(value: str) -> str:
    """A cell a spreadsheet would run as a formula (=, +, -, @) is written as text (OWASP CSV injection)."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value
