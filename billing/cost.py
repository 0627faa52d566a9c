"""Cost reports: GPU-hours from replica lifetimes, dollars, tokens, goodput per dollar, utilization and idle cost.

Per endpoint, and per tenant on it. A shared endpoint's cost is allocated to tenants by the MU they used out of the
capacity that was up (its idle remainder stays with the operator); a dedicated endpoint's owner pays all of it.
"""

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from billing.models import CostReport
from billing.rollups import range_sums
from capacity.unit_resolver import coefficients_by_endpoint
from endpoints.models import BILLED_STATES, Endpoint, Replica, ReplicaState, ReplicaTransition
from tenants.models import Tenant

COST_FIELDS = ("requests", "input_tokens", "cached_tokens", "output_tokens", "good_output_tokens", "mu")


def state_seconds(
    *,
    state_at_start: str | None,
    transitions: Iterable[tuple[datetime, str]],
    start: datetime,
    end: datetime,
    states: Iterable[str],
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


@dataclass
class CostLine:
    endpoint_id: int
    endpoint: str
    tenant_id: int | None
    tenant: str | None
    start: datetime
    end: datetime
    gpu_hours: float = 0.0
    usd: float = 0.0
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    good_output_tokens: int = 0
    used_mu: float = 0.0
    capacity_mu: float = 0.0
    utilization: float | None = None
    idle_usd: float = 0.0
    good_tokens_per_usd: float | None = None
    usd_per_1m_good_tokens: float | None = None

    def finish(self) -> "CostLine":
        """Derive the ratios from the sums (None where the denominator is zero)."""
        self.utilization = self.used_mu / self.capacity_mu if self.capacity_mu > 0 else None
        self.good_tokens_per_usd = self.good_output_tokens / self.usd if self.usd > 0 else None
        self.usd_per_1m_good_tokens = self.usd / self.good_output_tokens * 1e6 if self.good_output_tokens else None
        return self


def replica_seconds(*, endpoint_ids: list[int], start: datetime, end: datetime) -> dict[int, tuple[float, float]]:
    """Per endpoint: (billed replica-seconds in ready/draining, ready replica-seconds) over [start, end)."""
    last_before = ReplicaTransition.objects.filter(replica=OuterRef("pk"), at__lt=start).order_by("-at", "-id")
    replicas = list(
        Replica.objects.filter(endpoint_id__in=endpoint_ids).annotate(
            state_at_start=Subquery(last_before.values("to_state")[:1]),
            transitions_before=Subquery(last_before.values("id")[:1]),
        )
    )
    in_range: dict[int, list[tuple[datetime, str, str]]] = defaultdict(list)
    for t in ReplicaTransition.objects.filter(
        replica__endpoint_id__in=endpoint_ids, at__gte=start, at__lt=end
    ).order_by("at", "id"):
        in_range[t.replica_id].append((t.at, t.from_state, t.to_state))
    totals: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
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
        totals[replica.endpoint_id][0] += state_seconds(
            state_at_start=initial, transitions=steps, start=start, end=end, states=BILLED_STATES
        )
        totals[replica.endpoint_id][1] += state_seconds(
            state_at_start=initial, transitions=steps, start=start, end=end, states={ReplicaState.READY}
        )
    return {k: (v[0], v[1]) for k, v in totals.items()}


def cost_lines(
    *, start: datetime, end: datetime, endpoints: Iterable[Endpoint] | None = None, now: datetime | None = None
) -> list[CostLine]:
    """Endpoint lines (tenant None) followed by their tenants' lines, for every endpoint given (default: all)."""
    if end <= start:
        raise ValueError("the report's end must be after its start")
    now = now or timezone.now()
    queryset = Endpoint.objects.all()
    if endpoints is not None:
        queryset = queryset.filter(pk__in=[e.pk for e in endpoints])
    endpoint_list = list(queryset.select_related("hardware_profile", "model_profile", "pinned_benchmark"))
    ids = [e.pk for e in endpoint_list]
    seconds = replica_seconds(endpoint_ids=ids, start=start, end=end)
    usage = range_sums(start=start, end=end, fields=COST_FIELDS, now=now, endpoint_ids=ids)
    coefficients = coefficients_by_endpoint(endpoint_list)
    tenant_names = _tenant_names({t for _, t in usage})
    lines: list[CostLine] = []
    for endpoint in endpoint_list:
        billed_s, ready_s = seconds.get(endpoint.pk, (0.0, 0.0))
        hardware = endpoint.hardware_profile
        line = CostLine(
            endpoint_id=endpoint.pk, endpoint=endpoint.name, tenant_id=None, tenant=None, start=start, end=end
        )
        line.gpu_hours = billed_s / 3600 * hardware.gpus_per_replica
        line.usd = line.gpu_hours * (hardware.usd_per_gpu_hour or 0.0)  # unpriced hardware costs nothing yet
        line.capacity_mu = ready_s / 60 * coefficients[endpoint.pk].mu_per_min
        tenants = {t: sums for (e, t), sums in usage.items() if e == endpoint.pk}
        for sums in tenants.values():
            _add_usage(line, sums)
        line.finish()
        utilization = min(1.0, line.utilization) if line.utilization is not None else 0.0
        line.idle_usd = line.usd * (1.0 - utilization)
        lines.append(line)
        # Shares of what was up; if traffic exceeded nominal capacity, shares of what was used.
        denominator = max(line.capacity_mu, line.used_mu)
        for tenant_id in sorted(tenants, key=lambda t: tenant_names.get(t, "")):
            sums = tenants[tenant_id]
            tenant_line = CostLine(
                endpoint_id=endpoint.pk,
                endpoint=endpoint.name,
                tenant_id=tenant_id,
                tenant=tenant_names.get(tenant_id),
                start=start,
                end=end,
                capacity_mu=line.capacity_mu,
            )
            _add_usage(tenant_line, sums)
            if endpoint.owner_tenant_id == tenant_id:
                share, tenant_line.idle_usd = 1.0, line.idle_usd
            else:
                share = tenant_line.used_mu / denominator if denominator > 0 else 0.0
            tenant_line.gpu_hours = line.gpu_hours * share
            tenant_line.usd = line.usd * share
            lines.append(tenant_line.finish())
    return lines


def _add_usage(line: CostLine, sums: dict[str, float]) -> None:
    line.requests += int(sums["requests"])
    line.input_tokens += int(sums["input_tokens"])
    line.cached_tokens += int(sums["cached_tokens"])
    line.output_tokens += int(sums["output_tokens"])
    line.good_output_tokens += int(sums["good_output_tokens"])
    line.used_mu += sums["mu"]


def _tenant_names(ids: set[int]) -> dict[int, str]:
    return dict(Tenant.objects.filter(pk__in=ids).values_list("pk", "slug"))


PERIODS = {CostReport.Granularity.HOUR: timedelta(hours=1), CostReport.Granularity.DAY: timedelta(days=1)}


def period_start(granularity: str, moment: datetime) -> datetime:
    """The start of the hour or day that contains ``moment``."""
    start = moment.replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if granularity == CostReport.Granularity.DAY else start


def cost_reports_store(*, granularity: str, start: datetime, now: datetime | None = None) -> int:
    """(Re)compute and store the reports of one hour or day; idempotent, so late usage is picked up by a re-run."""
    start = period_start(granularity, start)
    end = start + PERIODS[granularity]
    lines = cost_lines(start=start, end=end, now=now)
    stored = [
        CostReport(
            granularity=granularity,
            **{f.name: getattr(line, f.name) for f in fields(CostLine) if f.name not in ("endpoint", "tenant")},
        )
        for line in lines
    ]
    with transaction.atomic():
        CostReport.objects.filter(granularity=granularity, start=start).delete()
        CostReport.objects.bulk_create(stored, batch_size=500)
    return len(stored)


CSV_COLUMNS = [f.name for f in fields(CostLine)]


def cost_csv(lines: Iterable[CostLine]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for line in lines:
        row = asdict(line)
        row["start"], row["end"] = line.start.isoformat(), line.end.isoformat()
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()
