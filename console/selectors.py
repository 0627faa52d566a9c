"""Reads behind the fleet and endpoint pages: replicas by state, capacity have/sold/used, per-minute series.

Charts aggregate in the database (one grouped query per chart window), never row by row in Python, except
on the embedded SQLite default, which has no percentile function and only holds laptop-sized data.
"""
from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Aggregate, Count, FloatField, Q, Sum
from django.db.models.functions import TruncMinute

from billing.models import UsageRecord, UsageStatus
from capacity.models import AutoscalerDecision
from endpoints.models import Endpoint, Replica, ReplicaState, ReplicaTransition

logger = logging.getLogger(__name__)

DEMAND_KEY = "infercap:demand:{endpoint_id}"
PRIORITY_CLASSES = ("critical", "standard", "sheddable")


class Percentile95(Aggregate):
    """PostgreSQL's ordered-set aggregate; NULLs are ignored like in every other aggregate."""

    function = "percentile_cont"
    template = "%(function)s(0.95) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def replica_mu_per_min(endpoint: Endpoint) -> float:
    """Capacity C of one replica: the pinned benchmark's calibration, else the model profile's default."""
    bench = endpoint.pinned_benchmark
    if bench is not None and bench.mu_per_min:
        return float(bench.mu_per_min)
    return float(endpoint.model_profile.mu_per_min)


@dataclass
class Ledger:
    have_mu_per_min: float
    sold_mu_per_min: float
    used_mu_per_min: float

    @property
    def sold_ratio(self) -> float:
        return self.sold_mu_per_min / self.have_mu_per_min if self.have_mu_per_min else 0.0


def capacity_ledger(*, endpoint: Endpoint, ready_replicas: int, now: datetime, window_min: int = 5) -> Ledger:
    """Have = ready replicas × C; sold = reservations; used = MU consumed per minute over the last minutes."""
    sold = endpoint.reservations.aggregate(total=Sum("mu_per_min"))["total"] or 0.0
    used = (
        UsageRecord.objects.filter(endpoint=endpoint, finished_at__gte=now - timedelta(minutes=window_min))
        .aggregate(total=Sum("mu"))["total"]
        or 0.0
    )
    return Ledger(ready_replicas * replica_mu_per_min(endpoint), float(sold), float(used) / window_min)


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
    from console.live import redis_client

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
            if isinstance(n, int | float):
                depth[cls] = depth.get(cls, 0) + int(n)
    return depth


@dataclass
class FleetRow:
    endpoint: Endpoint
    states: Counter
    ledger: Ledger
    slo_statuses: list = field(default_factory=list)

    @property
    def worst_budget(self):
        return min((s.budget_remaining for s in self.slo_statuses), default=None)

    @property
    def max_burn_1h(self):
        return max((s.burn.get("1h", 0.0) for s in self.slo_statuses), default=None)


def fleet_rows(*, endpoints, now: datetime) -> list[FleetRow]:
    from console.reports import slo_statuses_for

    endpoints = list(endpoints)
    counts = replica_state_counts([e.pk for e in endpoints])
    rows = []
    for endpoint in endpoints:
        states = counts.get(endpoint.pk, Counter())
        ledger = capacity_ledger(endpoint=endpoint, ready_replicas=states.get(ReplicaState.READY, 0), now=now)
        rows.append(FleetRow(endpoint, states, ledger, slo_statuses_for(endpoint=endpoint, now=now)))
    return rows


@dataclass
class EndpointSeries:
    minutes: list[float]  # epoch seconds of each bucket
    requests_per_s: list[float | None]
    ttft_p95_ms: list[float | None]
    tpot_p95_ms: list[float | None]
    mu_per_min: list[float | None]
    ready_replicas: list[float]
    errors_per_s: list[float | None]


