"""An overload in virtual time (pure): tenants offer Poisson traffic by class to an endpoint that has one fallback
endpoint, and each endpoint admits with the proxy's own ``AdmissionController`` (priority queues, DRR, queue-age
shedding, fair pain, the degradation level and credit of ``gateway.admission.brownout``). What the proxy's
pipeline adds around it is done here the same way: a request is served shorter (the endpoint's
``degrade_max_tokens``) when ``controller.degrade`` says so, and one refused (would shed, shed by age, evicted,
no replica) goes to the fallback if its class is listed and its tenant accepts fallbacks, at most once.

The replicas are slot servers: each of ``replicas × concurrency`` slots serves one request at a time, in
``ttft_s + tokens × tpot_s`` whatever the others do. That is a simplification of a batching engine (the DES in
``des.py`` models one); the admission decisions, which are what this measures, are the production code's.
Used by ``bench reliability`` (the overload section, ``benchmarks.operations.overload``)."""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from capacity.percentiles import percentile
from gateway.admission.classes import CLASSES, CRITICAL
from gateway.admission.controller import DEFAULT_MAX_QUEUE, AdmissionController
from gateway.admission.queue import QueuedItem


@dataclass(frozen=True)
class SimEndpoint:
    name: str
    replicas: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    mu_per_token: float  # MU = mu_base + mu_per_token × output tokens (the prompt is the same for all)
    mu_base: float
    degrade_max_tokens: int | None = None
    degrade_slot_share: float | None = None  # the share of the slots degraded classes may hold under overload
    fallback_classes: frozenset = frozenset({"standard", "sheddable"})

    def service_s(self, tokens: int) -> float:
        return self.ttft_s + tokens * self.tpot_s

    def mu(self, tokens: int) -> float:
        return self.mu_base + self.mu_per_token * tokens


@dataclass(frozen=True)
class SimTenant:
    name: str
    reserved_mu_per_s: float  # on the primary; none on the fallback (best effort there)
    rates: dict  # class → requests/s
    accepts_fallback: bool = True


@dataclass
class SimOutcome:
    tenant: str
    priority: str
    arrival_s: float
    status: str = "pending"  # ok | shed
    served_by: str = ""
    degraded: bool = False
    fell_back: bool = False
    ttft_s: float | None = None
    offered_mu: float = 0.0
    reason: str = ""


class _Endpoint:
    def __init__(self, spec: SimEndpoint, full_tokens: int, max_queue: int, fair_pain: bool) -> None:
        self.spec = spec
        self.free = spec.replicas * spec.concurrency
        self.running = dict.fromkeys(CLASSES, 0)  # requests holding a slot, by the class they run in here
        # What its slots finish per second at full-length answers (the proxy's nominal ``mu_per_min / 60``).
        self.nominal = self.free * spec.mu(full_tokens) / spec.service_s(full_tokens)
        self.controller = AdmissionController(max_queue=max_queue, now=0.0, fair_pain=fair_pain)
        self.armed_at: float | None = None
        self.shared = False  # the last slot checked was under the slot share (``OverloadRun._may_start``)


