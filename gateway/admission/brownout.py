"""Graceful degradation under overload (pure, no Django, injected clock): an endpoint's degradation level, who
takes the pain of an overload (``FairPain``: in proportion to how far each tenant exceeds its reservation over a
window), and the rules a chain of fallback endpoints must keep. The proxy's ``EndpointRuntime`` and the overload
simulator (``benchmarks.operations.overload``) run this same code. See docs/algorithms.md, "Brownout"."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from gateway.admission.classes import CRITICAL, SHEDDABLE, STANDARD

# Degradation levels, sent to clients as ``x-infercap-degradation-level``: degrade, then shed, class by class.
LEVEL_NORMAL = 0  # nobody degraded
LEVEL_DEGRADE_SHEDDABLE = 1  # sheddable requests may be served shorter
LEVEL_DEGRADE_STANDARD = 2  # sheddable ones are being shed (or sent to a fallback); standard ones served shorter
LEVEL_SHEDDING = 3  # standard ones are being shed too
DEGRADE_AT = 0.25  # sheddable degrades once the work queued ahead of it takes this share of its max age to drain
# A new request is a shedding candidate once the work ahead of it takes this share of its class's max age to
# drain: sheddable a little before the age limit would shed it (so few are shed by age, on whoever waited), the
# others only once they would be.
SHED_AT: dict[str, float] = {CRITICAL: 1.0, STANDARD: 1.0, SHEDDABLE: 0.75}
# The classes served shorter from each level on; critical is never degraded.
DEGRADED_FROM_LEVEL: dict[str, int] = {SHEDDABLE: LEVEL_DEGRADE_SHEDDABLE, STANDARD: LEVEL_DEGRADE_STANDARD}
SHED_MEMORY_S = 2.0  # a class counts as being shed this long after a request of it was refused for overload
PAIN_WINDOW_S = 30.0
MAX_FALLBACK_DEPTH = 2  # primary → fallback → its fallback, at most


def queue_wait_s(queued_mu_ahead: float, drain_mu_per_s: float) -> float:
    """Seconds the work queued ahead of a new request takes to drain at the measured rate."""
    if queued_mu_ahead <= 0:
        return 0.0
    return queued_mu_ahead / drain_mu_per_s if drain_mu_per_s > 0 else float("inf")


def degradation_level(
    *, mu_ahead_of: Callable[[str], float], drain_mu_per_s: float, max_age_s: Mapping[str, float]
) -> int:
    """The endpoint's level from its queue: how long the work queued at or above each class takes to drain,
    against that class's max queue age. Sheddable work degrades first; once it is being shed, standard work
    degrades; then standard work is shed too."""
    share = {c: queue_wait_s(mu_ahead_of(c), drain_mu_per_s) / max(max_age_s[c], 1e-9) for c in (STANDARD, SHEDDABLE)}
    if share[STANDARD] >= SHED_AT[STANDARD]:
        return LEVEL_SHEDDING
    if share[SHEDDABLE] >= SHED_AT[SHEDDABLE]:
        return LEVEL_DEGRADE_STANDARD
    if share[SHEDDABLE] >= DEGRADE_AT:
        return LEVEL_DEGRADE_SHEDDABLE
    return LEVEL_NORMAL


# The level from which each class is being shed: from there on every request of it is served shorter, whoever's
# turn it is, since the alternative is a refusal ("degrade before refusing").
SHED_FROM_LEVEL: dict[str, int] = {SHEDDABLE: LEVEL_DEGRADE_STANDARD, STANDARD: LEVEL_SHEDDING}


def shedding_at(priority: str, level: int) -> bool:
    return level >= SHED_FROM_LEVEL.get(priority, LEVEL_SHEDDING + 1)


def degraded_at(priority: str, level: int) -> bool:
    """Whether requests of this class may be served shorter at this level (never critical)."""
    return priority != CRITICAL and level >= DEGRADED_FROM_LEVEL.get(priority, LEVEL_SHEDDING + 1)


def slot_share_cap(limit: int, share: float) -> int:
    """Slots of a replica with ``limit`` that the degraded classes may hold together under a slot share."""
    return int(max(0.0, min(1.0, share)) * limit + 1e-9)


def slot_allowed(priority: str, level: int, *, running: Mapping[str, int], limit: int, share: float | None) -> bool:
    """Whether a request of ``priority`` may take a slot of a replica running ``running`` (class → requests) of
    ``limit`` slots, by the endpoint's slot share: at a level where its class degrades, the classes degraded
    there together hold at most ``slot_share_cap(limit, share)`` of the replica's slots, so the rest stay free
    for the classes above (critical is never held back). The replica's own limit is the caller's to check."""
    if share is None or not degraded_at(priority, level):
        return True
    held = sum(n for cls, n in running.items() if degraded_at(cls, level))
    return held < slot_share_cap(limit, share)


class _Tenant:
    __slots__ = ("arrivals", "offered_mu", "reserved_mu_per_s", "pains", "degrade_credit")

    def __init__(self) -> None:
        self.arrivals: deque[tuple[float, float]] = deque()
        self.offered_mu = 0.0
        self.reserved_mu_per_s = 0.0
        self.pains: deque[float] = deque()
        self.degrade_credit = 0.0


class FairPain:
    """Over the last ``window_s``: each tenant's offered MU, its excess (offered minus what its reservation covers
    in the window, at least 0) and the refusals (shed or sent to a fallback) it took. The victim of the next
    refusal is the tenant whose share of the refusals is furthest below its share of the excess, so refusals
    fall on tenants in proportion to their excess, not on whoever arrived last. Degradation follows the same
    proportion by credit: each arrival adds its tenant's excess fraction (excess / offered), and a request is
    served shorter when its tenant's credit reaches one. A tenant within its reservation is neither while another
    exceeds one; when nobody does, every tenant counts as all excess."""

    def __init__(self, *, window_s: float = PAIN_WINDOW_S, now: float = 0.0) -> None:
        self.window_s = window_s
        self.started = now
        self.tenants: dict[str, _Tenant] = {}

    def arrived(self, tenant: str, mu: float, *, reserved_mu_per_s: float, now: float) -> None:
        t = self.tenants.get(tenant)
        if t is None:
            t = self.tenants[tenant] = _Tenant()
        t.arrivals.append((now, mu))
        t.offered_mu += mu
        t.reserved_mu_per_s = reserved_mu_per_s

    def pained(self, tenant: str, now: float) -> None:
        t = self.tenants.get(tenant)
        if t is None:
            t = self.tenants[tenant] = _Tenant()
        t.pains.append(now)

    def _prune(self, now: float) -> None:
        cutoff = now - self.window_s
        for name, t in list(self.tenants.items()):
            while t.arrivals and t.arrivals[0][0] < cutoff:
                t.offered_mu -= t.arrivals.popleft()[1]
            while t.pains and t.pains[0] < cutoff:
                t.pains.popleft()
            if not t.arrivals and not t.pains:
                del self.tenants[name]

    def excess(self, now: float) -> dict[str, float]:
        """Each tenant's MU offered over what its reservation covers in the window; all of it when nobody is over."""
        self._prune(now)
        span = max(1e-9, min(self.window_s, now - self.started))
        out = {n: max(0.0, t.offered_mu - t.reserved_mu_per_s * span) for n, t in self.tenants.items()}
        if not any(v > 1e-9 for v in out.values()):
            return {n: max(0.0, t.offered_mu) for n, t in self.tenants.items()}
        return out

    def owed(self, now: float) -> dict[str, float]:
        """Refusals each tenant should still take for the window's refusals to match its share of the excess (one
        more refusal counted, so the tenant that owes most is the next victim)."""
        excess = self.excess(now)
        total_excess = sum(excess.values())
        pains = {n: len(t.pains) for n, t in self.tenants.items()}
        total = sum(pains.values()) + 1
        if total_excess <= 0:
            return {n: -p for n, p in pains.items()}
        return {n: excess[n] / total_excess * total - pains[n] for n in self.tenants}

    def victim(self, candidates: list[str], now: float) -> str:
        """The candidate that owes the most refusals (ties: the first listed)."""
        owed = self.owed(now)
        return max(candidates, key=lambda name: owed.get(name, 0.0))

    def take_degrade_credit(self, tenant: str, now: float) -> bool:
        """Whether this request of ``tenant`` is the one of its requests to serve shorter (credit by excess)."""
        t = self.tenants.get(tenant)
        if t is None or t.offered_mu <= 0:
            return False
        fraction = min(1.0, self.excess(now).get(tenant, 0.0) / max(t.offered_mu, 1e-9))
        t.degrade_credit += fraction
        if t.degrade_credit >= 1.0 - 1e-9:
            t.degrade_credit -= 1.0
            return True
        return False


def fallback_chain_error(start: int, next_of: Mapping[int, int | None], *, max_depth: int = MAX_FALLBACK_DEPTH):
    """Why the chain of fallbacks from ``start`` is not allowed (a loop, or longer than ``max_depth``), else None.
    ``next_of`` maps an endpoint id to its fallback's id (None: it has none)."""
    seen = [start]
    current = next_of.get(start)
    while current is not None:
        if current in seen:
            return "loop"
        seen.append(current)
        if len(seen) - 1 > max_depth:
            return "depth"
        current = next_of.get(current)
    return None