def endpoint_series(*, endpoint: Endpoint, now: datetime, minutes: int = 60) -> EndpointSeries:
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    buckets = [start + timedelta(minutes=i) for i in range(minutes)]
    rows = _usage_by_minute(endpoint=endpoint, start=start, end=end)
    by_minute = {row["minute"]: row for row in rows}

    def pick(key: str, scale: float = 1.0) -> list[float | None]:
        out: list[float | None] = []
        for b in buckets:
            value = by_minute.get(b, {}).get(key)
            out.append(None if value is None else value * scale)
        return out

    requests = [(by_minute.get(b, {}).get("n") or 0) / 60 for b in buckets]
    errors = [(by_minute.get(b, {}).get("errors") or 0) / 60 for b in buckets]
    return EndpointSeries(
        minutes=[b.timestamp() for b in buckets],
        requests_per_s=requests,
        ttft_p95_ms=pick("ttft_p95"),
        tpot_p95_ms=pick("tpot_p95"),
        mu_per_min=[v or 0.0 for v in pick("mu")],
        ready_replicas=ready_replica_series(endpoint=endpoint, buckets=buckets),
        errors_per_s=errors,
    )


def _usage_by_minute(*, endpoint: Endpoint, start: datetime, end: datetime) -> list[dict]:
    records = UsageRecord.objects.filter(endpoint=endpoint, finished_at__gte=start, finished_at__lt=end)
    error_q = Q(status__in=[UsageStatus.UPSTREAM_ERROR, UsageStatus.TIMEOUT, UsageStatus.SHED])
    grouped = records.annotate(minute=TruncMinute("finished_at")).values("minute")
    if connection.vendor == "postgresql":
        return list(
            grouped.annotate(
                n=Count("id"),
                errors=Count("id", filter=error_q),
                mu=Sum("mu"),
                ttft_p95=Percentile95("ttft_ms"),
                tpot_p95=Percentile95("tpot_ms"),
            ).order_by("minute")
        )
    per_minute: dict[datetime, dict] = {}
    for rec in records.only("finished_at", "status", "mu", "ttft_ms", "tpot_ms"):
        minute = rec.finished_at.replace(second=0, microsecond=0)
        row = per_minute.setdefault(minute, {"minute": minute, "n": 0, "errors": 0, "mu": 0.0, "t": [], "p": []})
        row["n"] += 1
        row["errors"] += rec.status in (UsageStatus.UPSTREAM_ERROR, UsageStatus.TIMEOUT, UsageStatus.SHED)
        row["mu"] += rec.mu
        if rec.ttft_ms is not None:
            row["t"].append(rec.ttft_ms)
        if rec.tpot_ms is not None:
            row["p"].append(rec.tpot_ms)
    for row in per_minute.values():
        row["ttft_p95"], row["tpot_p95"] = _p95(row.pop("t")), _p95(row.pop("p"))
    return sorted(per_minute.values(), key=lambda r: r["minute"])


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    rank = 0.95 * (len(values) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def ready_replica_series(*, endpoint: Endpoint, buckets: list[datetime]) -> list[float]:
    """Ready replicas at the end of each minute, replayed from the transition log."""
    if not buckets:
        return []
    end = buckets[-1] + timedelta(minutes=1)
    transitions = (
        ReplicaTransition.objects.filter(replica__endpoint=endpoint, at__lt=end)
        .exclude(replica__state=ReplicaState.STOPPED, replica__state_changed_at__lt=buckets[0])
        .order_by("at", "id")
        .values_list("replica_id", "to_state", "at")
    )
    state: dict[int, str] = {}
    out: list[float] = []
    events = list(transitions)
    i = 0
    for bucket in buckets:
        bucket_end = bucket + timedelta(minutes=1)
        while i < len(events) and events[i][2] < bucket_end:
            state[events[i][0]] = events[i][1]
            i += 1
        out.append(float(sum(1 for s in state.values() if s == ReplicaState.READY)))
    return out


def recent_decisions(*, endpoint: Endpoint, since: datetime, limit: int = 50) -> list[AutoscalerDecision]:
    return list(endpoint.autoscaler_decisions.filter(at__gte=since).order_by("-at")[:limit])


def endpoint_replicas(endpoint: Endpoint, *, include_stopped: bool = False) -> list[Replica]:
    replicas = endpoint.replicas.all().order_by("name")
    if not include_stopped:
        replicas = replicas.exclude(state=ReplicaState.STOPPED)
    return list(replicas)
