"""Reads for SLO budgets, alerts, webhooks and cost, scoped to what a principal may see (for the API and console).

Operators see everything. A tenant sees its own SLOs and the endpoint-wide SLOs of endpoints it uses (the SLO API's
rule), the alerts of those SLOs, its own webhooks, and cost lines for itself and for the endpoints it owns.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from billing.cost import CostLine, cost_lines
from billing.cost_split import CapacityTypeCost, ProfileCost, fleet_breakdown
from billing.models import SLO, Alert, CostReport, SLOStatus, Webhook
from billing.slo import WINDOWS_S
from endpoints.models import Endpoint
from endpoints.selectors import endpoints_visible_to, owned_or_shared
from tenants.selectors import principal_can_write, principal_is_operator, principal_tenant_id


def slos_visible_to(principal) -> QuerySet[SLO]:
    """A tenant's own SLOs and the endpoint-wide SLOs of the endpoints it can see; operators, every SLO."""
    return owned_or_shared(SLO.objects.select_related("endpoint", "tenant"), principal, owner="tenant")


@dataclass(frozen=True)
class SLOBudget:
    slo_id: int
    name: str
    endpoint: str
    tenant: str | None
    sli: str
    objective: float
    period_days: int
    evaluated_at: datetime | None
    budget_remaining: float | None  # fraction of the period's error budget left; None before the first evaluation
    burn_rates: dict[str, float]  # window ("5m" … "3d") → burn rate
    exhausts_at: datetime | None
    firing: list[str]  # "page 1h/5m", … of the alerts firing now
    health: str  # "page", "ticket", "ok" or "unknown"

    def as_dict(self) -> dict:
        return {
            **vars(self),
            "evaluated_at": self.evaluated_at.isoformat() if self.evaluated_at else None,
            "exhausts_at": self.exhausts_at.isoformat() if self.exhausts_at else None,
        }


def slo_budgets(principal, *, slo_ids: list[int] | None = None) -> list[SLOBudget]:
    """Every visible SLO with its latest budget, burn rates and firing alerts (three queries)."""
    slos = slos_visible_to(principal)
    if slo_ids is not None:
        slos = slos.filter(pk__in=slo_ids)
    slos = list(slos)
    statuses = {s.slo_id: s for s in SLOStatus.objects.filter(slo__in=[s.pk for s in slos])}
    firing: dict[int, list[Alert]] = {}
    for alert in Alert.objects.filter(slo__in=[s.pk for s in slos], state=Alert.State.FIRING):
        firing.setdefault(alert.slo_id, []).append(alert)
    budgets = []
    for slo in slos:
        status = statuses.get(slo.pk)
        alerts = firing.get(slo.pk, [])
        severities = {a.severity for a in alerts}
        health = "page" if "page" in severities else "ticket" if severities else "ok" if status else "unknown"
        budgets.append(
            SLOBudget(
                slo_id=slo.pk,
                name=slo.name,
                endpoint=slo.endpoint.name,
                tenant=slo.tenant.slug if slo.tenant_id else None,
                sli=slo.sli,
                objective=slo.objective,
                period_days=slo.period_days,
                evaluated_at=status.evaluated_at if status else None,
                budget_remaining=status.budget_remaining if status else None,
                burn_rates={w: (status.burn_rates.get(w, 0.0) if status else 0.0) for w in WINDOWS_S},
                exhausts_at=status.exhausts_at if status else None,
                firing=sorted(f"{a.severity} {a.long_window}/{a.short_window}" for a in alerts),
                health=health,
            )
        )
    return budgets


def alerts_visible_to(principal) -> QuerySet[Alert]:
    return Alert.objects.select_related("slo__endpoint", "slo__tenant", "acknowledged_by").filter(
        slo__in=slos_visible_to(principal).values("pk")
    )


