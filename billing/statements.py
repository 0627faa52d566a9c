"""Tenant statements: for a period, per endpoint, the MU reserved, the MU used and the overage above the reservation.

Reserved MU = reservation MU/min × the minutes of the period it existed. Overage = used − reserved when positive,
priced at ``INFERCAP["OVERAGE_USD_PER_1K_MU"]``; the reservation itself at ``INFERCAP["RESERVED_USD_PER_1K_MU"]``.
An endpoint's line reserves the base-model reservation and the LoRA adapter ones together (all are MU sold on it,
and its used MU counts every request); each adapter with a reservation also shows its own reserved MU beside its use.

Each line is split by the hardware profile (and so capacity type, on-demand or spot) that served it (``by_hardware``,
``billing.cost_split.statement_parts``), in proportion to the MU the tenant's requests used on each. Usage records
name the replica that served them, and a replica runs on its version's hardware profile; records without a replica
(requests refused before routing) and periods older than the raw records' retention are attributed by the
endpoint's replica GPU-hour mix over the period, and so is a line with reservations but no use. The parts' total
and reserved dollars sum to the line's (rounded to micro-dollars) exactly.
"""

import os
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from billing.cost_rows import profiles_by_id, replica_profile_seconds, served_usage
from billing.cost_split import StatementPart, gpu_hours_mix, statement_parts, usage_by_profile
from billing.models import UsageRecord
from billing.rollups import range_sums
from endpoints.models import Endpoint
from tenants.models import CapacityReservation, Tenant

DEFAULT_RESERVED_USD_PER_1K_MU = 0.02
DEFAULT_OVERAGE_USD_PER_1K_MU = 0.05


def prices() -> tuple[float, float]:
    """(reserved, overage) USD per 1,000 MU: settings.INFERCAP, else the INFERCAP_* environment, else defaults."""
    knobs = getattr(settings, "INFERCAP", {})

    def knob(name: str, default: float) -> float:
        return float(knobs.get(name, os.environ.get(f"INFERCAP_{name}", default)))

    return (
        knob("RESERVED_USD_PER_1K_MU", DEFAULT_RESERVED_USD_PER_1K_MU),
        knob("OVERAGE_USD_PER_1K_MU", DEFAULT_OVERAGE_USD_PER_1K_MU),
    )


@dataclass
class StatementLine:
    endpoint_id: int
    endpoint: str
    reserved_mu_per_min: float
    reserved_mu: float
    used_mu: float
    overage_mu: float
    reserved_usd: float
    overage_usd: float
    requests: int
    output_tokens: int
    good_output_tokens: int
    # Of the used MU, what each LoRA adapter on this base endpoint used (docs/lora-serving.md): name, requests, MU, tokens.
    adapters: list[dict] = field(default_factory=list)
    # The line's cost by the hardware profile that served it (module docstring).
    by_hardware: list[StatementPart] = field(default_factory=list)

    @property
    def total_usd(self) -> float:
        return self.reserved_usd + self.overage_usd


@dataclass
class Statement:
    tenant_id: int
    tenant: str
    start: datetime
    end: datetime
    reserved_usd_per_1k_mu: float
    overage_usd_per_1k_mu: float
    lines: list[StatementLine] = field(default_factory=list)

    @property
    def reserved_mu(self) -> float:
        return sum(line.reserved_mu for line in self.lines)

    @property
    def used_mu(self) -> float:
        return sum(line.used_mu for line in self.lines)

    @property
    def overage_mu(self) -> float:
        return sum(line.overage_mu for line in self.lines)

    @property
    def total_usd(self) -> float:
        return sum(line.total_usd for line in self.lines)

    @property
    def by_hardware(self) -> list[dict]:
        """The lines' hardware parts summed per (profile, capacity type), for the statement's summary."""
        rows: dict[int, dict] = {}
        for line in self.lines:
            for part in line.by_hardware:
                row = rows.setdefault(
                    part.profile_id,
                    {"profile_id": part.profile_id, "profile": part.profile, "capacity_type": part.capacity_type,
                     "used_mu": 0.0, "requests": 0, "good_output_tokens": 0, "total_usd": 0.0},
                )  # fmt: skip
                row["used_mu"] += part.used_mu
                row["requests"] += part.requests
                row["good_output_tokens"] += part.good_output_tokens
                row["total_usd"] = round(row["total_usd"] + part.total_usd, 6)
        return sorted(rows.values(), key=lambda row: row["profile"])

    def as_dict(self) -> dict:
        return {
            "tenant_id": self.tenant_id,
            "tenant": self.tenant,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "reserved_usd_per_1k_mu": self.reserved_usd_per_1k_mu,
            "overage_usd_per_1k_mu": self.overage_usd_per_1k_mu,
            "reserved_mu": self.reserved_mu,
            "used_mu": self.used_mu,
            "overage_mu": self.overage_mu,
            "total_usd": round(self.total_usd, 6),
            "by_hardware": self.by_hardware,
            "lines": [
                {
                    **vars(line),
                    "total_usd": round(line.total_usd, 6),
                    "by_hardware": [vars(part) for part in line.by_hardware],
                }
                for line in self.lines
            ],
        }


