"""The fleet page at a glance: totals over every endpoint shown (GPUs held, replicas by state, dollars per hour,
MU have / sold / used), and the compact, sortable, paginated table that replaces the cards when there are many.

The totals come from the same ledger rows the cards show, plus one grouped query for the GPUs and their price
(each replica on its own hardware profile: a spot or prefill pool's, else its endpoint's).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.core.paginator import Paginator
from django.db.models import Count
from django.db.models.functions import Coalesce

from capacity.models import HardwareProfile
from endpoints.models import Replica, ReplicaState

# Replica states that hold a GPU (or are about to): what the fleet pays for.
HOLDING = (ReplicaState.PENDING, ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)
CARDS_UP_TO = 12  # more endpoints than this: the table, unless the cards are asked for
PAGE_SIZE = 50

# Sort keys of the table: (label, key of a row). Missing figures sort last whichever way.
SORTS = {
    "name": ("Endpoint", lambda row: row.endpoint.name),
    "ready": ("Ready", lambda row: row.states.get(ReplicaState.READY, 0)),
    "have": ("Have MU/min", lambda row: row.ledger.have_mu_per_min),
    "sold": ("Sold MU/min", lambda row: row.ledger.sold_mu_per_min),
    "used": ("Used MU/min (1 h)", lambda row: row.ledger.used_mu_per_min_1h),
    "utilization": ("Utilization (1 h)", lambda row: row.ledger.utilization_1h),
    # More whole replicas of the endpoint's TP size the free GPUs hold (docs/placement.md, "In the ledger").
    "room": ("Room (whole replicas)", lambda row: row.ledger.whole_replicas_free),
    "budget": ("Budget left", lambda row: row.worst_budget),
    "burn": ("Burn (1 h)", lambda row: row.max_burn_1h),
}


@dataclass
class FleetTotals:
    endpoints: int = 0
    states: Counter = field(default_factory=Counter)
    gpus: int = 0
    mig_slices: int = 0  # MIG slices held: a slice is not a GPU (its price is the slice's)
    usd_per_hour: float = 0.0
    unpriced_gpus: int = 0  # GPUs on a profile with no list price: not in the dollar figure
    have_mu_per_min: float = 0.0
    sold_mu_per_min: float = 0.0
    used_mu_per_min_1h: float = 0.0


def fleet_totals(rows) -> FleetTotals:
    totals = FleetTotals(endpoints=len(rows))
    for row in rows:
        totals.states.update(row.states)
        totals.have_mu_per_min += row.ledger.have_mu_per_min
        totals.sold_mu_per_min += row.ledger.sold_mu_per_min
        totals.used_mu_per_min_1h += row.ledger.used_mu_per_min_1h
    held = (
        Replica.objects.filter(endpoint_id__in=[row.endpoint.pk for row in rows], state__in=HOLDING)
        .annotate(profile_id=Coalesce("hardware_profile_id", "endpoint__hardware_profile_id"))
        .values("profile_id")
        .annotate(n=Count("id"))
    )
    counts = {entry["profile_id"]: entry["n"] for entry in held}
    for profile in HardwareProfile.objects.filter(pk__in=counts):
        gpus = counts[profile.pk] * profile.gpus_per_replica
        if profile.mig_profile:
            totals.mig_slices += gpus
        else:
            totals.gpus += gpus
        if profile.usd_per_gpu_hour is None:
            totals.unpriced_gpus += gpus
        else:
            totals.usd_per_hour += gpus * profile.usd_per_gpu_hour
    return totals


def table_page(rows, *, sort: str, descending: bool, page: str | int | None):
    """The rows sorted by ``sort`` (a key of SORTS; unknown: name) and cut to one page."""
    key = SORTS.get(sort, SORTS["name"])[1]
    known = [row for row in rows if key(row) is not None]
    missing = [row for row in rows if key(row) is None]
    ordered = sorted(known, key=key, reverse=descending) + missing
    return Paginator(ordered, PAGE_SIZE).get_page(page)


def shows_table(view: str | None, endpoints: int) -> bool:
    return view == "table" or (view != "cards" and endpoints > CARDS_UP_TO)
