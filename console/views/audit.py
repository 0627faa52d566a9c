"""Audit trail page: operators see every entry, a tenant's users their tenant's (the audit API's rule)."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render

from tenants.api.audit import audit_visible_to


@login_required
def audit(request):
    entries = audit_visible_to(request.user).select_related("actor", "tenant").order_by("-at", "-id")
    action = request.GET.get("action", "").strip()[:64]
    if action:
        entries = entries.filter(action__startswith=action)
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    return render(request, "console/audit.html", {"page": page, "action": action})
