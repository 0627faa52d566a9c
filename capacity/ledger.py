"""The capacity ledger (selectors): have / sold / used / headroom / overcommit per endpoint and in total, and per
tenant reserved vs used with throttled and shed requests. Every figure is in model units per minute.

have = ready (non-standby) replicas × the replica's MU/min; sold = Σ reservations (base-model and LoRA adapter ones
alike: both are MU/min sold on the endpoint); used = MU actually consumed,
read from the per-minute usage rollups (``billing.UsageMinute``) through ``usage_aggregate``, the one place that
knows where usage lives, so raw usage rows are only scanned where rollups do not exist.

Given the free GPUs (a ``placement`` cluster: a Kubernetes cluster's GPU nodes, or this host's as the local
actuator allots them), each endpoint's row also says how many more whole replicas of its TP size fit in them
(docs/placement.md, "In the ledger").
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from capacity.percentiles import percentile
from capacity.unit_resolver import coefficients_by_endpoint
from endpoints.models import Endpoint, ReplicaState, ServingMode
from placement import mig
from placement.cluster import Cluster, replica_gpu_count
from placement.node_requirements import Room, endpoint_requirements
from placement.policies import groups_that_fit
from tenants.models import CapacityReservation

MINUTE = timedelta(minutes=1)
DAY_MINUTES = 24 * 60


@dataclass
class UsageRow:
    """Usage summed over one group: ``start`` is set when grouped by minute, the ids when grouped by them."""

    endpoint_id: int | None
    tenant_id: int | None
    start: datetime | None
    mu: float = 0.0
    requests: int = 0
    throttled: int = 0  # refused by the tenant's rate limits (429 rate_limited)
    shed: int = 0  # dropped by admission (queue full or too old)


_GROUPS = {"endpoint": "endpoint_id", "tenant": "tenant_id", "minute": "start"}


def _rollup_model():
    try:
        return apps.get_model("billing", "UsageMinute")
    except LookupError:
        return None


def usage_aggregate(
    *,
    start: datetime,
    end: datetime,
    by: tuple[str, ...],
    endpoint_ids: list[int] | None = None,
    tenant_id: int | None = None,
) -> list[UsageRow]:
    """MU, requests, throttled and shed over [start, end), summed per ``by`` (``endpoint``, ``tenant``, ``minute``).

    The one place the ledger reads usage: from the per-minute rollups (``billing.UsageMinute``) when they exist,
    else from raw usage records. Sums happen in the database, so a day of minutes costs one grouped query.
    """
    unknown = set(by) - set(_GROUPS)
    if unknown:
        raise ValueError(f"cannot group usage by {sorted(unknown)}")
    rollup = _rollup_model()
    if rollup is not None:
        rows = rollup.objects.filter(start__gte=start, start__lt=end)
        sums = {
            "s_mu": Sum("mu"),
            "s_requests": Sum("requests"),
            "s_throttled": Sum("rate_limited"),
            "s_shed": Sum("shed"),
        }
        keys = [_GROUPS[g] for g in by]
    else:
        rows = apps.get_model("billing", "UsageRecord").objects.filter(
            finished_at__gte=start, finished_at__lt=end, endpoint_id__isnull=False
        )
        if "minute" in by:
            rows = rows.annotate(start=TruncMinute("finished_at"))
        sums = {
            "s_mu": Sum("mu"),
            "s_requests": Count("id"),
            "s_throttled": Count("id", filter=Q(status="rate_limited")),
            "s_shed": Count("id", filter=Q(status="shed")),
        }
        keys = [_GROUPS[g] for g in by]
    if endpoint_ids is not None:
        rows = rows.filter(endpoint_id__in=endpoint_ids)
    if tenant_id is not None:
        rows = rows.filter(tenant_id=tenant_id)
    result = []
    for r in rows.values(*keys).annotate(**sums).order_by():
        result.append(
            UsageRow(
                endpoint_id=r.get("endpoint_id"),
                tenant_id=r.get("tenant_id"),
                start=r.get("start"),
                mu=r["s_mu"] or 0.0,
                requests=r["s_requests"] or 0,
                throttled=r["s_throttled"] or 0,
                shed=r["s_shed"] or 0,
            )
        )
    return result


@dataclass
class EndpointLedger:
    endpoint_id: int
    endpoint: str
    coefficients_source: str
    replica_mu_per_min: float
    ready_replicas: int
    have_mu_per_min: float
    sellable_mu_per_min: float  # what sales are checked against: max(ready, min_replicas) × replica MU/min
    available_to_sell_mu_per_min: float  # overcommit limit × sellable − sold, never below 0
    sold_mu_per_min: float
    used_mu_per_min_1m: float
    used_mu_per_min_1h: float
    used_mu_per_min_p95_1d: float
    headroom_mu_per_min: float  # have − used over the last minute
    unsold_mu_per_min: float  # have − sold
    overcommit_ratio: float | None  # sold / have; None when nothing is ready
    utilization_1h: float | None  # used (1 h) / have
    throttled_1h: int = 0
    shed_1h: int = 0
    replica_gpus: int = 1  # one replica's TP group
    whole_replicas_free: int | None = None  # more whole groups the free GPUs hold; None where they are not known
    mig_slice: str = ""  # the MIG profile a replica is one slice of; "" for whole GPUs (room then counts slices)
    pools: list[PoolRoom] = field(default_factory=list)  # the endpoint's other pools' room, where it has any


@dataclass
class PoolRoom:
    """Room for one of an endpoint's other pools, whose pods run on another profile or other nodes than the row's
    on-demand (decode) pods: its prefill pool, its spot pool, the profile a scale-up falls back to."""

    pool: str  # "prefill", "spot" or "fallback"
    hardware_profile: str
    replica_gpus: int
    whole_replicas_free: int | None = None
    mig_slice: str = ""


@dataclass
class TenantLedgerRow:
    tenant_id: int
    tenant: str
    endpoint_id: int
    endpoint: str
    reserved_mu_per_min: float
    used_mu_per_min_1m: float
    used_mu_per_min_1h: float
    requests_1h: int
    throttled_1h: int
    shed_1h: int
    reservation_use_1h: float | None  # used (1 h) / reserved


@dataclass
class Ledger:
    at: datetime
    endpoints: list[EndpointLedger] = field(default_factory=list)
    tenants: list[TenantLedgerRow] = field(default_factory=list)
    total: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _endpoints(queryset) -> list[Endpoint]:
    """The ledger's endpoints by name, each with its profiles and its count of ready serving replicas."""
    return list(
        queryset.select_related(None)
        .select_related(  # replica_gpus, the pools' room
            "hardware_profile", "prefill_hardware_profile", "spot_hardware_profile", "fallback_hardware_profile"
        )
        .annotate(
            ready_count=Count(
                "replicas", filter=Q(replicas__state=ReplicaState.READY, replicas__is_standby=False), distinct=True
            )
        )
        .order_by("name")
    )


