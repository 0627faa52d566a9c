"""Cost reports: GPU-hours from replica lifetimes, dollars, tokens, goodput per dollar, utilization and idle cost.

Per endpoint, and per tenant on it. A shared endpoint's cost is allocated to tenants by the MU they used out of the
capacity that was up (its idle remainder stays with the operator); a dedicated endpoint's owner pays all of it.
Every line also comes split by the hardware profile that served it (``by_hardware``, ``billing.cost_split``): each
replica's seconds at its own version's hardware rate, and usage by the replica its records name.
"""

import csv
import io
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from billing.cost_rows import profiles_by_id, replica_profile_seconds, served_usage, state_seconds
from billing.cost_split import (
    ProfileCost,
    endpoint_profile_costs,
    gpu_hours_mix,
    tenant_profile_costs,
    usage_by_profile,
)
from billing.models import CostReport
from billing.rollups import range_sums
from capacity.unit_resolver import coefficients_by_endpoint
from endpoints.models import Endpoint
from tenants.models import Tenant

__all__ = ["CostLine", "cost_csv", "cost_lines", "cost_reports_store", "period_start", "state_seconds"]

COST_FIELDS = ("requests", "good", "input_tokens", "cached_tokens", "output_tokens", "good_output_tokens", "mu")


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
    # The same line per hardware profile that served it (billing.cost_split): computed, not stored in CostReport.
    by_hardware: list[ProfileCost] = field(default_factory=list)

    def finish(self) -> "CostLine":
        """Derive the ratios from the sums (None where the denominator is zero)."""
        self.utilization = self.used_mu / self.capacity_mu if self.capacity_mu > 0 else None
        self.good_tokens_per_usd = self.good_output_tokens / self.usd if self.usd > 0 else None
        self.usd_per_1m_good_tokens = self.usd / self.good_output_tokens * 1e6 if self.good_output_tokens else None
        return self


def cost_lines(
    *,
    start: datetime,
    end: datetime,
    endpoints: Iterable[Endpoint] | None = None,
    now: datetime | None = None,
    split_usage_by_record: bool = True,
) -> list[CostLine]:
    """Endpoint lines (tenant None) followed by their tenants' lines, for every endpoint given (default: all).

    ``split_usage_by_record=False`` skips the grouped read of raw usage records (the stored reports keep no split):
    the lines' ``by_hardware`` usage then follows the GPU-hour mix alone; their dollars are the same either way."""
    if end <= start:
        raise ValueError("the report's end must be after its start")
    now = now or timezone.now()
    queryset = Endpoint.objects.all()
    if endpoints is not None:
        queryset = queryset.filter(pk__in=[e.pk for e in endpoints])
    endpoint_list = list(queryset.select_related("hardware_profile", "model_profile", "pinned_benchmark"))
    ids = [e.pk for e in endpoint_list]
    seconds = replica_profile_seconds(endpoint_ids=ids, start=start, end=end)
    usage = range_sums(start=start, end=end, fields=COST_FIELDS, now=now, endpoint_ids=ids)
    coefficients = coefficients_by_endpoint(endpoint_list)
    tenant_names = _tenant_names({t for _, t in usage})
    profiles = profiles_by_id([s.profile_id for s in seconds] + [e.hardware_profile_id for e in endpoint_list])
    mix = gpu_hours_mix(seconds, profiles)
    for endpoint in endpoint_list:  # an endpoint with no billed hours serves (for the split) on its current profile
        mix.setdefault(endpoint.pk, {endpoint.hardware_profile_id: 1.0})
    served = served_usage(start=start, end=end, endpoint_ids=ids) if split_usage_by_record else []
    profiles |= profiles_by_id({row.profile_id for row in served} - set(profiles))
    split_usage = usage_by_profile(totals=usage, served=served, mix=mix)
    by_hardware = endpoint_profile_costs(seconds=seconds, profiles=profiles, usage=split_usage)
    lines: list[CostLine] = []
    for endpoint in endpoint_list:
        ready_s = sum(s.ready_s for s in seconds if s.endpoint_id == endpoint.pk)
        line = CostLine(
            endpoint_id=endpoint.pk, endpoint=endpoint.name, tenant_id=None, tenant=None, start=start, end=end
        )
        # Each replica at its own version's hardware rate (unpriced hardware costs nothing yet).
        line.by_hardware = by_hardware.get(endpoint.pk, [])
        line.gpu_hours = sum(row.gpu_hours for row in line.by_hardware)
        line.usd = sum(row.usd for row in line.by_hardware)
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
            pays_all = endpoint.owner_tenant_id == tenant_id
            if pays_all:
                share, tenant_line.idle_usd = 1.0, line.idle_usd
            else:
                share = tenant_line.used_mu / denominator if denominator > 0 else 0.0
            tenant_line.gpu_hours = line.gpu_hours * share
            tenant_line.usd = line.usd * share
            tenant_line.by_hardware = tenant_profile_costs(
                endpoint_rows=line.by_hardware,
                tenant_usage=split_usage.get((endpoint.pk, tenant_id), {}),
                gpu_hours=tenant_line.gpu_hours,
                usd=tenant_line.usd,
                pays_all=pays_all,
            )
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


NOT_STORED = ("endpoint", "tenant", "by_hardware")


def cost_reports_store(*, granularity: str, start: datetime, now: datetime | None = None) -> int:
    """(Re)compute and store the reports of one hour or day; idempotent, so late usage is picked up by a re-run."""
    start = period_start(granularity, start)
    end = start + PERIODS[granularity]
    lines = cost_lines(start=start, end=end, now=now, split_usage_by_record=False)
    stored = [
        CostReport(
            granularity=granularity,
            **{f.name: getattr(line, f.name) for f in fields(CostLine) if f.name not in NOT_STORED},
        )
        for line in lines
    ]
    with transaction.atomic():
        CostReport.objects.filter(granularity=granularity, start=start).delete()
        CostReport.objects.bulk_create(stored, batch_size=500)
    return len(stored)


CSV_COLUMNS = [f.name for f in fields(CostLine) if f.name != "by_hardware"]


def cost_csv(lines: Iterable[CostLine]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for line in lines:
        row = asdict(line)
        row.pop("by_hardware")
        row["start"], row["end"] = line.start.isoformat(), line.end.isoformat()
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()
