"""The proxy's admission in the discrete-event simulator (pure): ``gateway.admission.AdmissionController`` behind
the simulation's ``Admission`` hook, so priority order, tenant fairness, eviction, queue-age shedding and
Retry-After in a simulated overload are the production ones.

What the proxy's ``EndpointRuntime`` adds around the controller is done here from the simulation's replica views:
a replica serves when it is healthy and not draining (the proxy's snapshot holds only those); it has a free slot
below its ``concurrency_limit``; the engine ``priority`` sent is the class's (``ENGINE_PRIORITY``), never the
client's; finished requests feed the drain rate with their MU.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.admission.classes import ENGINE_PRIORITY, STANDARD
from gateway.admission.controller import DEFAULT_MAX_QUEUE, AdmissionController, Refusal
from gateway.admission.queue import QueuedItem
from gateway.routing.base import ReplicaView, RouteRequest
from simulator.interfaces import Rejection, Verdict


class ProxyAdmission:
    """``max_queue``, ``max_age_s`` (per class) default to the proxy's. ``replica_mu_per_s`` is a replica's nominal
    drain rate, used for Retry-After until something has finished (the proxy's ``mu_per_min / 60``); None takes
    the views' ``mu_capacity``, which the proxy fills with that figure. ``scale_to_zero``: with no serving replica,
    queue (True) or refuse with 503 ``no_replica`` (False, the endpoint default)."""

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        max_age_s: dict[str, float] | None = None,
        replica_mu_per_s: float | None = None,
        scale_to_zero: bool = False,
        start_s: float = 0.0,
        fair_pain: bool = True,
    ) -> None:
        self.controller = AdmissionController(
            max_queue=max_queue, max_age_s=max_age_s, now=start_s, fair_pain=fair_pain
        )
        self.replica_mu_per_s = replica_mu_per_s
        self.scale_to_zero = scale_to_zero

    def offer(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> Verdict:
        priority = request.extra.get("priority_class") or STANDARD
        request.extra["priority"] = ENGINE_PRIORITY[priority]
        serving = _serving(replicas)
        tenant = str(request.extra.get("tenant", ""))
        reserved = float(request.extra.get("reserved_mu_per_s", 0.0))
        self.controller.arrived(tenant=tenant, mu=request.mu, reserved_mu_per_s=reserved, now=now)
        if self.controller.may_skip_queue() and _free_slots(serving) > 0:
            return Verdict(dispatch=[request])
        item = QueuedItem(
            request_id=request.request_id,
            tenant=tenant,
            priority=priority,
            mu=request.mu,
            enqueued_at=now,
            payload=request,
        )
        outcome = self.controller.enqueue(
            item,
            now=now,
            has_replicas=bool(serving),
            scale_to_zero=self.scale_to_zero,
            **self._load(replicas, serving),
        )
        refusals = outcome.evicted + ([outcome.refused] if outcome.refused is not None else [])
        return Verdict(reject=[_rejection(r) for r in refusals])

    def poll(self, replicas: Sequence[ReplicaView], now: float) -> Verdict:
        serving = _serving(replicas)
        expired = self.controller.shed_expired(now=now, **self._load(replicas, serving))
        verdict = Verdict(reject=[_rejection(r) for r in expired])
        free = _free_slots(serving)
        while free > 0:
            item = self.controller.next_to_serve(now)
            if item is None:
                break
            verdict.dispatch.append(item.payload)
            free -= 1
        return verdict

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.controller.finished(mu_done=request.mu, now=now)

    def next_expiry(self) -> float | None:
        """When the next queued request goes over age: the simulation polls then, as the proxy's timer fires."""
        return self.controller.next_expiry()

    def _load(self, replicas: Sequence[ReplicaView], serving: list[ReplicaView]) -> dict[str, float]:
        per_replica = self.replica_mu_per_s
        nominal = sum(v.mu_capacity if per_replica is None else per_replica for v in serving)
        # In flight counts draining replicas too, as the proxy's slots do until their last request ends.
        return {"in_flight_mu": sum(v.in_flight_mu for v in replicas), "nominal_mu_per_s": nominal}


def _serving(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    return [v for v in replicas if v.healthy and not v.draining]


def _free_slots(serving: list[ReplicaView]) -> int:
    return sum(max(0, v.concurrency_limit - v.in_flight) for v in serving)


def _rejection(refusal: Refusal) -> Rejection:
    return Rejection(refusal.item.payload, refusal.retry_after_s, refusal.reason)