def capacity_ledger(
    *, now: datetime | None = None, endpoints=None, tenant_id: int | None = None, free_gpus: Cluster | None = None
) -> Ledger:
    """The ledger over ``endpoints`` (default: all). With ``tenant_id`` only that tenant's rows are computed, and
    the per-endpoint and total sections are left empty: they aggregate other tenants' reservations and use."""
    now = now or timezone.now()
    minute_end = now.replace(second=0, microsecond=0)  # the last complete minute ends here
    day_start = minute_end - DAY_MINUTES * MINUTE
    hour_start, last_minute = minute_end - 60 * MINUTE, minute_end - MINUTE
    queryset = endpoints if endpoints is not None else Endpoint.objects.all()
    endpoint_list = _endpoints(queryset)
    ids = [e.pk for e in endpoint_list]
    reservations = CapacityReservation.objects.filter(endpoint_id__in=ids).select_related("tenant")
    if tenant_id is not None:
        reservations = reservations.filter(tenant_id=tenant_id)
    tenant_hour = usage_aggregate(
        start=hour_start, end=minute_end, by=("endpoint", "tenant"), endpoint_ids=ids, tenant_id=tenant_id
    )
    tenant_minute = usage_aggregate(
        start=last_minute, end=minute_end, by=("endpoint", "tenant"), endpoint_ids=ids, tenant_id=tenant_id
    )
    ledger = Ledger(at=now)
    ledger.tenants = _tenant_rows(endpoint_list, list(reservations), tenant_hour, tenant_minute)
    if tenant_id is not None:
        return ledger

    coefficients = coefficients_by_endpoint(endpoint_list)
    limit = float(settings.INFERCAP["OVERCOMMIT_LIMIT"])
    sold: dict[int, float] = defaultdict(float)
    for reservation in reservations:
        sold[reservation.endpoint_id] += reservation.mu_per_min
    per_minute: dict[int, dict[datetime, float]] = defaultdict(dict)
    for row in usage_aggregate(start=day_start, end=minute_end, by=("endpoint", "minute"), endpoint_ids=ids):
        per_minute[row.endpoint_id][row.start] = row.mu
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in tenant_hour:
        counts[row.endpoint_id][0] += row.throttled
        counts[row.endpoint_id][1] += row.shed
    for endpoint in endpoint_list:
        coeffs = coefficients[endpoint.pk]
        minutes = per_minute[endpoint.pk]
        have = endpoint.ready_count * coeffs.mu_per_min
        sellable = max(endpoint.ready_count, endpoint.min_replicas) * coeffs.mu_per_min
        used_1m = minutes.get(last_minute, 0.0)
        used_1h = sum(mu for start, mu in minutes.items() if start >= hour_start) / 60
        # Minutes without usage count as zero: the day has 1,440 samples however sparse the traffic.
        samples = list(minutes.values()) + [0.0] * (DAY_MINUTES - len(minutes))
        ledger.endpoints.append(
            EndpointLedger(
                endpoint_id=endpoint.pk,
                endpoint=endpoint.name,
                coefficients_source=coeffs.source,
                replica_mu_per_min=coeffs.mu_per_min,
                ready_replicas=endpoint.ready_count,
                have_mu_per_min=have,
                sellable_mu_per_min=sellable,
                available_to_sell_mu_per_min=max(0.0, limit * sellable - sold[endpoint.pk]),
                sold_mu_per_min=sold[endpoint.pk],
                used_mu_per_min_1m=used_1m,
                used_mu_per_min_1h=used_1h,
                used_mu_per_min_p95_1d=percentile(samples, 95),
                headroom_mu_per_min=have - used_1m,
                unsold_mu_per_min=have - sold[endpoint.pk],
                overcommit_ratio=_ratio(sold[endpoint.pk], have),
                utilization_1h=_ratio(used_1h, have),
                throttled_1h=counts[endpoint.pk][0],
                shed_1h=counts[endpoint.pk][1],
            )
        )
    ledger.total = _totals(ledger.endpoints, per_minute) | _whole_groups(ledger, endpoint_list, free_gpus)
    return ledger


