"""Reads behind the console pages, built on the apps' own selectors: the capacity ledger (capacity.ledger), SLO
budgets (billing.selectors), visibility (endpoints.selectors) and the per-minute usage rollups (billing.UsageMinute).

Charts read the rollups, never raw usage rows, so a page costs a handful of grouped queries whatever the traffic.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncHour

from billing.models import Degradation, UsageMinute, UsageRecord, UsageStatus
from billing.selectors import SLOBudget, slo_budgets
from billing.slo import TPOT_BOUNDS_MS, TTFT_BOUNDS_MS
from capacity.autoscaling.actuators.free_gpus import free_gpus
from capacity.ledger import EndpointLedger, TenantLedgerRow, capacity_ledger
from capacity.models import AutoscalerDecision, ScalePin
from console.live import redis_client
from endpoints.models import Endpoint, Replica, ReplicaState, ReplicaTransition
from endpoints.selectors import replica_placement_redacted, replica_placement_visible
from tenants.models import CapacityReservation, Tenant

logger = logging.getLogger(__name__)

DEMAND_KEY = "infercap:demand:{endpoint_id}"
PRIORITY_CLASSES = ("critical", "standard", "sheddable")


def replica_state_counts(endpoint_ids: list[int]) -> dict[int, Counter]:
    counts: dict[int, Counter] = defaultdict(Counter)
    rows = (
        Replica.objects.filter(endpoint_id__in=endpoint_ids)
        .exclude(state=ReplicaState.STOPPED)
        .values("endpoint_id", "state")
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts[row["endpoint_id"]][row["state"]] = row["n"]
    return counts


def queue_depth(endpoint_id: int) -> dict[str, int]:
    """Queued requests per priority class, summed over proxy processes (from the proxy's Redis demand hash)."""
    depth = dict.fromkeys(PRIORITY_CLASSES, 0)
    client = redis_client()
    if client is None:
        return depth
    try:
        fields = client.hgetall(DEMAND_KEY.format(endpoint_id=endpoint_id))
    except Exception:  # Redis down: the console still renders, with empty queues
        logger.warning("demand hash unreadable for endpoint %s", endpoint_id, exc_info=True)
        return depth
    for raw in fields.values():
        try:
            queued = json.loads(raw).get("queued_by_class") or {}
        except (ValueError, AttributeError):
            continue
        for cls, n in queued.items():
            if isinstance(n, int | float) and not isinstance(n, bool):
                depth[cls] = depth.get(cls, 0) + int(n)
    return depth


@dataclass
class FleetRow:
    endpoint: Endpoint
    states: Counter
    ledger: EndpointLedger
    budgets: list[SLOBudget] = field(default_factory=list)

    @property
    def worst_budget(self) -> float | None:
        return min((b.budget_remaining for b in self.budgets if b.budget_remaining is not None), default=None)

    @property
    def max_burn_1h(self) -> float | None:
        return max((b.burn_rates.get("1h", 0.0) for b in self.budgets if b.evaluated_at), default=None)

    @property
    def health(self) -> str:
        order = ["page", "ticket", "unknown", "ok"]
        return min((b.health for b in self.budgets), key=order.index, default="none")


def budgets_by_endpoint(user) -> dict[str, list[SLOBudget]]:
    grouped: dict[str, list[SLOBudget]] = defaultdict(list)
    for budget in slo_budgets(user):
        grouped[budget.endpoint].append(budget)
    return grouped


def fleet_rows(*, user, endpoints, now: datetime) -> list[FleetRow]:
    endpoints = list(endpoints)
    ids = [e.pk for e in endpoints]
    ledger = {
        row.endpoint_id: row
        for row in capacity_ledger(
            now=now, endpoints=Endpoint.objects.filter(pk__in=ids), free_gpus=free_gpus()
        ).endpoints
    }
    counts = replica_state_counts(ids)
    budgets = budgets_by_endpoint(user)
    return [
        FleetRow(e, counts.get(e.pk, Counter()), ledger[e.pk], budgets.get(e.name, []))
        for e in endpoints
        if e.pk in ledger
    ]


def endpoint_ledger(*, endpoint: Endpoint, now: datetime) -> EndpointLedger:
    ledger = capacity_ledger(now=now, endpoints=Endpoint.objects.filter(pk=endpoint.pk), free_gpus=free_gpus())
    return ledger.endpoints[0]


def tenant_endpoint_ledger(*, endpoint: Endpoint, tenant_id: int, now: datetime) -> TenantLedgerRow | None:
    """The tenant's own row of the endpoint's ledger (reserved, used, throttled, shed): the API's tenant view."""
    rows = capacity_ledger(now=now, endpoints=Endpoint.objects.filter(pk=endpoint.pk), tenant_id=tenant_id).tenants
    return next((row for row in rows if row.tenant_id == tenant_id), None)


def shows_whole_endpoint(*, user, endpoint: Endpoint) -> bool:
    """Operators and the owning tenant see an endpoint's totals; a tenant that only reserves capacity on a shared
    endpoint sees its own figures (other tenants' sales, use, sheds and queues are theirs)."""
    return bool(user.is_operator or (endpoint.owner_tenant_id and endpoint.owner_tenant_id == user.tenant_id))


def bucket_quantile(q: float, bounds: tuple[int, ...], cumulative: list[float], total: float) -> float | None:
    """Quantile from cumulative ``≤ bound`` counts, interpolating linearly inside the bucket (as Prometheus'
    histogram_quantile does). Beyond the last bound it answers the last bound: the rollup knows no more."""
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            width = count - lower_count
            fraction = (rank - lower_count) / width if width > 0 else 1.0
            return lower_bound + (bound - lower_bound) * fraction
        lower_bound, lower_count = float(bound), count
    return float(bounds[-1])


@dataclass
class EndpointSeries:
    minutes: list[float]  # epoch seconds of each bucket
    requests_per_s: list[float | None]  # None: the minute still running (not drawn)
    errors_per_s: list[float | None]
    ttft_p95_ms: list[float | None]
    tpot_p95_ms: list[float | None]
    mu_per_min: list[float | None]
    ready_replicas: list[float]


TTFT_FIELDS = [f"ttft_le_{b}" for b in TTFT_BOUNDS_MS]
TPOT_FIELDS = [f"tpot_le_{b}" for b in TPOT_BOUNDS_MS]


def endpoint_series(
    *, endpoint: Endpoint, now: datetime, minutes: int = 60, tenant_id: int | None = None
) -> EndpointSeries:
    """Per-minute series over the last ``minutes`` from the usage rollups (summed over tenants, or only
    ``tenant_id``'s rows: a tenant on a shared endpoint sees its own traffic, not its neighbours')."""
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    buckets = [start + timedelta(minutes=i) for i in range(minutes)]
    sums = ["requests", "ok", "upstream_errors", "timeouts", "shed", "mu", *TTFT_FIELDS, *TPOT_FIELDS]
    usage = UsageMinute.objects.filter(endpoint=endpoint, start__gte=start, start__lt=end)
    if tenant_id is not None:
        usage = usage.filter(tenant_id=tenant_id)
    rows = usage.values("start").annotate(**{f"s_{name}": Sum(name) for name in sums}).order_by("start")
    by_minute = {row["start"]: row for row in rows}
    series = EndpointSeries([b.timestamp() for b in buckets], [], [], [], [], [], [])
    for bucket in buckets:
        row = by_minute.get(bucket)
        if bucket + timedelta(minutes=1) > now:
            # The minute still running: its rollup holds part of a minute, which would draw as a drop. Not drawn.
            for values in (series.requests_per_s, series.errors_per_s, series.mu_per_min):
                values.append(None)
            series.ttft_p95_ms.append(None)
            series.tpot_p95_ms.append(None)
            continue
        if row is None:
            series.requests_per_s.append(0.0)
            series.errors_per_s.append(0.0)
            series.mu_per_min.append(0.0)
            series.ttft_p95_ms.append(None)
            series.tpot_p95_ms.append(None)
            continue
        series.requests_per_s.append(row["s_requests"] / 60)
        series.errors_per_s.append((row["s_upstream_errors"] + row["s_timeouts"] + row["s_shed"]) / 60)
        series.mu_per_min.append(float(row["s_mu"]))
        ok = row["s_ok"]
        series.ttft_p95_ms.append(bucket_quantile(0.95, TTFT_BOUNDS_MS, [row[f"s_{f}"] for f in TTFT_FIELDS], ok))
        series.tpot_p95_ms.append(bucket_quantile(0.95, TPOT_BOUNDS_MS, [row[f"s_{f}"] for f in TPOT_FIELDS], ok))
    series.ready_replicas = ready_replica_series(endpoint=endpoint, buckets=buckets)
    return series


def ready_replica_series(*, endpoint: Endpoint, buckets: list[datetime]) -> list[float]:
    """Ready replicas at the end of each minute, replayed from the transition log."""
    if not buckets:
        return []
    end = buckets[-1] + timedelta(minutes=1)
    events = list(
        ReplicaTransition.objects.filter(replica__endpoint=endpoint, at__lt=end)
        .exclude(replica__state=ReplicaState.STOPPED, replica__state_changed_at__lt=buckets[0])
        .order_by("at", "id")
        .values_list("replica_id", "to_state", "at")
    )
    state: dict[int, str] = {}
    out: list[float] = []
    i = 0
    for bucket in buckets:
        bucket_end = bucket + timedelta(minutes=1)
        while i < len(events) and events[i][2] < bucket_end:
            state[events[i][0]] = events[i][1]
            i += 1
        out.append(float(sum(1 for s in state.values() if s == ReplicaState.READY)))
    return out


def recent_decisions(*, endpoint: Endpoint, since: datetime, limit: int = 50) -> list[AutoscalerDecision]:
    """Decisions that changed something: the autoscaler stores one every tick (5 s), mostly "hold". An operator's
    scale, a pin's release and its expiry are shown even when the count stayed."""
    pin_steps = Q(tick__startswith="manual-") | Q(tick__startswith="unpin-") | Q(inputs__has_key="pin_expired")
    changes = endpoint.autoscaler_decisions.filter(at__gte=since).filter(~Q(desired=F("current")) | pin_steps)
    return list(changes.order_by("-at")[:limit])


@dataclass
class PinShown:
    """An operator's pin on the endpoint page, with what the autoscaler would do without it (its last tick)."""

    pin: ScalePin
    policy_desired: int | None


def scale_pin_shown(*, endpoint: Endpoint, now: datetime) -> PinShown | None:
    pin = ScalePin.objects.filter(endpoint=endpoint, until__gt=now).first()
    if pin is None:
        return None
    last = (
        endpoint.autoscaler_decisions.filter(axis=AutoscalerDecision.Axis.HORIZONTAL, inputs__has_key="policy_desired")
        .order_by("-at")
        .values_list("inputs", flat=True)
        .first()
    )
    return PinShown(pin=pin, policy_desired=(last or {}).get("policy_desired"))


def endpoint_replicas(endpoint: Endpoint, *, viewer, include_stopped: bool = False) -> list[Replica]:
    """The endpoint's replicas as ``viewer`` may see them: where it may not see placement (the API's rule,
    ``replica_placement_visible``), each row carries the API's neutral name and no actuator, pod, pid or failure
    text, in id order (an order by the hidden names would still rank them). The rows are for display, never to save.
    """
    replicas = endpoint.replicas.all().order_by("name")
    if not include_stopped:
        replicas = replicas.exclude(state=ReplicaState.STOPPED)
    rows = list(replicas)  # the related manager hands each row this endpoint: no query per row
    hidden = [replica for replica in rows if not replica_placement_visible(replica=replica, principal=viewer)]
    for replica in hidden:
        for name, value in replica_placement_redacted(replica).items():
            setattr(replica, name, value)
    return sorted(rows, key=lambda replica: replica.pk) if hidden else rows


def tenant_usage_by_hour(*, tenant: Tenant, start: datetime, end: datetime) -> list[tuple[datetime, float, int]]:
    rows = (
        UsageMinute.objects.filter(tenant=tenant, start__gte=start, start__lt=end)
        .annotate(hour=TruncHour("start"))
        .values("hour")
        .annotate(used=Sum("mu"), n=Sum("requests"))
        .order_by("hour")
    )
    return [(row["hour"], float(row["used"] or 0.0), int(row["n"] or 0)) for row in rows]


@dataclass
class BrownoutRow:
    """One tenant on one endpoint it called, over a window: what overload did to its requests."""

    tenant: str
    endpoint: str
    reserved_mu_per_min: float | None  # None: best effort
    requests: int
    degraded: int
    fallback: int
    shed: int
    used_mu_per_min: float
    over_reservation_mu_per_min: float
    shed_share: float = 0.0  # of all the window's sheds
    excess_share: float = 0.0  # of all the window's use over reservations


def brownout_rows(*, since: datetime, now: datetime) -> list[BrownoutRow]:
    """Per tenant and endpoint named, from the usage records (each request's ``degradation`` and status): how
    often it was served shorter, by the fallback, or shed, against its reservation there. One grouped query,
    for the console (the proxy counts the same in process: ``infercap_proxy_brownout``)."""
    minutes = max((now - since).total_seconds() / 60.0, 1e-9)
    grouped = (
        UsageRecord.objects.filter(finished_at__gte=since, finished_at__lt=now)
        .values("tenant_id", "tenant__name", "requested_endpoint_id")
        .annotate(
            n=Count("id"),
            degraded=Count("id", filter=Q(degradation=Degradation.DEGRADED)),
            fallback=Count("id", filter=Q(degradation=Degradation.FALLBACK)),
            shed=Count("id", filter=Q(status=UsageStatus.SHED)),
            mu=Sum("mu"),
        )
        .order_by()
    )
    rows = list(grouped)
    names = dict(Endpoint.objects.filter(pk__in={r["requested_endpoint_id"] for r in rows}).values_list("pk", "name"))
    # A tenant's base-model and adapter reservations on an endpoint together: its usage there is both.
    reserved: dict[tuple[int, int], float] = {}
    for r in CapacityReservation.objects.filter(tenant_id__in={r["tenant_id"] for r in rows}):
        reserved[(r.tenant_id, r.endpoint_id)] = reserved.get((r.tenant_id, r.endpoint_id), 0.0) + r.mu_per_min
    out = []
    for r in rows:
        mu_per_min = reserved.get((r["tenant_id"], r["requested_endpoint_id"]))
        used = (r["mu"] or 0.0) / minutes
        out.append(
            BrownoutRow(
                tenant=r["tenant__name"],
                endpoint=names.get(r["requested_endpoint_id"], "(deleted)"),
                reserved_mu_per_min=mu_per_min,
                requests=r["n"],
                degraded=r["degraded"],
                fallback=r["fallback"],
                shed=r["shed"],
                used_mu_per_min=used,
                over_reservation_mu_per_min=max(0.0, used - (mu_per_min or 0.0)),
            )
        )
    total_shed = sum(r.shed for r in out)
    total_over = sum(r.over_reservation_mu_per_min for r in out)
    for row in out:
        row.shed_share = row.shed / total_shed if total_shed else 0.0
        row.excess_share = row.over_reservation_mu_per_min / total_over if total_over else 0.0
    return sorted(out, key=lambda row: (-row.shed - row.fallback - row.degraded, row.tenant, row.endpoint))