def statement_for(*, tenant: Tenant, start: datetime, end: datetime, now: datetime | None = None) -> Statement:
    if end <= start:
        raise ValueError("the statement's end must be after its start")
    now = now or timezone.now()
    reserved_price, overage_price = prices()
    statement = Statement(
        tenant_id=tenant.pk,
        tenant=tenant.slug,
        start=start,
        end=end,
        reserved_usd_per_1k_mu=reserved_price,
        overage_usd_per_1k_mu=overage_price,
    )
    usage = {
        endpoint_id: sums
        for (endpoint_id, tenant_id), sums in range_sums(
            start=start,
            end=end,
            fields=("requests", "good", "output_tokens", "good_output_tokens", "mu"),
            now=now,
            tenant_ids=[tenant.pk],
        ).items()
        if tenant_id == tenant.pk
    }
    reservations: dict[int, list[CapacityReservation]] = {}
    for r in CapacityReservation.objects.filter(tenant=tenant, created_at__lt=end).select_related("adapter"):
        reservations.setdefault(r.endpoint_id, []).append(r)
    by_adapter = _adapter_usage(tenant=tenant, start=start, end=end)
    endpoints = Endpoint.objects.in_bulk(set(usage) | set(reservations))
    split = _usage_by_profile(tenant=tenant, usage=usage, endpoints=endpoints, start=start, end=end)
    for endpoint_id in sorted(endpoints, key=lambda pk: endpoints[pk].name):
        held = reservations.get(endpoint_id, [])
        sums = usage.get(endpoint_id, {})
        rate = sum(r.mu_per_min for r in held)
        reserved_mu = sum(r.mu_per_min * _minutes_held(r, start=start, end=end) for r in held)
        used_mu = float(sums.get("mu", 0.0))
        overage_mu = max(0.0, used_mu - reserved_mu)
        reserved_usd, overage_usd = reserved_mu / 1000 * reserved_price, overage_mu / 1000 * overage_price
        statement.lines.append(
            StatementLine(
                endpoint_id=endpoint_id,
                endpoint=endpoints[endpoint_id].name,
                reserved_mu_per_min=rate,
                reserved_mu=reserved_mu,
                used_mu=used_mu,
                overage_mu=overage_mu,
                reserved_usd=reserved_usd,
                overage_usd=overage_usd,
                requests=int(sums.get("requests", 0)),
                output_tokens=int(sums.get("output_tokens", 0)),
                good_output_tokens=int(sums.get("good_output_tokens", 0)),
                adapters=_with_adapter_reservations(by_adapter.get(endpoint_id, []), held, start=start, end=end),
                by_hardware=statement_parts(
                    reserved_usd=reserved_usd,
                    overage_usd=overage_usd,
                    usage=split.usage.get((endpoint_id, tenant.pk), {}),
                    mix=split.mix.get(endpoint_id, {}),
                    profiles=split.profiles,
                ),
            )
        )
    return statement


@dataclass
class _Split:
    usage: dict
    mix: dict
    profiles: dict


def _usage_by_profile(
    *, tenant: Tenant, usage: dict[int, dict], endpoints: dict[int, Endpoint], start: datetime, end: datetime
) -> _Split:
    """The tenant's usage per (endpoint, hardware profile) and the endpoints' GPU-hour mixes (module docstring)."""
    ids = list(endpoints)
    seconds = replica_profile_seconds(endpoint_ids=ids, start=start, end=end)
    served = served_usage(start=start, end=end, endpoint_ids=ids, tenant_ids=[tenant.pk])
    profiles = profiles_by_id(
        [s.profile_id for s in seconds] + [e.hardware_profile_id for e in endpoints.values()]
        + [row.profile_id for row in served]
    )  # fmt: skip
    mix = gpu_hours_mix(seconds, profiles)
    for endpoint in endpoints.values():
        mix.setdefault(endpoint.pk, {endpoint.hardware_profile_id: 1.0})
    totals = {(endpoint_id, tenant.pk): sums for endpoint_id, sums in usage.items()}
    return _Split(usage=usage_by_profile(totals=totals, served=served, mix=mix), mix=mix, profiles=profiles)


def _minutes_held(reservation: CapacityReservation, *, start: datetime, end: datetime) -> float:
    return (end - max(start, reservation.created_at)).total_seconds() / 60


def _with_adapter_reservations(
    used: list[dict], held: list[CapacityReservation], *, start: datetime, end: datetime
) -> list[dict]:
    """The adapters' usage rows, each adapter the tenant holds a reservation for with its reserved MU/min and MU of
    the period beside the MU it used (an adapter reserved but unused gets a row of zeros)."""
    rows = {row["adapter"]: dict(row) for row in used}
    for r in held:
        if r.adapter_id is None:
            continue
        row = rows.setdefault(
            r.adapter.name, {"adapter": r.adapter.name, "requests": 0, "mu": 0.0, "output_tokens": 0}
        )
        row["reserved_mu_per_min"] = r.mu_per_min
        row["reserved_mu"] = r.mu_per_min * _minutes_held(r, start=start, end=end)
    return sorted(rows.values(), key=lambda row: row["adapter"])


def _adapter_usage(*, tenant: Tenant, start: datetime, end: datetime) -> dict[int, list[dict]]:
    """Per base endpoint, the tenant's LoRA adapter usage in the period: one grouped query over its usage records
    with an adapter (the rollups are per endpoint; raw records are kept USAGE_RETENTION_DAYS)."""
    rows = (
        UsageRecord.objects.filter(tenant=tenant, finished_at__gte=start, finished_at__lt=end)
        .exclude(adapter="")
        .values("endpoint_id", "adapter")
        .annotate(requests=Count("id"), mu=Sum("mu"), output_tokens=Sum("output_tokens"))
        .order_by("endpoint_id", "adapter")
    )
    found: dict[int, list[dict]] = {}
    for row in rows:
        found.setdefault(row["endpoint_id"], []).append(
            {"adapter": row["adapter"], "requests": row["requests"], "mu": float(row["mu"] or 0.0),
             "output_tokens": int(row["output_tokens"] or 0)}
        )  # fmt: skip
    return found