def replica_gpus(endpoint: Endpoint) -> int:
    """One replica's GPUs, as its actuator asks for them: on Kubernetes the hardware profile's ``gpus_per_replica``
    (what its pod requests); locally the engine's ``tensor_parallel_size`` where the launch options set it, else the
    profile's."""
    hardware = endpoint.hardware_profile if endpoint.hardware_profile_id else None
    return _launch_gpus(endpoint.launch_options, hardware)


def _launch_gpus(options, hardware, *, engine_ranks: bool = True) -> int:
    """A launch's GPUs a replica (``replica_gpus``); without ``engine_ranks`` the profile's alone, as a fallback
    launch asks for (its ``tensor_parallel_size`` becomes the fallback's ``gpus_per_replica``)."""
    options = options if isinstance(options, dict) else {}
    default = getattr(settings, "INFERCAP", {}).get("AUTOSCALE_ACTUATOR", "local")
    on_kubernetes = (options.get("actuator") or default) == "kubernetes"
    size = hardware.gpus_per_replica if hardware else None
    return replica_gpu_count(
        options.get("tensor_parallel_size"), size, engine_ranks=engine_ranks and not on_kubernetes
    )


def _pool_launches(endpoint: Endpoint) -> list[tuple[str, object, dict, bool, bool]]:
    """The endpoint's other pools as their actuators launch them (``capacity.autoscaling.services.pool_endpoint``
    and ``fall_back``): (pool, hardware profile, launch options, spot, engine ranks count). A disaggregated
    endpoint's prefill pool runs on its prefill profile (the endpoint's where it names none) with the prefill launch
    options laid over the endpoint's; a spot pool on the spot profile with the spot selector and tolerations; a
    fallback on the fallback profile's own GPUs per replica."""
    options = endpoint.launch_options if isinstance(endpoint.launch_options, dict) else {}
    own = endpoint.hardware_profile if endpoint.hardware_profile_id else None
    pools = []
    if endpoint.serving_mode == ServingMode.DISAGGREGATED:
        prefill = endpoint.prefill_hardware_profile if endpoint.prefill_hardware_profile_id else own
        pools.append(("prefill", prefill, endpoint.prefill_pool_launch_options, False, True))
    if endpoint.spot_hardware_profile_id:
        pools.append(("spot", endpoint.spot_hardware_profile, options, True, True))
    if endpoint.fallback_hardware_profile_id:
        pools.append(("fallback", endpoint.fallback_hardware_profile, options, False, False))
    return pools


