"""Cost by hardware profile and capacity type (on-demand / spot): pure arithmetic over plain rows, no Django.

``billing.cost_rows`` reads the rows (replica seconds per profile, usage records by the profile of the replica that
served them); ``billing.cost`` and ``billing.statements`` call this module. Every split keeps the unsplit figure as
its total: whole counts by largest remainder, money in micro-dollars (``USD_PLACES``) by largest remainder.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import floor

# The usage counters split per profile, by their rollup names ("good" = requests that met every latency SLO).
SPLIT_COUNTERS = ("requests", "good", "output_tokens", "good_output_tokens", "mu")
INTEGER_COUNTERS = frozenset({"requests", "good", "output_tokens", "good_output_tokens"})
USD_PLACES = 6  # statements round money to micro-dollars (Statement.as_dict)

Key = tuple[int, int]  # (endpoint id, tenant id)


@dataclass(frozen=True)
class Profile:
    """What the split needs of a hardware profile."""

    profile_id: int
    name: str
    capacity_type: str  # "on_demand" or "spot" (capacity.models.HardwareProfile.CapacityType)
    gpus_per_replica: int
    usd_per_gpu_hour: float | None  # None: no price yet, costs nothing
    # The GPUs one priced unit is: 1 for a whole GPU, a MIG slice's compute sevenths over 7 (a 1g.10gb slice is
    # 1/7). A slice's price is per slice-hour, so dollars count units and GPU-hours count this share of them.
    gpu_share: float = 1.0

    def unit_hours(self, billed_s: float) -> float:
        """Priced hours (GPU-hours, or MIG slice-hours) of ``billed_s`` replica-seconds."""
        return billed_s / 3600 * self.gpus_per_replica

    def gpu_hours(self, billed_s: float) -> float:
        """Whole-GPU hours of ``billed_s`` replica-seconds: a slice-hour counts its share of a GPU."""
        return self.unit_hours(billed_s) * self.gpu_share


@dataclass(frozen=True)
class ProfileSeconds:
    """One endpoint's replicas on one hardware profile: billed (ready or draining) and ready replica-seconds."""

    endpoint_id: int
    profile_id: int
    billed_s: float
    ready_s: float


@dataclass
class ServedUsage:
    """Usage records of one (endpoint, tenant) served by replicas of one profile, summed (``SPLIT_COUNTERS``)."""

    endpoint_id: int
    tenant_id: int
    profile_id: int
    sums: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class CostFigures:
    """GPU-hours, dollars and the work served of one part of a cost line, and goodput per dollar from them."""

    gpu_hours: float = 0.0
    usd: float = 0.0
    requests: int = 0
    good_requests: int = 0
    output_tokens: int = 0
    good_output_tokens: int = 0
    used_mu: float = 0.0
    good_tokens_per_usd: float | None = None
    usd_per_1m_good_tokens: float | None = None

    def finish(self):
        self.good_tokens_per_usd = self.good_output_tokens / self.usd if self.usd > 0 else None
        self.usd_per_1m_good_tokens = self.usd / self.good_output_tokens * 1e6 if self.good_output_tokens else None
        return self


@dataclass(kw_only=True)
class ProfileCost(CostFigures):
    """One hardware profile's part of a cost line (or of the fleet)."""

    profile_id: int
    profile: str
    capacity_type: str


