"""Tenant pages: their endpoints and SLO status, usage over time, API keys (shown once), statement."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe

from billing.statements import statement_for
from console import charts
from console.access import tenant_admin_required, user_tenant
from console.forms import ApiKeyCreateForm
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
    keys = ApiKey.objects.filter(tenant=tenant).order_by("-created_at")
    new_key = request.session.pop(SHOWN_KEY_SESSION, None)  # shown on this one response, then gone
    context = {"tenant": tenant, "keys": keys, "new_key": new_key, "form": ApiKeyCreateForm(), "now": timezone.now()}
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
    tenant = user_tenant(request.user)
    now = timezone.now()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    statement = statement_for(tenant=tenant, start=start, end=now, now=now)
    return render(request, "console/statement.html", {"tenant": tenant, "statement": statement})