def _whole_groups(ledger: Ledger, endpoint_list: list[Endpoint], free_gpus: Cluster | None) -> dict:
    """Each row's TP size and whole replicas free, and its other pools' (``PoolRoom``), one placement per size (3
    free GPUs hold no TP-4 group); the total's free GPUs. On a Kubernetes ``Room`` a row or pool counts only the
    nodes its pods may be bound to, one placement per distinct (requirements, size): one whose launch options cannot
    be read is unknown."""
    by_size: dict[int, int] = {}

    strategy = mig.strategy_of(settings.INFERCAP.get("KUBERNETES_MIG_STRATEGY"))

    def room(options, hardware, size: int, *, spot: bool = False) -> int | None:
        if free_gpus is None:
            return None
        profile = hardware.mig_profile if hardware is not None else ""
        if isinstance(free_gpus, Room):
            try:
                needs = endpoint_requirements(options, hardware, spot=spot, mig_strategy=strategy)
                if profile:
                    return free_gpus.slices_free(needs, profile, strategy) if size == 1 else 0
            except ValueError:  # launch options or a MIG strategy that do not read: the launch says why
                return None
            return free_gpus.whole_groups(needs, size)
        if profile:  # a slice is a domain of one: room is the free slices of the profile, and no TP group fits one
            return free_gpus.mig_free.get(profile, 0) if size == 1 else 0
        if size not in by_size:
            by_size[size] = groups_that_fit(free_gpus, size)
        return by_size[size]

    for row, endpoint in zip(ledger.endpoints, endpoint_list, strict=True):
        row.replica_gpus = replica_gpus(endpoint)
        hardware = endpoint.hardware_profile if endpoint.hardware_profile_id else None
        row.whole_replicas_free = room(endpoint.launch_options, hardware, row.replica_gpus)
        row.mig_slice = hardware.mig_profile if hardware is not None else ""
        for pool, pool_hardware, options, spot, engine_ranks in _pool_launches(endpoint):
            size = _launch_gpus(options, pool_hardware, engine_ranks=engine_ranks)
            row.pools.append(
                PoolRoom(
                    pool=pool,
                    hardware_profile=pool_hardware.name if pool_hardware else "",
                    replica_gpus=size,
                    whole_replicas_free=room(options, pool_hardware, size, spot=spot),
                    mig_slice=pool_hardware.mig_profile if pool_hardware is not None else "",
                )
            )
    if free_gpus is None:
        return {"free_gpus": None}
    slices = free_gpus.mig_free
    return {"free_gpus": free_gpus.free_count(), **({"free_mig_slices": dict(slices)} if slices else {})}