@dataclass
class OverloadRun:
    """One run: ``primary`` falls back to ``fallback``; tenants offer their rates for ``duration_s``."""

    primary: SimEndpoint
    fallback: SimEndpoint | None
    tenants: list[SimTenant]
    duration_s: float
    full_tokens: int = 32
    seed: int = 1
    max_queue: int = DEFAULT_MAX_QUEUE
    fair_pain: bool = True  # False: the baseline, shedding by queue age and size on whoever waited
    outcomes: list[SimOutcome] = field(default_factory=list)

    def run(self) -> list[SimOutcome]:
        rng = random.Random(self.seed)
        self._events: list = []
        self._seq = itertools.count()
        self._eps = {"primary": _Endpoint(self.primary, self.full_tokens, self.max_queue, self.fair_pain)}
        if self.fallback is not None:
            self._eps["fallback"] = _Endpoint(self.fallback, self.full_tokens, self.max_queue, self.fair_pain)
        for tenant in self.tenants:
            for priority, rate in tenant.rates.items():
                t = 0.0
                while rate > 0:
                    t += rng.expovariate(rate)
                    if t > self.duration_s:
                        break
                    self._push(t, "arrive", (tenant, priority))
        while self._events:
            now, _, kind, data = heapq.heappop(self._events)
            if kind == "arrive":
                tenant, priority = data
                outcome = SimOutcome(tenant.name, priority, now, offered_mu=self.primary.mu(self.full_tokens))
                self.outcomes.append(outcome)
                self._offer("primary", outcome, tenant, now)
            elif kind == "finish":
                self._finish(data, now)
            else:
                self._pump(data, now)
        return self.outcomes

    def _push(self, at: float, kind: str, data) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, data))

    def _offer(self, name: str, outcome: SimOutcome, tenant: SimTenant, now: float) -> None:
        ep = self._eps[name]
        spec, controller = ep.spec, ep.controller
        priority = outcome.priority if name == "primary" else "sheddable"  # no reservation there: best effort
        tokens = self.full_tokens
        # As the proxy counts it: what the tenant asked of the endpoint it named, against its reservation there.
        controller.arrived(
            tenant=tenant.name, mu=outcome.offered_mu, reserved_mu_per_s=tenant.reserved_mu_per_s, now=now
        )
        cap = spec.degrade_max_tokens
        if cap is not None and cap < tokens:
            if controller.degrade(tenant=tenant.name, priority=priority, now=now, nominal_mu_per_s=ep.nominal):
                tokens, outcome.degraded = cap, True
        job = (name, outcome, tenant, tokens)
        if controller.may_skip_queue() and self._may_start(ep, priority, now):
            self._start(ep, job, now)
            return
        item = QueuedItem(
            request_id=str(id(outcome)), tenant=tenant.name, priority=priority, mu=spec.mu(tokens), enqueued_at=now
        )
        item.payload = job
        result = controller.enqueue(
            item, now=now, has_replicas=True, scale_to_zero=False, in_flight_mu=0.0, nominal_mu_per_s=ep.nominal
        )
        for refusal in result.evicted:
            self._refused(refusal.item.payload, refusal.reason, now)
        if result.refused is not None:
            self._refused(job, result.refused.reason, now)
        self._pump(name, now)  # a slot held back from others by the slot share may be this request's

    def _refused(self, job, reason: str, now: float) -> None:
        name, outcome, tenant, _ = job
        spec = self._eps[name].spec
        if (
            name == "primary"
            and "fallback" in self._eps
            and tenant.accepts_fallback
            and outcome.priority in spec.fallback_classes
        ):
            outcome.fell_back, outcome.degraded = True, False
            self._offer("fallback", outcome, tenant, now)
            return
        outcome.status, outcome.reason = "shed", reason

    def _may_start(self, ep: _Endpoint, priority: str, now: float) -> bool:
        """A slot is free and, by the endpoint's slot share (``AdmissionController.held_back``), a request of this
        class may take it; one taken under the share is degraded. The slots are one pool here (the slot model has
        no per-replica placement): the share caps the degraded classes at ``share`` of all of them."""
        if ep.free <= 0:
            return False
        spec = ep.spec
        pool = {"pool": (ep.running, spec.replicas * spec.concurrency)}
        held = ep.controller.held_back(
            priority, pool, share=spec.degrade_slot_share, now=now, nominal_mu_per_s=ep.nominal
        )
        ep.shared = held is not None
        return not held

    def _start(self, ep: _Endpoint, job, now: float) -> None:
        name, outcome, _, tokens = job
        ep.free -= 1
        ep.running[_class_at(job)] += 1
        if ep.shared:
            outcome.degraded = True
        outcome.served_by = name
        outcome.ttft_s = now - outcome.arrival_s + ep.spec.ttft_s
        self._push(now + ep.spec.service_s(tokens), "finish", job)

    def _finish(self, job, now: float) -> None:
        name, outcome, _, tokens = job
        ep = self._eps[name]
        ep.free += 1
        ep.running[_class_at(job)] -= 1
        outcome.status = "ok"
        ep.controller.finished(mu_done=ep.spec.mu(tokens), now=now)
        self._pump(name, now)

    def _pump(self, name: str, now: float) -> None:
        ep = self._eps[name]
        controller = ep.controller
        for refusal in controller.shed_expired(now=now, in_flight_mu=0.0, nominal_mu_per_s=ep.nominal):
            self._refused(refusal.item.payload, refusal.reason, now)
        while (priority := controller.next_class()) is not None and self._may_start(ep, priority, now):
            item = controller.next_to_serve(now)
            self._start(ep, item.payload, now)
        self._arm(name)

    def _arm(self, name: str) -> None:
        """Poll at the next queue-age expiry, as the proxy's timer fires (one timer per endpoint)."""
        ep = self._eps[name]
        at = ep.controller.next_expiry()
        if at is not None and at != ep.armed_at:
            ep.armed_at = at
            self._push(at + 1e-6, "expire", name)


def _class_at(job) -> str:
    """The class a job runs in at its endpoint: its own on the primary, sheddable on the fallback."""
    name, outcome, _, _ = job
    return outcome.priority if name == "primary" else "sheddable"


def _p99_ms(values: list[float]) -> float | None:
    p99 = percentile(values, 99)
    return None if p99 is None else round(p99 * 1000, 1)


def summarize(outcomes: list[SimOutcome], tenants: list[SimTenant], *, ttft_slo_s: float, window: tuple) -> dict:
    """The overload figures over the arrivals in ``window`` (start, end seconds): SLO attainment of critical
    requests, the answered, fallback, degraded and shed fractions, and fair pain's worst deviation: the largest
    difference, over tenants, between a tenant's share of the refusals and its share of the excess (offered MU
    over its reservation, at least 0)."""
    start, end = window
    rows = [o for o in outcomes if start <= o.arrival_s < end]
    n = max(1, len(rows))
    critical = [o for o in rows if o.priority == CRITICAL]
    good = [o for o in critical if o.status == "ok" and o.ttft_s is not None and o.ttft_s <= ttft_slo_s]
    span = end - start
    excess = {}
    for t in tenants:
        offered = sum(o.offered_mu for o in rows if o.tenant == t.name)
        excess[t.name] = max(0.0, offered - t.reserved_mu_per_s * span)
    shed = [o for o in rows if o.status != "ok"]
    total_excess, total_shed = sum(excess.values()), len(shed)
    deviation = 0.0
    if total_shed and total_excess:
        for t in tenants:
            share = sum(1 for o in shed if o.tenant == t.name) / total_shed
            deviation = max(deviation, abs(share - excess[t.name] / total_excess))
    return {
        "critical_slo_attainment": round(len(good) / len(critical), 4) if critical else None,
        "answered_fraction": round(sum(o.status == "ok" for o in rows) / n, 4),
        "fallback_fraction": round(sum(o.status == "ok" and o.fell_back for o in rows) / n, 4),
        "degraded_fraction": round(sum(o.status == "ok" and o.degraded for o in rows) / n, 4),
        "shed_fraction": round(total_shed / n, 4),
        "fairness_max_dev": round(deviation, 4),
        "critical_ttft_ms_p99": _p99_ms([o.ttft_s for o in critical if o.status == "ok" and o.ttft_s is not None]),
        "requests": len(rows),
    }
