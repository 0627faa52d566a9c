"""One endpoint's admission decisions with no I/O: whether an arriving request skips the queue, waits or is
refused; which waiting requests are shed for age; which goes next; and each refusal's Retry-After.

The proxy's ``EndpointRuntime`` and the simulators drive this one object with their own clocks and slot counts,
so overload figures from a simulation come from the code that admits live traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from endpoints.admission.classes import CRITICAL, SHEDDABLE, STANDARD
from endpoints.admission.drain import DrainRateMeter, retry_after_s
from endpoints.admission.queue import AdmissionQueue, QueuedItem

# The proxy's defaults (``endpoints.proxy.config.ProxyConfig``): per endpoint and proxy process.
DEFAULT_MAX_QUEUE = 512
DEFAULT_MAX_AGE_S: dict[str, float] = {CRITICAL: 30.0, STANDARD: 10.0, SHEDDABLE: 2.0}
# Why a request was refused: 429 for the first three, 503 for the last.
QUEUE_FULL, QUEUE_AGE, EVICTED, NO_REPLICA = "queue_full", "queue_age", "evicted", "no_replica"
SHED_REASONS: tuple[str, ...] = (QUEUE_FULL, QUEUE_AGE, EVICTED, NO_REPLICA)


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
    ) -> None:
        self.queue = AdmissionQueue(
            max_size=max_queue, max_age_s=DEFAULT_MAX_AGE_S if max_age_s is None else max_age_s, quantum_mu=quantum_mu
        )
        self.drain = DrainRateMeter(tau_s=drain_tau_s, now=now)

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
        result = self.queue.offer(item, now)
        # Retry-Afters are computed once the queue has changed: a victim waits behind the request that took its place.
        evicted = [Refusal(victim, EVICTED, self.retry_after(victim.priority, **load)) for victim in result.evicted]
        if not result.admitted:
            return Enqueued(
                refused=Refusal(item, result.reason, self.retry_after(item.priority, **load)), evicted=evicted
            )
        return Enqueued(evicted=evicted)

    def shed_expired(self, *, now: float, in_flight_mu: float, nominal_mu_per_s: float) -> list[Refusal]:
        """Remove every request older than its class's max queue age; call before ``next_to_serve``."""
        expired = self.queue.expire(now)
        load = {"now": now, "in_flight_mu": in_flight_mu, "nominal_mu_per_s": nominal_mu_per_s}
        return [Refusal(item, QUEUE_AGE, self.retry_after(item.priority, **load)) for item in expired]

    def next_to_serve(self, now: float) -> QueuedItem | None:
        """The queued request a freed slot goes to: strict priority, then deficit round robin across tenants."""
        return self.queue.pop(now)

    def remove(self, item: QueuedItem) -> bool:
        """Its client went away while it waited; False when it was no longer queued."""
        return self.queue.remove(item)

    def next_expiry(self) -> float | None:
        """When the next queued request goes over age (for the caller's timer)."""
        return self.queue.next_expiry()

    def finished(self, *, mu_done: float, now: float) -> None:
        """A request left its replica having cost ``mu_done`` (0 for a failure): feeds the drain rate."""
        self.drain.record(mu_done, now)