def _totals(rows: list[EndpointLedger], per_minute: dict[int, dict[datetime, float]]) -> dict:
    combined: dict[datetime, float] = defaultdict(float)
    for minutes in per_minute.values():
        for start, mu in minutes.items():
            combined[start] += mu
    have = sum(r.have_mu_per_min for r in rows)
    sold = sum(r.sold_mu_per_min for r in rows)
    used_1m = sum(r.used_mu_per_min_1m for r in rows)
    used_1h = sum(r.used_mu_per_min_1h for r in rows)
    samples = list(combined.values()) + [0.0] * (DAY_MINUTES - len(combined))
    return {
        "endpoints": len(rows),
        "ready_replicas": sum(r.ready_replicas for r in rows),
        "have_mu_per_min": have,
        "sold_mu_per_min": sold,
        "used_mu_per_min_1m": used_1m,
        "used_mu_per_min_1h": used_1h,
        # p95 of the summed per-minute series, not the sum of per-endpoint p95s (peaks rarely coincide).
        "used_mu_per_min_p95_1d": percentile(samples, 95),
        "headroom_mu_per_min": have - used_1m,
        "unsold_mu_per_min": have - sold,
        "available_to_sell_mu_per_min": sum(r.available_to_sell_mu_per_min for r in rows),
        "overcommit_ratio": _ratio(sold, have),
        "utilization_1h": _ratio(used_1h, have),
        "throttled_1h": sum(r.throttled_1h for r in rows),
        "shed_1h": sum(r.shed_1h for r in rows),
    }


def _tenant_rows(endpoint_list, reservations, hour: list[UsageRow], minute: list[UsageRow]) -> list:
    names = {e.pk: e.name for e in endpoint_list}
    rows: dict[tuple[int, int], TenantLedgerRow] = {}
    for reservation in reservations:
        # A tenant's base-model and LoRA adapter reservations on one endpoint make one row: its usage there is both.
        key = (reservation.tenant_id, reservation.endpoint_id)
        if key in rows:
            rows[key].reserved_mu_per_min += reservation.mu_per_min
            continue
        rows[key] = TenantLedgerRow(
            reservation.tenant_id, reservation.tenant.name, reservation.endpoint_id, names[reservation.endpoint_id],
            reservation.mu_per_min, 0.0, 0.0, 0, 0, 0, None,
        )  # fmt: skip
    unreserved: set[int] = set()

    def entry_for(row: UsageRow) -> TenantLedgerRow:
        key = (row.tenant_id, row.endpoint_id)
        if key not in rows:
            # Best-effort traffic from a tenant holding no reservation here still shows up, with reserved = 0.
            rows[key] = TenantLedgerRow(row.tenant_id, "", row.endpoint_id, names[row.endpoint_id], 0.0,
                                        0.0, 0.0, 0, 0, 0, None)  # fmt: skip
            unreserved.add(row.tenant_id)
        return rows[key]

    for row in hour:
        entry = entry_for(row)
        entry.used_mu_per_min_1h = row.mu / 60
        entry.requests_1h, entry.throttled_1h, entry.shed_1h = row.requests, row.throttled, row.shed
    for row in minute:
        entry_for(row).used_mu_per_min_1m = row.mu
    if unreserved:
        tenant_names = dict(
            apps.get_model("tenants", "Tenant").objects.filter(pk__in=unreserved).values_list("pk", "name")
        )
        for entry in rows.values():
            if not entry.tenant:
                entry.tenant = tenant_names.get(entry.tenant_id, "")
    for entry in rows.values():
        entry.reservation_use_1h = _ratio(entry.used_mu_per_min_1h, entry.reserved_mu_per_min)
    return sorted(rows.values(), key=lambda r: (r.tenant, r.endpoint))


def endpoint_sellable_mu_per_min(endpoint: Endpoint) -> tuple[float, int, float]:
    """(sellable MU/min, replicas counted, MU/min per replica) for the overcommit check of one endpoint."""
    ready = endpoint.replicas.filter(state=ReplicaState.READY, is_standby=False).count()
    coeffs = coefficients_by_endpoint([endpoint])[endpoint.pk]
    replicas = max(ready, endpoint.min_replicas)
    return replicas * coeffs.mu_per_min, replicas, coeffs.mu_per_min


def endpoint_sold_mu_per_min(endpoint: Endpoint, *, exclude_reservation_id: int | None = None) -> float:
    reservations = CapacityReservation.objects.filter(endpoint=endpoint)
    if exclude_reservation_id is not None:
        reservations = reservations.exclude(pk=exclude_reservation_id)
    return reservations.aggregate(total=Sum("mu_per_min"))["total"] or 0.0
