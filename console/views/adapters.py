"""LoRA adapters page (docs/lora-serving.md): the adapters a user may see, their traffic over the last day, and for
operators which adapters each LoRA replica's engine holds now (its /v1/models, read with a short timeout)."""

from __future__ import annotations

from datetime import timedelta

import httpx
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.shortcuts import render
from django.utils import timezone

from billing.models import UsageRecord
from endpoints.models import Replica, ReplicaState
from endpoints.selectors import adapters_visible_to
from gateway.proxy.replica_adapters import engine_adapters
from tenants.selectors import principal_is_operator, principal_tenant_id

REPLICAS_SHOWN = 16  # engines asked per page view, each within HOLDINGS_TIMEOUT_S
HOLDINGS_TIMEOUT_S = 0.5


def _usage_by_adapter(user, names: list[str]) -> dict[str, dict]:
    since = timezone.now() - timedelta(days=1)
    rows = UsageRecord.objects.filter(finished_at__gte=since, adapter__in=names)
    if not principal_is_operator(user):
        rows = rows.filter(tenant_id=principal_tenant_id(user))
    totals = rows.values("adapter").annotate(requests=Count("id"), mu=Sum("mu"), output=Sum("output_tokens"))
    return {row["adapter"]: row for row in totals}


def _holdings(endpoint_ids: set[int]) -> list[dict]:
    """Each ready replica of these endpoints with the adapters its engine lists now (None: it did not answer)."""
    replicas = Replica.objects.filter(endpoint_id__in=endpoint_ids, state=ReplicaState.READY).exclude(url="")
    shown = []
    with httpx.Client(timeout=HOLDINGS_TIMEOUT_S) as client:
        for replica in replicas.select_related("endpoint").order_by("endpoint__name", "name")[:REPLICAS_SHOWN]:
            base = replica.served_model_name or replica.endpoint.name
            try:
                response = client.get(replica.url.rstrip("/") + "/v1/models")
                held = sorted(engine_adapters(response.content, base)) if response.status_code == 200 else None
            except httpx.HTTPError:
                held = None
            shown.append({"replica": replica, "held": held, "slots": replica.endpoint.lora[0]})
    return shown


@login_required
def adapters(request):
    user = request.user
    rows = list(adapters_visible_to(user).order_by("endpoint__name", "name"))
    usage = _usage_by_adapter(user, [a.name for a in rows])
    is_operator = principal_is_operator(user)
    holdings = _holdings({a.endpoint_id for a in rows}) if is_operator else []
    listed = [{"adapter": a, "usage": usage.get(a.name, {})} for a in rows]
    return render(request, "console/adapters.html", {"rows": listed, "holdings": holdings, "is_operator": is_operator})
