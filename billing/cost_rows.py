"""Selectors for cost arithmetic: replica-seconds per (endpoint, hardware profile), the profiles, and usage records
summed by the profile of the replica that served them, as the plain rows of ``billing.cost_split``.

A replica runs on its version's hardware profile; a replica without a version (hand-registered) counts as the
endpoint's current one, as everywhere else (``Replica.version``).
"""

from collections import defaultdict
from datetime import datetime

from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce

from billing.cost_split import Profile, ProfileSeconds, ServedUsage
from billing.models import UsageRecord, UsageStatus
from capacity.models import HardwareProfile
from endpoints.models import BILLED_STATES, Replica, ReplicaState, ReplicaTransition


def state_seconds(
    *,
    state_at_start: str | None,
    transitions,
    start: datetime,
    end: datetime,
    states,
) -> float:
    """Seconds of [start, end) a replica spent in ``states``, given its state at ``start`` and its later transitions."""
    states = frozenset(states)
    total = 0.0
    cursor, state = start, state_at_start
    for at, to_state in sorted(transitions):
        at = min(max(at, start), end)
        if state in states:
            total += (at - cursor).total_seconds()
        cursor, state = at, to_state
    if state in states:
        total += (end - cursor).total_seconds()
    return total


def replica_profile_seconds(*, endpoint_ids: list[int], start: datetime, end: datetime) -> list[ProfileSeconds]:
    """Per (endpoint, hardware profile): billed replica-seconds (ready or draining) and ready ones over [start, end)."""
    last_before = ReplicaTransition.objects.filter(replica=OuterRef("pk"), at__lt=start).order_by("-at", "-id")
    replicas = list(
        Replica.objects.filter(endpoint_id__in=endpoint_ids).annotate(
            state_at_start=Subquery(last_before.values("to_state")[:1]),
            transitions_before=Subquery(last_before.values("id")[:1]),
            # A spot replica runs on its endpoint's spot pool (Replica.hardware_profile), others on their version's.
            profile_id=Coalesce(
                F("hardware_profile_id"), F("version__hardware_profile_id"), F("endpoint__hardware_profile_id")
            ),
        )
    )
    in_range: dict[int, list[tuple[datetime, str, str]]] = defaultdict(list)
    for t in ReplicaTransition.objects.filter(
        replica__endpoint_id__in=endpoint_ids, at__gte=start, at__lt=end
    ).order_by("at", "id"):
        in_range[t.replica_id].append((t.at, t.from_state, t.to_state))
    totals: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for replica in replicas:
        moves = in_range.get(replica.pk, [])
        if replica.transitions_before is not None:
            initial = replica.state_at_start
        elif moves:
            initial = moves[0][1]
        elif replica.state_changed_at <= start:
            # A replica never moved through the state machine (e.g. created directly in a state): trust its row.
            initial = replica.state
        else:
            initial, moves = None, [(replica.state_changed_at, "", replica.state)]
        steps = [(at, to_state) for at, _, to_state in moves]
        key = (replica.endpoint_id, replica.profile_id)
        totals[key][0] += state_seconds(
            state_at_start=initial, transitions=steps, start=start, end=end, states=BILLED_STATES
        )
        totals[key][1] += state_seconds(
            state_at_start=initial, transitions=steps, start=start, end=end, states={ReplicaState.READY}
        )
    return [
        ProfileSeconds(endpoint_id=e, profile_id=p, billed_s=billed, ready_s=ready)
        for (e, p), (billed, ready) in sorted(totals.items())
    ]


def profiles_by_id(ids) -> dict[int, Profile]:
    return {
        h.pk: Profile(
            profile_id=h.pk,
            name=h.name,
            capacity_type=h.capacity_type,
            gpus_per_replica=h.gpus_per_replica,
            usd_per_gpu_hour=h.usd_per_gpu_hour,
            gpu_share=h.gpu_share(),
        )
        for h in HardwareProfile.objects.filter(pk__in=set(ids))
    }


def served_usage(
    *, start: datetime, end: datetime, endpoint_ids: list[int] | None = None, tenant_ids: list[int] | None = None
) -> list[ServedUsage]:
    """Usage records finished in [start, end) that name their replica, summed per (endpoint, tenant, the replica's
    hardware profile) with the rollups' definitions (``billing.rollups``: good = ok and slo_met). One grouped query;
    raw records are kept ``USAGE_RETENTION_DAYS``, so older periods find none (the split then uses GPU-hours)."""
    records = UsageRecord.objects.filter(finished_at__gte=start, finished_at__lt=end, replica__isnull=False)
    if endpoint_ids is not None:
        records = records.filter(endpoint_id__in=endpoint_ids)
    if tenant_ids is not None:
        records = records.filter(tenant_id__in=tenant_ids)
    good = Q(status=UsageStatus.OK, slo_met=True)
    rows = (
        records.annotate(
            profile_id=Coalesce(
                F("replica__hardware_profile_id"),
                F("replica__version__hardware_profile_id"),
                F("replica__endpoint__hardware_profile_id"),
            )
        )
        .values("endpoint_id", "tenant_id", "profile_id")
        .annotate(
            n_requests=Count("id"),
            n_good=Count("id", filter=good),
            sum_output_tokens=Sum("output_tokens"),
            sum_good_output_tokens=Sum("output_tokens", filter=good),
            sum_mu=Sum("mu"),
        )
        .order_by()
    )
    return [
        ServedUsage(
            endpoint_id=row["endpoint_id"],
            tenant_id=row["tenant_id"],
            profile_id=row["profile_id"],
            sums={
                "requests": row["n_requests"],
                "good": row["n_good"],
                "output_tokens": int(row["sum_output_tokens"] or 0),
                "good_output_tokens": int(row["sum_good_output_tokens"] or 0),
                "mu": float(row["sum_mu"] or 0.0),
            },
        )
        for row in rows
        if row["endpoint_id"] is not None and row["profile_id"] is not None
    ]
