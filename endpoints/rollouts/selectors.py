"""Reads for rollouts: the proxy's per-version traffic weights and the per-version request outcomes."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Q

from endpoints.models import ROLLOUT_ACTIVE_STATES, Endpoint, Rollout
from endpoints.rollouts.machine import VersionStats


def active_rollout(endpoint: Endpoint | int) -> Rollout | None:
    endpoint_id = endpoint if isinstance(endpoint, int) else endpoint.pk
    return (
        Rollout.objects.filter(endpoint_id=endpoint_id, state__in=ROLLOUT_ACTIVE_STATES)
        .select_related("from_version", "to_version")
        .first()
    )


def traffic_weights_by_endpoint() -> dict[int, tuple[tuple[int, int], ...]]:
    """(version id, percent) pairs per endpoint with an active rollout, for the proxy snapshot (one query)."""
    out = {}
    for rollout in Rollout.objects.filter(state__in=ROLLOUT_ACTIVE_STATES).only(
        "endpoint_id", "from_version_id", "to_version_id", "traffic_percent"
    ):
        out[rollout.endpoint_id] = tuple(sorted(rollout.traffic_weights().items()))
    return out


def version_stats(*, endpoint: Endpoint, since: datetime) -> dict[int, VersionStats]:
    """Request outcomes per version since ``since``, from the proxies' usage records joined through the replica.

    Errors are upstream errors and timeouts (what the replica caused; sheds and client cancels are not its fault);
    an SLO miss is an answered request past the endpoint's TTFT or TPOT target (the proxy's ``slo_met``).
    """
    from billing.models import UsageRecord, UsageStatus

    errors = Q(status__in=[UsageStatus.UPSTREAM_ERROR, UsageStatus.TIMEOUT])
    rows = (
        UsageRecord.objects.filter(endpoint=endpoint, finished_at__gte=since, replica__isnull=False)
        .exclude(status__in=[UsageStatus.SHED, UsageStatus.RATE_LIMITED, UsageStatus.CLIENT_CANCELLED])
        .order_by()
        .values("replica__version_id")
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=errors),
            slo_misses=Count("id", filter=Q(status=UsageStatus.OK, slo_met=False)),
        )
    )
    current = endpoint.current_version_id
    out: dict[int, VersionStats] = {}
    for row in rows:
        version_id = row["replica__version_id"] or current
        prev = out.get(version_id, VersionStats())
        out[version_id] = VersionStats(
            requests=prev.requests + row["requests"],
            errors=prev.errors + row["errors"],
            slo_misses=prev.slo_misses + row["slo_misses"],
        )
    return out
