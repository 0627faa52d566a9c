"""Reads behind the SLO, cost and statement pages: error budgets and burn rates, GPU cost, goodput, statements.

Burn rate over a window = (bad / total in the window) / (1 − objective); the multiwindow thresholds are
the Google SRE workbook's (page 14.4 over 1h+5m or 6 over 6h+30m, ticket 3 over 1d+2h or 1 over 3d+6h).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, F, Q, Sum

from billing.models import SLO, Alert, SLIKind, UsageRecord, UsageStatus
from endpoints.models import BILLED_STATES, Endpoint, ReplicaTransition
from tenants.models import Tenant

BURN_WINDOWS = {
    "5m": timedelta(minutes=5),
    "30m": timedelta(minutes=30),
    "1h": timedelta(hours=1),
    "2h": timedelta(hours=2),
    "6h": timedelta(hours=6),
    "1d": timedelta(days=1),
    "3d": timedelta(days=3),
}
# (severity, long window, short window, threshold)
BURN_RULES = [
    ("page", "1h", "5m", 14.4),
    ("page", "6h", "30m", 6.0),
    ("ticket", "1d", "2h", 3.0),
    ("ticket", "3d", "6h", 1.0),
]
# Requests the platform is not accountable for: the client left, or the tenant exceeded its own limits.
NOT_COUNTED = [UsageStatus.CLIENT_CANCELLED, UsageStatus.RATE_LIMITED]


@dataclass
class SLOStatus:
    slo: SLO
    total: int
    bad: int
    budget_remaining: float  # fraction of the period's error budget left, may go negative
    burn: dict[str, float]
    firing: list[str]  # rules whose long and short windows both exceed their threshold

    @property
    def attainment(self) -> float | None:
        return None if self.total == 0 else 1 - self.bad / self.total


def good_filter(slo: SLO) -> Q:
    endpoint = slo.endpoint
    ok = Q(status=UsageStatus.OK)
    if slo.sli == SLIKind.AVAILABILITY:
        return ok
    ttft = Q(ttft_ms__lte=slo.ttft_ms or endpoint.ttft_slo_ms)
    tpot = Q(tpot_ms__lte=slo.tpot_ms or endpoint.tpot_slo_ms) | Q(tpot_ms__isnull=True)
    if slo.sli == SLIKind.TTFT:
        return ok & ttft
    if slo.sli == SLIKind.TPOT:
        return ok & tpot
    return ok & Q(slo_met=True)


def slo_status(*, slo: SLO, now: datetime) -> SLOStatus:
    """One grouped query per SLO: totals and bad counts over every burn window and the whole period."""
    records = UsageRecord.objects.filter(endpoint_id=slo.endpoint_id).exclude(status__in=NOT_COUNTED)
    if slo.tenant_id:
        records = records.filter(tenant_id=slo.tenant_id)
    period = timedelta(days=slo.period_days)
    records = records.filter(finished_at__gte=now - max(period, BURN_WINDOWS["3d"]), finished_at__lte=now)
    good = good_filter(slo)
    aggregates = {}
    for name, span in [("period", period), *BURN_WINDOWS.items()]:
        since = Q(finished_at__gte=now - span)
        aggregates[f"t_{name}"] = Count("id", filter=since)
        aggregates[f"b_{name}"] = Count("id", filter=since & ~good)
    row = records.aggregate(**aggregates)
    budget = 1.0 - slo.objective
    burn = {}
    for name in BURN_WINDOWS:
        total = row[f"t_{name}"]
        burn[name] = (row[f"b_{name}"] / total / budget) if total else 0.0
    total, bad = row["t_period"], row["b_period"]
    remaining = 1.0 - ((bad / total) / budget if total else 0.0)
    firing = [
        f"{severity} {long_w}/{short_w} > {threshold:g}"
        for severity, long_w, short_w, threshold in BURN_RULES
        if burn[long_w] > threshold and burn[short_w] > threshold
    ]
    return SLOStatus(slo, total, bad, remaining, burn, firing)


def slo_statuses_for(*, endpoint: Endpoint, now: datetime, tenant: Tenant | None = None) -> list[SLOStatus]:
    slos = endpoint.slos.filter(enabled=True).select_related("endpoint", "tenant")
    if tenant is not None:
        slos = slos.filter(Q(tenant=tenant) | Q(tenant__isnull=True))
    return [slo_status(slo=slo, now=now) for slo in slos]


def alerts_visible(*, user, endpoints) -> list[Alert]:
    alerts = Alert.objects.filter(slo__endpoint__in=endpoints).select_related("slo", "slo__endpoint", "acknowledged_by")
    if not user.is_operator:
        alerts = alerts.filter(Q(slo__tenant_id=user.tenant_id) | Q(slo__tenant__isnull=True))
    return list(alerts.order_by("-started_at")[:200])


@dataclass
class CostRow:
    endpoint: Endpoint
    gpu_hours: float
    usd: float
    requests: int
    input_tokens: int
    output_tokens: int
    good_output_tokens: int
    used_mu: float
    capacity_mu: float

    @property
    def utilization(self) -> float | None:
        return self.used_mu / self.capacity_mu if self.capacity_mu else None

    @property
    def usd_per_million_good_tokens(self) -> float | None:
        return self.usd / self.good_output_tokens * 1e6 if self.good_output_tokens else None

    @property
    def good_tokens_per_usd(self) -> float | None:
        return self.good_output_tokens / self.usd if self.usd else None

    @property
    def idle_usd(self) -> float:
        util = self.utilization
        return self.usd * (1 - min(util, 1.0)) if util is not None else self.usd


def billed_replica_seconds(*, endpoint: Endpoint, start: datetime, end: datetime) -> float:
    """Seconds replicas spent in billed states (ready, draining) inside [start, end), from the transition log."""
    events = (
        ReplicaTransition.objects.filter(replica__endpoint=endpoint, at__lt=end)
        .order_by("replica_id", "at", "id")
        .values_list("replica_id", "to_state", "at")
    )
    total = 0.0
    current: dict[int, tuple[str, datetime]] = {}
    for replica_id, to_state, at in events:
        previous = current.get(replica_id)
        if previous and previous[0] in BILLED_STATES:
            total += _overlap(previous[1], at, start, end)
        current[replica_id] = (to_state, at)
    for state, since in current.values():
        if state in BILLED_STATES:
            total += _overlap(since, end, start, end)
    return total


def _overlap(a: datetime, b: datetime, start: datetime, end: datetime) -> float:
    return max(0.0, (min(b, end) - max(a, start)).total_seconds())


def cost_rows(*, endpoints, start: datetime, end: datetime) -> list[CostRow]:
    from console.selectors import replica_mu_per_min

    rows = []
    for endpoint in endpoints:
        seconds = billed_replica_seconds(endpoint=endpoint, start=start, end=end)
        hardware = endpoint.hardware_profile
        gpu_hours = seconds / 3600 * hardware.gpus_per_replica
        usage = UsageRecord.objects.filter(endpoint=endpoint, finished_at__gte=start, finished_at__lt=end).aggregate(
            n_requests=Count("id"),
            n_input=Sum("input_tokens"),
            n_output=Sum("output_tokens"),
            n_good=Sum("output_tokens", filter=Q(slo_met=True, status=UsageStatus.OK)),
            total_mu=Sum("mu"),
        )
        rows.append(
            CostRow(
                endpoint=endpoint,
                gpu_hours=gpu_hours,
                usd=gpu_hours * hardware.usd_per_gpu_hour,
                requests=usage["n_requests"] or 0,
                input_tokens=usage["n_input"] or 0,
                output_tokens=usage["n_output"] or 0,
                good_output_tokens=usage["n_good"] or 0,
                used_mu=usage["total_mu"] or 0.0,
                capacity_mu=seconds / 60 * replica_mu_per_min(endpoint),
            )
        )
    return rows


COST_CSV_HEADER = [
    "endpoint", "start", "end", "gpu_hours", "usd", "requests", "input_tokens", "output_tokens",
    "good_output_tokens", "good_tokens_per_usd", "usd_per_1m_good_tokens", "utilization", "idle_usd",
]


def cost_csv_rows(rows: list[CostRow], *, start: datetime, end: datetime) -> list[list]:
    def fmt(value, digits=4):
        return "" if value is None else round(value, digits)

    return [
        [
            r.endpoint.name, start.isoformat(), end.isoformat(), fmt(r.gpu_hours), fmt(r.usd), r.requests,
            r.input_tokens, r.output_tokens, r.good_output_tokens, fmt(r.good_tokens_per_usd, 1),
            fmt(r.usd_per_million_good_tokens), fmt(r.utilization), fmt(r.idle_usd),
        ]
        for r in rows
    ]


@dataclass
class StatementLine:
    endpoint_name: str
    reserved_mu_per_min: float
    reserved_mu: float
    used_mu: float
    overage_mu: float
    requests: int
    output_tokens: int


def tenant_statement(*, tenant: Tenant, start: datetime, end: datetime) -> list[StatementLine]:
    """Per endpoint: MU reserved over the period (MU/min × minutes), MU used, and the overage above it."""
    minutes = (end - start).total_seconds() / 60
    reservations = {r.endpoint_id: r for r in tenant.reservations.select_related("endpoint")}
    usage = (
        UsageRecord.objects.filter(tenant=tenant, finished_at__gte=start, finished_at__lt=end)
        .values("endpoint_id", name=F("endpoint__name"))
        .annotate(used=Sum("mu"), n=Count("id"), out=Sum("output_tokens"))
    )
    lines: dict[int | None, StatementLine] = {}
    for endpoint_id, reservation in reservations.items():
        reserved = reservation.mu_per_min * minutes
        lines[endpoint_id] = StatementLine(reservation.endpoint.name, reservation.mu_per_min, reserved, 0.0, 0.0, 0, 0)
    for row in usage:
        line = lines.setdefault(
            row["endpoint_id"], StatementLine(row["name"] or "(deleted endpoint)", 0.0, 0.0, 0.0, 0.0, 0, 0)
        )
        line.used_mu += row["used"] or 0.0
        line.requests += row["n"]
        line.output_tokens += row["out"] or 0
    for line in lines.values():
        line.overage_mu = max(0.0, line.used_mu - line.reserved_mu)
    return sorted(lines.values(), key=lambda line: line.endpoint_name)


def tenant_usage_by_hour(*, tenant: Tenant, start: datetime, end: datetime) -> list[tuple[datetime, float, int]]:
    from django.db.models.functions import TruncHour

    rows = (
        UsageRecord.objects.filter(tenant=tenant, finished_at__gte=start, finished_at__lt=end)
        .annotate(hour=TruncHour("finished_at"))
        .values("hour")
        .annotate(used=Sum("mu"), n=Count("id"))
        .order_by("hour")
    )
    return [(row["hour"], row["used"] or 0.0, row["n"]) for row in rows]
