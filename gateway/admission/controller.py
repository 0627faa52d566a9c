"""One endpoint's admission decisions with no I/O: whether an arriving request skips the queue, waits or is
refused; which waiting requests are shed for age; which goes next; and each refusal's Retry-After.

The proxy's ``EndpointRuntime`` and the simulators drive this one object with their own clocks and slot counts,
so overload figures from a simulation come from the code that admits live traffic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.admission.brownout import (
    SHED_AT,
    SHED_FROM_LEVEL,
    SHED_MEMORY_S,
    FairPain,
    degradation_level,
    degraded_at,
    queue_wait_s,
    shedding_at,
    slot_allowed,
)
from gateway.admission.classes import CRITICAL, SHEDDABLE, STANDARD
from gateway.admission.drain import DrainRateMeter, retry_after_s
from gateway.admission.queue import AdmissionQueue, QueuedItem

# The proxy's defaults (``gateway.proxy.config.ProxyConfig``): per endpoint and proxy process.
DEFAULT_MAX_QUEUE = 512
DEFAULT_MAX_AGE_S: dict[str, float] = {CRITICAL: 30.0, STANDARD: 10.0, SHEDDABLE: 2.0}
# Why a request was refused: 429 for all but the last, 503 for it. ``overloaded``: it would have waited past
# ``brownout.SHED_AT`` of its class's max age, and fair pain picked its tenant (``brownout.FairPain``).
QUEUE_FULL, QUEUE_AGE, EVICTED, OVERLOADED, NO_REPLICA = (
    "queue_full",
    "queue_age",
    "evicted",
    "overloaded",
    "no_replica",
)
SHED_REASONS: tuple[str, ...] = (QUEUE_FULL, QUEUE_AGE, EVICTED, OVERLOADED, NO_REPLICA)


@dataclass(frozen=True)
class Refusal:
    item: QueuedItem
    reason: str  # one of SHED_REASONS
    retry_after_s: int


@dataclass
class Enqueued:
    """What offering a request to the queue did: ``refused`` is set when it was not queued; ``evicted`` lists the
    sheddable requests pushed out to make room for it (each to be answered 429 ``evicted``)."""

    refused: Refusal | None = None
    evicted: list[Refusal] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return self.refused is None


class AdmissionController:
    """The queue and the drain meter of one endpoint. ``in_flight_mu`` (MU running on its replicas) and
    ``nominal_mu_per_s`` (the serving replicas' capacity, used until something has finished) come from the caller
    whenever a Retry-After may be needed, because the caller owns the replicas' slots."""

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_age_s: dict[str, float] | None = None,
        quantum_mu: float = 0.0,
        drain_tau_s: float = 10.0,
        now: float = 0.0,
        fair_pain: bool = True,
    ) -> None:
        self.queue = AdmissionQueue(
            max_size=max_queue, max_age_s=DEFAULT_MAX_AGE_S if max_age_s is None else max_age_s, quantum_mu=quantum_mu
        )
        self.drain = DrainRateMeter(tau_s=drain_tau_s, now=now)
        # Without it (``fair_pain=False``) an overload sheds by queue age and size alone, on whoever waited.
        self.pain: FairPain | None = FairPain(now=now) if fair_pain else None
        self._last_shed: dict[str, float] = {}  # class → when a request of it was last refused for overload
        # When the queue last went from empty to holding requests (None while empty): a queue that has held requests
        # for a whole drain time constant means every slot has been busy that long, so the measured drain rate is
        # the replicas' real capacity, whatever the model profile's coefficients claim.
        self._busy_since: float | None = None

    # -- brownout (``gateway.admission.brownout``) ------------------------------------------------------
    def arrived(self, *, tenant: str, mu: float, reserved_mu_per_s: float, now: float) -> None:
        """Every request that reaches admission, queued or not: what fair pain measures excess on."""
        if self.pain is not None:
            self.pain.arrived(tenant, mu, reserved_mu_per_s=reserved_mu_per_s, now=now)

    def _drain_rate(self, now: float, nominal_mu_per_s: float) -> float:
        rate = self.drain.rate_mu_per_s(now)
        return rate if rate > 0 else nominal_mu_per_s

    def level(self, *, now: float, nominal_mu_per_s: float) -> int:
        """The endpoint's degradation level now (0 normal … 3 shedding): from the queue, and at least the level at
        which a class is shed while requests of it were refused for overload in the last ``SHED_MEMORY_S`` (the
        early refusals keep the queue just short of the shedding threshold, so the queue alone would read lower)."""
        recent = max(
            (
                shed_level
                for cls, shed_level in SHED_FROM_LEVEL.items()
                if now - self._last_shed.get(cls, -1e18) <= SHED_MEMORY_S
            ),
            default=0,
        )
        if not len(self.queue):
            return recent
        rate = self._drain_rate(now, nominal_mu_per_s)
        queued = degradation_level(
            mu_ahead_of=self.queue.mu_ahead_of, drain_mu_per_s=rate, max_age_s=self.queue.max_age_s
        )
        return max(queued, recent)

    def degrade(self, *, tenant: str, priority: str, now: float, nominal_mu_per_s: float) -> bool:
        """Whether to serve this request shorter: its class degrades at the current level and either its class is
        being shed (a shorter answer beats a refusal) or, by fair pain, it is its tenant's turn by the tenant's
        excess over its reservation."""
        level = self.level(now=now, nominal_mu_per_s=nominal_mu_per_s)
        if not degraded_at(priority, level):
            return False
        return self.pain is None or shedding_at(priority, level) or self.pain.take_degrade_credit(tenant, now)

    def held_back(
        self,
        priority: str,
        replicas: Mapping[str, tuple[Mapping[str, int], int]],
        *,
        share: float | None,
        now: float,
        nominal_mu_per_s: float,
    ) -> set[str] | None:
        """The endpoint's slot share for a request of this class: None when it is not in force (no share, a class
        that does not degrade at the level now, critical); else the replicas (id → (running requests by class,
        slots)) on which the classes degraded at this level already hold their share (``brownout.slot_allowed``).
        A request held back on every replica waits in the queue, or is refused by it, as one that found no slot."""
        if share is None or priority == CRITICAL:
            return None
        level = self.level(now=now, nominal_mu_per_s=nominal_mu_per_s)
        if not degraded_at(priority, level):
            return None
        return {
            rid
            for rid, (running, limit) in replicas.items()
            if not slot_allowed(priority, level, running=running, limit=limit, share=share)
        }

    def next_class(self) -> str | None:
        """The class of the request ``next_to_serve`` would return: a freed slot goes to it only if it may take one."""
        return self.queue.next_class()

    def _track_busy(self, now: float) -> None:
        if not len(self.queue):
            self._busy_since = None
        elif self._busy_since is None:
            self._busy_since = now

    def overload_rate(self, now: float, nominal_mu_per_s: float) -> float:
        """The drain rate fair pain judges a request's wait by. Optimistic, ``max(measured, nominal)``, so nothing
        is refused early while the measured rate still reflects a lighter load; but once the queue has held
        requests for ``drain.tau_s`` the replicas have been saturated for the meter's whole window, and the
        measured rate alone is what they can do: a profile whose nominal rate is too high (never fitted for these
        replicas) would otherwise keep early shedding, and with it fair pain, off for the whole overload."""
        measured = self.drain.rate_mu_per_s(now)
        if measured > 0 and self._busy_since is not None and now - self._busy_since >= self.drain.tau_s:
            return measured
        return max(measured, nominal_mu_per_s)

    def _overload_victim(self, item: QueuedItem, now: float, rate: float) -> QueuedItem | None:
        """When ``item`` would wait past SHED_AT of its max age: the request of its class to refuse instead, the
        newest queued one of the tenant fair pain picks (``item`` itself when that is its own tenant)."""
        if self.pain is None or rate <= 0:
            return None  # nothing serves yet (scaling from zero): the request waits for the first replica
        ahead = self.queue.mu_ahead_of(item.priority)
        if ahead <= 0:
            return None  # nothing queued ahead: however long the request is, it waits only for the next free slot
        wait_s = queue_wait_s(ahead + item.mu, rate)
        if wait_s < SHED_AT[item.priority] * self.queue.max_age_s[item.priority]:
            return None
        newest = self.queue.newest_by_tenant(item.priority)
        victim = self.pain.victim([item.tenant, *(t for t in newest if t != item.tenant)], now)
        return item if victim == item.tenant else newest[victim]

    def _pained(self, refusals: list[Refusal], now: float) -> None:
        for refusal in refusals:
            if refusal.reason != NO_REPLICA:
                self._last_shed[refusal.item.priority] = now
                if self.pain is not None:
                    self.pain.pained(refusal.item.tenant, now)

    def may_skip_queue(self) -> bool:
        """A request may go straight to a free slot only when nobody waits: it must not overtake queued work."""
        return not len(self.queue)

    def retry_after(self, priority: str, *, now: float, in_flight_mu: float, nominal_mu_per_s: float) -> int:
        """Seconds until the MU ahead of a request of this class (queued at its class and above, plus in flight)
        should have drained at the measured rate; the nominal rate before anything has finished."""
        rate = self.drain.rate_mu_per_s(now)
        if rate <= 0:
            rate = nominal_mu_per_s
        return retry_after_s(queued_mu=self.queue.mu_ahead_of(priority) + in_flight_mu, drain_mu_per_s=rate)

    def enqueue(
        self,
        item: QueuedItem,
        *,
        now: float,
        has_replicas: bool,
        scale_to_zero: bool,
        in_flight_mu: float,
        nominal_mu_per_s: float,
    ) -> Enqueued:
        """Queue a request that could not go now. An endpoint with no replica refuses it unless it scales from
        zero (then the request waits for the first replica); a full queue evicts or refuses (``AdmissionQueue``)."""
        load = {"now": now, "in_flight_mu": in_flight_mu, "nominal_mu_per_s": nominal_mu_per_s}
        if not has_replicas and not scale_to_zero:
            return Enqueued(refused=Refusal(item, NO_REPLICA, self.retry_after(item.priority, **load)))
        # A request is refused ahead of its age limit only when even the optimistic rate would not serve it in time.
        if self._busy_since is None:  # this request found no free slot: the replicas are saturated from now
            self._busy_since = now
        victim = self._overload_victim(item, now, self.overload_rate(now, nominal_mu_per_s))
        if victim is item:
            refused = Refusal(item, OVERLOADED, self.retry_after(item.priority, **load))
            self._pained([refused], now)
            return Enqueued(refused=refused)
        if victim is not None:
            self.queue.remove(victim)
        result = self.queue.offer(item, now)
        self._track_busy(now)
        # Retry-Afters are computed once the queue has changed: a victim waits behind the request that took its place.
        victims = ([victim] if victim is not None else []) + result.evicted
        evicted = [Refusal(v, EVICTED, self.retry_after(v.priority, **load)) for v in victims]
        self._pained(evicted, now)
        if not result.admitted:
            refused = Refusal(item, result.reason, self.retry_after(item.priority, **load))
            self._pained([refused], now)
            return Enqueued(refused=refused, evicted=evicted)
        return Enqueued(evicted=evicted)

    def shed_expired(self, *, now: float, in_flight_mu: float, nominal_mu_per_s: float) -> list[Refusal]:
        """Remove every request older than its class's max queue age; call before ``next_to_serve``."""
        expired = self.queue.expire(now)
        self._track_busy(now)
        load = {"now": now, "in_flight_mu": in_flight_mu, "nominal_mu_per_s": nominal_mu_per_s}
        refusals = [Refusal(item, QUEUE_AGE, self.retry_after(item.priority, **load)) for item in expired]
        self._pained(refusals, now)
        return refusals

    def next_to_serve(self, now: float) -> QueuedItem | None:
        """The queued request a freed slot goes to: strict priority, then deficit round robin across tenants."""
        item = self.queue.pop(now)
        self._track_busy(now)
        return item

    def remove(self, item: QueuedItem) -> bool:
        """Its client went away while it waited; False when it was no longer queued."""
        removed = self.queue.remove(item)
        if not len(self.queue):
            self._busy_since = None
        return removed

    def next_expiry(self) -> float | None:
        """When the next queued request goes over age (for the caller's timer)."""
        return self.queue.next_expiry()

    def finished(self, *, mu_done: float, now: float) -> None:
        """A request left its replica having cost ``mu_done`` (0 for a failure): feeds the drain rate."""
        self.drain.record(mu_done, now)