def allocate_int(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` as whole parts in proportion to ``weights`` (largest remainder; ties to the earlier index), summing
    to ``total`` exactly. All-zero weights share equally."""
    if not weights:
        return []
    if sum(weights) <= 0:
        weights = [1.0] * len(weights)
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    parts = [floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def split_amount(total: float, weights: Sequence[float], *, places: int = USD_PLACES) -> list[float]:
    """``total`` rounded to ``places`` decimals, split in proportion to ``weights`` into parts of that precision whose
    sum is that rounded total (in units of 10^-places, so the sum is exact)."""
    unit = 10**places
    micros = allocate_int(round(total * unit), weights)
    return [m / unit for m in micros]


def _allocate(counter: str, total: float, weights: Sequence[float]) -> list[float]:
    if counter in INTEGER_COUNTERS:
        return [float(p) for p in allocate_int(int(round(total)), weights)]
    scale = sum(weights) or 1.0
    return [total * w / scale for w in weights] if sum(weights) > 0 else [total / len(weights)] * len(weights)


def usage_by_profile(
    *,
    totals: Mapping[Key, Mapping[str, float]],
    served: Iterable[ServedUsage],
    mix: Mapping[int, Mapping[int, float]],
) -> dict[Key, dict[int, dict[str, float]]]:
    """Per (endpoint, tenant), its usage totals (the rollups: the unsplit figures) split over hardware profiles.

    Records that name their replica (``served``) go to that replica's profile; the rest (no replica, or older than
    the raw records' retention) in proportion to ``mix[endpoint]`` (its profiles' billed GPU-hours over the period,
    or its current profile when it had none). Where the records count more than the rollups (records not yet rolled
    up), the rollup total is split in the records' proportions. Every counter sums to its total.
    """
    known: dict[Key, dict[int, dict[str, float]]] = defaultdict(dict)
    for row in served:
        known[(row.endpoint_id, row.tenant_id)][row.profile_id] = row.sums
    result: dict[Key, dict[int, dict[str, float]]] = {}
    for key, sums in totals.items():
        endpoint_mix = dict(mix.get(key[0], {}))
        by_record = known.get(key, {})
        profiles = sorted(set(endpoint_mix) | set(by_record))
        if not profiles:
            result[key] = {}
            continue
        split: dict[int, dict[str, float]] = {p: {} for p in profiles}
        for counter in SPLIT_COUNTERS:
            total = float(sums.get(counter, 0.0) or 0.0)
            seen = [float(by_record.get(p, {}).get(counter, 0.0) or 0.0) for p in profiles]
            if sum(seen) >= total:
                parts = _allocate(counter, total, seen) if sum(seen) > 0 else [0.0] * len(profiles)
            else:
                rest = _allocate(counter, total - sum(seen), [endpoint_mix.get(p, 0.0) for p in profiles])
                parts = [s + r for s, r in zip(seen, rest, strict=True)]
            for p, part in zip(profiles, parts, strict=True):
                split[p][counter] = part
        result[key] = split
    return result


def gpu_hours_mix(seconds: Iterable[ProfileSeconds], profiles: Mapping[int, Profile]) -> dict[int, dict[int, float]]:
    """Per endpoint, billed GPU-hours per profile (the weights for usage no record attributes)."""
    mix: dict[int, dict[int, float]] = defaultdict(dict)
    for row in seconds:
        gpu_hours = profiles[row.profile_id].gpu_hours(row.billed_s)
        if gpu_hours > 0:
            mix[row.endpoint_id][row.profile_id] = mix[row.endpoint_id].get(row.profile_id, 0.0) + gpu_hours
    return dict(mix)


def _blank(profile: Profile) -> ProfileCost:
    return ProfileCost(profile_id=profile.profile_id, profile=profile.name, capacity_type=profile.capacity_type)


def _add_usage(cost: ProfileCost, sums: Mapping[str, float]) -> None:
    cost.requests += int(sums.get("requests", 0))
    cost.good_requests += int(sums.get("good", 0))
    cost.output_tokens += int(sums.get("output_tokens", 0))
    cost.good_output_tokens += int(sums.get("good_output_tokens", 0))
    cost.used_mu += float(sums.get("mu", 0.0))


def endpoint_profile_costs(
    *,
    seconds: Iterable[ProfileSeconds],
    profiles: Mapping[int, Profile],
    usage: Mapping[Key, Mapping[int, Mapping[str, float]]],
) -> dict[int, list[ProfileCost]]:
    """Per endpoint, per profile: GPU-hours and dollars of its replicas on that profile, and the usage they served.

    The endpoint line's GPU-hours and dollars are these rows' sums (each replica at its own profile's rate).
    """
    rows: dict[int, dict[int, ProfileCost]] = defaultdict(dict)
    for s in seconds:
        profile = profiles[s.profile_id]
        cost = rows[s.endpoint_id].setdefault(s.profile_id, _blank(profile))
        cost.gpu_hours += profile.gpu_hours(s.billed_s)
        cost.usd += profile.unit_hours(s.billed_s) * (profile.usd_per_gpu_hour or 0.0)
    for (endpoint_id, _), by_profile in usage.items():
        for profile_id, sums in by_profile.items():
            _add_usage(rows[endpoint_id].setdefault(profile_id, _blank(profiles[profile_id])), sums)
    return {
        endpoint_id: [c.finish() for _, c in sorted(by_profile.items(), key=lambda kv: kv[1].profile)]
        for endpoint_id, by_profile in rows.items()
    }


def tenant_profile_costs(
    *,
    endpoint_rows: Sequence[ProfileCost],
    tenant_usage: Mapping[int, Mapping[str, float]],
    gpu_hours: float,
    usd: float,
    pays_all: bool,
) -> list[ProfileCost]:
    """A tenant line's split: its own usage per profile; its GPU-hours and dollars (the line's totals, unchanged)
    spread in proportion to its part of each profile's used MU × that profile's GPU-hours (dollars). An owner who
    pays for all of a dedicated endpoint gets the endpoint's own proportions, idle profiles included."""
    if pays_all:
        fractions = [1.0] * len(endpoint_rows)
    else:
        fractions = [
            float(tenant_usage.get(r.profile_id, {}).get("mu", 0.0)) / r.used_mu if r.used_mu > 0 else 0.0
            for r in endpoint_rows
        ]
    hour_weights = [f * r.gpu_hours for f, r in zip(fractions, endpoint_rows, strict=True)]
    usd_weights = [f * r.usd for f, r in zip(fractions, endpoint_rows, strict=True)]
    if sum(hour_weights) <= 0:  # its usage ran on profiles with no billed hours in the period: by its MU there
        hour_weights = fractions
    if sum(usd_weights) <= 0:
        usd_weights = hour_weights
    result = []
    for i, row in enumerate(endpoint_rows):
        cost = ProfileCost(profile_id=row.profile_id, profile=row.profile, capacity_type=row.capacity_type)
        _add_usage(cost, tenant_usage.get(row.profile_id, {}))
        cost.gpu_hours = gpu_hours * hour_weights[i] / sum(hour_weights) if sum(hour_weights) > 0 else 0.0
        cost.usd = usd * usd_weights[i] / sum(usd_weights) if sum(usd_weights) > 0 else 0.0
        result.append(cost.finish())
    return [c for c in result if c.gpu_hours or c.usd or c.requests or c.used_mu]


@dataclass(kw_only=True)
class CapacityTypeCost(CostFigures):
    """All profiles of one capacity type (on-demand or spot) together."""

    capacity_type: str


def fleet_breakdown(rows: Iterable[ProfileCost]) -> tuple[list[ProfileCost], list[CapacityTypeCost]]:
    """Profile rows of many lines summed per profile and per capacity type (sorted by name)."""
    by_profile: dict[int, ProfileCost] = {}
    by_type: dict[str, CapacityTypeCost] = {}
    for row in rows:
        total = by_profile.setdefault(
            row.profile_id,
            ProfileCost(profile_id=row.profile_id, profile=row.profile, capacity_type=row.capacity_type),
        )
        kind = by_type.setdefault(row.capacity_type, CapacityTypeCost(capacity_type=row.capacity_type))
        for target in (total, kind):
            target.gpu_hours += row.gpu_hours
            target.usd += row.usd
            target.requests += row.requests
            target.good_requests += row.good_requests
            target.output_tokens += row.output_tokens
            target.good_output_tokens += row.good_output_tokens
            target.used_mu += row.used_mu
    return (
        [c.finish() for c in sorted(by_profile.values(), key=lambda c: c.profile)],
        [c.finish() for c in sorted(by_type.values(), key=lambda c: c.capacity_type)],
    )


@dataclass
class StatementPart:
    """The part of a statement line served by one hardware profile."""

    profile_id: int
    profile: str
    capacity_type: str
    share: float  # of the line's cost
    used_mu: float
    requests: int
    good_output_tokens: int
    reserved_usd: float
    overage_usd: float
    total_usd: float


def statement_parts(
    *,
    reserved_usd: float,
    overage_usd: float,
    usage: Mapping[int, Mapping[str, float]],
    mix: Mapping[int, float],
    profiles: Mapping[int, Profile],
) -> list[StatementPart]:
    """A statement line's cost split over the profiles that served the tenant, in proportion to the MU it used on
    each (``usage``, from ``usage_by_profile``); with no use, by the endpoint's GPU-hour ``mix`` (its reservation
    was held on that fleet). Total and reserved dollars split to micro-dollars, so the parts sum to the line's
    rounded ``total_usd`` and ``reserved_usd`` exactly; each part's overage is its total less its reserved part."""
    ids = sorted(set(usage) | set(mix), key=lambda p: profiles[p].name)
    if not ids:
        return []
    weights = [float(usage.get(p, {}).get("mu", 0.0)) for p in ids]
    if sum(weights) <= 0:
        weights = [float(mix.get(p, 0.0)) for p in ids]
    totals = split_amount(reserved_usd + overage_usd, weights)
    reserved = split_amount(reserved_usd, weights)
    scale = sum(weights) or float(len(ids))
    parts = []
    for i, p in enumerate(ids):
        sums = usage.get(p, {})
        parts.append(
            StatementPart(
                profile_id=p,
                profile=profiles[p].name,
                capacity_type=profiles[p].capacity_type,
                share=(weights[i] if sum(weights) > 0 else 1.0) / scale,
                used_mu=float(sums.get("mu", 0.0)),
                requests=int(sums.get("requests", 0)),
                good_output_tokens=int(sums.get("good_output_tokens", 0)),
                reserved_usd=reserved[i],
                overage_usd=round(totals[i] - reserved[i], USD_PLACES),
                total_usd=totals[i],
            )
        )
    return [part for part in parts if part.share > 0 or part.total_usd]
