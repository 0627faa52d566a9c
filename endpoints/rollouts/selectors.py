"""Reads for rollouts: what versions and rollouts a principal sees, the proxy's per-version traffic weights and the
per-version request outcomes."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, QuerySet

from billing.models import UsageRecord, UsageStatus
from capacity.autoscaling import store
from endpoints.models import ROLLOUT_ACTIVE_STATES, Endpoint, EndpointVersion, Replica, Rollout
from endpoints.rollouts.keys import FAILED_ATTEMPTS_KEY
from endpoints.rollouts.machine import VersionStats
from endpoints.selectors import endpoints_owned_by

log = logging.getLogger(__name__)


def versions_visible_to(principal) -> QuerySet[EndpointVersion]:
    """Versions of the endpoints the principal owns (operators: all), each annotated ``is_current``."""
    return (
        EndpointVersion.objects.filter(endpoint__in=endpoints_owned_by(principal).values("pk"))
        .select_related("endpoint", "model_profile", "hardware_profile", "created_by")
        .annotate(is_current=ExpressionWrapper(Q(endpoint__current_version_id=F("id")), output_field=BooleanField()))
    )


def rollouts_visible_to(principal) -> QuerySet[Rollout]:
    """Rollouts of the endpoints the principal owns (operators: all); a tenant never sees a shared endpoint's."""
    return Rollout.objects.filter(endpoint__in=endpoints_owned_by(principal).values("pk")).select_related(
        "endpoint", "from_version", "to_version", "created_by"
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

    def add(version_id, requests: int, errors: int, slo_misses: int = 0) -> None:
        prev = out.get(version_id, VersionStats())
        out[version_id] = VersionStats(
            requests=prev.requests + requests, errors=prev.errors + errors, slo_misses=prev.slo_misses + slo_misses
        )

    for row in rows:
        add(row["replica__version_id"] or current, row["requests"], row["errors"], row["slo_misses"])
    # Attempts that failed before the first byte are in no usage record under their replica (the proxy retried
    # them elsewhere, or had nowhere to retry): each is one more request and one more error of that version.
    failed = failed_attempts(endpoint_id=endpoint.pk, since=since)
    if failed:
        versions = dict(Replica.objects.filter(pk__in=list(failed)).values_list("id", "version_id"))
        for replica_id, n in failed.items():
            if replica_id in versions:
                add(versions[replica_id] or current, n, n)
    return out


def failed_attempts(*, endpoint_id: int, since: datetime) -> dict[int, int]:
    """Upstream attempts that failed before the first byte since ``since``, per replica id (reported by the
    proxies in Redis, ``endpoints.rollouts.keys``); empty when Redis cannot be read."""
    key = FAILED_ATTEMPTS_KEY.format(endpoint_id=endpoint_id)
    try:
        members = store.client().zrangebyscore(key, since.timestamp(), "+inf")
    except Exception as exc:  # noqa: BLE001 - the comparison then rests on the usage records alone
        log.warning("failed attempts of endpoint %s unreadable: %s", endpoint_id, exc)
        return {}
    out: dict[int, int] = {}
    for member in members:
        replica, _, _ = (member.decode() if isinstance(member, bytes) else member).partition(":")
        if replica.isdigit():
            out[int(replica)] = out.get(int(replica), 0) + 1
    return out