def alert_acknowledgeable_by(*, alert: Alert, principal) -> bool:
    """Operators acknowledge any alert; a tenant's admins and write keys only the alerts of its own SLOs and of the
    endpoint-wide SLOs of endpoints it owns. An endpoint-wide SLO of a shared endpoint is the operators' to handle:
    a reserving tenant sees its alerts but cannot mark them seen for the people paged by them."""
    if principal_is_operator(principal):
        return True
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None or not principal_can_write(principal):
        return False
    slo = alert.slo
    return slo.tenant_id == tenant_id or (slo.tenant_id is None and slo.endpoint.owner_tenant_id == tenant_id)


OPERATOR_ACKNOWLEDGER = "an operator"


def alert_acknowledger_shown(*, alert: Alert, principal) -> str | None:
    """Who acknowledged the alert, as the principal may read it: operators see the username; a tenant sees the
    usernames of its own people, "an operator" for the operators' and nothing for anyone else (another tenant's
    person: the alert may be on a shared endpoint)."""
    user = alert.acknowledged_by
    if user is None:
        return None
    if principal_is_operator(principal):
        return user.username
    if user.is_operator:
        return OPERATOR_ACKNOWLEDGER
    tenant_id = principal_tenant_id(principal)
    return user.username if tenant_id is not None and user.tenant_id == tenant_id else None


def open_alerts(principal) -> QuerySet[Alert]:
    return alerts_visible_to(principal).exclude(state=Alert.State.RESOLVED)


def webhooks_visible_to(principal) -> QuerySet[Webhook]:
    queryset = Webhook.objects.select_related("tenant")
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    return queryset.filter(tenant_id=tenant_id) if tenant_id else queryset.none()


def _owned_endpoint_ids(tenant_id: int) -> QuerySet:
    return Endpoint.objects.filter(owner_tenant_id=tenant_id).values("pk")


def cost_reports_visible_to(principal) -> QuerySet[CostReport]:
    queryset = CostReport.objects.select_related("endpoint", "tenant")
    if principal_is_operator(principal):
        return queryset
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return queryset.none()
    return queryset.filter(
        Q(tenant_id=tenant_id) | Q(tenant__isnull=True, endpoint__in=_owned_endpoint_ids(tenant_id))
    )


def cost_lines_for(principal, *, start: datetime, end: datetime) -> list[CostLine]:
    """Live cost lines over any range, cut to what the principal may see."""
    if principal_is_operator(principal):
        return cost_lines(start=start, end=end)
    tenant_id = principal_tenant_id(principal)
    if tenant_id is None:
        return []
    owned = set(Endpoint.objects.filter(owner_tenant_id=tenant_id).values_list("pk", flat=True))
    lines = cost_lines(start=start, end=end, endpoints=endpoints_visible_to(principal))
    return [
        line for line in lines if line.tenant_id == tenant_id or (line.tenant_id is None and line.endpoint_id in owned)
    ]


@dataclass(frozen=True)
class HardwareBreakdown:
    start: datetime
    end: datetime
    scope: str  # "fleet" (operators) or "tenant" (a tenant's own lines)
    by_profile: list[ProfileCost]
    by_capacity_type: list[CapacityTypeCost]


def cost_breakdown_for(
    principal, *, start: datetime, end: datetime, lines: list[CostLine] | None = None
) -> HardwareBreakdown:
    """GPU-hours, dollars, good requests and tokens, and goodput per dollar per hardware profile and per capacity type:
    for operators over the whole fleet (the endpoint lines), for a tenant over its own lines only. ``lines``: the
    principal's ``cost_lines_for`` over the same range, when the caller already has them."""
    if lines is None:
        lines = cost_lines_for(principal, start=start, end=end)
    if principal_is_operator(principal):
        scope, chosen = "fleet", [line for line in lines if line.tenant_id is None]
    else:
        tenant_id = principal_tenant_id(principal)
        scope, chosen = "tenant", [line for line in lines if tenant_id is not None and line.tenant_id == tenant_id]
    by_profile, by_type = fleet_breakdown(row for line in chosen for row in line.by_hardware)
    return HardwareBreakdown(start=start, end=end, scope=scope, by_profile=by_profile, by_capacity_type=by_type)
