"""Graceful degradation on the request path (docs/request-path.md, "Brownout"): serve a request shorter when its
endpoint is overloaded (``degrade``), or from the endpoint's fallback when the endpoint would shed it, is failing
or has no ready replica (``fall_back``), and tell the client which (``Flight.brownout_headers``). The decisions
(level, whose turn it is) are the pure ``gateway.admission.brownout``'s, through ``EndpointRuntime``."""

from __future__ import annotations

import dataclasses

from gateway.admission.brownout import MAX_FALLBACK_DEPTH
from gateway.proxy import metrics as m
from gateway.proxy.errors import ProxyError
from gateway.proxy.flight import Admission, Flight, Price
from gateway.proxy.request import ParsedRequest
from gateway.proxy.runtime import SLOT_SHARE_KEY, EndpointRuntime
from gateway.proxy.snapshot import EndpointInfo, KeyInfo, Snapshot
from gateway.proxy.state import ProxyState

# The refusals a fallback may answer instead: admission's (would shed, shed, no ready replica) and a replica
# failure before the first byte once the retry on another replica failed too.
FALLBACK_TRIGGERS = frozenset({"queue_full", "queue_age", "evicted", "overloaded", "no_replica", "upstream_error"})


def capped_request(req: ParsedRequest, max_tokens: int) -> ParsedRequest:
    """The request with its output capped at ``max_tokens`` (both OpenAI spellings; re-serialised upstream)."""
    body = dict(req.body)
    body["max_tokens"] = max_tokens
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = max_tokens
    return dataclasses.replace(req, body=body, max_tokens=max_tokens, controlled=True)


def degrade(
    runtime: EndpointRuntime, flight: Flight, req: ParsedRequest, price: Price, *, reprice
) -> tuple[ParsedRequest, Price]:
    """Count the request's arrival for fair pain; then, under overload, by the endpoint's
    policy: the request capped at its ``degrade_max_tokens`` when its class
    degrades at the endpoint's level and it is its tenant's turn (fair pain). ``reprice(req)`` prices the capped
    request (it is charged and admitted at that cost)."""
    tenant = str(flight.key.tenant_id)
    # Excess is measured against what the tenant bought on the endpoint it named, in that endpoint's MU, on a
    # fallback too: the overflow a tenant sends there is no more "excess" than it was where it was sent.
    asked = flight.requested_price or price
    runtime.arrived(tenant=tenant, mu=asked.mu, reserved_mu_per_s=asked.reserved_mu_per_s)
    flight.level = runtime.level()
    cap = runtime.info.degrade_max_tokens
    if cap is None or (req.max_tokens is not None and req.max_tokens <= cap):
        return req, price
    if not runtime.should_degrade(tenant=tenant, priority=price.priority):
        return req, price
    flight.degraded_to = cap
    m.child(m.BROWNOUT, runtime.info.name, flight.key.tenant_slug, "degraded").inc()
    capped = capped_request(req, cap)
    return capped, reprice(capped)


def mark_slot_share(flight: Flight, admission: Admission) -> None:
    """A request that took its slot under the endpoint's slot share was degraded: say so (header, usage record)."""
    share = admission.route.extra.get(SLOT_SHARE_KEY)
    if share is None:
        return
    if flight.degraded_to is None:  # counted once per request, with a max_tokens cap or without
        m.child(m.BROWNOUT, admission.runtime.info.name, flight.key.tenant_slug, "degraded").inc()
    flight.slot_share = share


def fallback_for(
    snapshot: Snapshot, key: KeyInfo, endpoint: EndpointInfo, priority: str, visited: set[int]
) -> EndpointInfo | None:
    """The endpoint's fallback for this request, if any may serve it: the tenant accepts fallbacks, the class is
    one the endpoint falls back for, the fallback is one this tenant may call, and the chain has neither looped
    nor grown past ``MAX_FALLBACK_DEPTH`` (checked when endpoints are written, guarded here again)."""
    if not key.accepts_fallback or endpoint.fallback_name is None or priority not in endpoint.fallback_classes:
        return None
    if len(visited) > MAX_FALLBACK_DEPTH:
        return None
    fallback = snapshot.endpoints_by_name.get(endpoint.fallback_name)
    if fallback is None or fallback.id in visited or not fallback.visible_to(key.tenant_id):
        return None
    return fallback


def fall_back(state: ProxyState, flight: Flight, err: ProxyError, visited: set[int]) -> EndpointInfo:
    """After a refusal or failure on ``flight.endpoint``: the next endpoint to try, with this attempt's charges and
    slot given back; when there is none, the first refusal (the endpoint the client named) is raised."""
    if flight.first_error is None:
        if err.usage_status is None and err.code == "upstream_error":
            err.usage_status = "upstream_error"  # still so when a fallback's attempt replaced the outcome
        flight.first_error = err
    started = flight.outcome is not None and flight.outcome.started_client
    fallback = None
    if err.code in FALLBACK_TRIGGERS and not started:
        fallback = fallback_for(state.snapshot, flight.key, flight.endpoint, flight.priority, visited)
    if fallback is None:
        if flight.endpoint is not flight.requested and not started:
            give_back_attempt(state, flight)  # metered as the named endpoint's refusal, at its price
            flight.endpoint, flight.price, flight.fallback_from = flight.requested, flight.requested_price, None
        raise flight.first_error
    give_back_attempt(state, flight)
    visited.add(fallback.id)
    m.child(m.BROWNOUT, flight.requested.name, flight.key.tenant_slug, "fallback").inc()
    flight.fallback_from = flight.requested.name
    return fallback


def give_back_attempt(state: ProxyState, flight: Flight) -> None:
    """Undo an attempt that served nothing: its buckets settle to no cost, its slot (if still held) goes back."""
    if flight.charged:
        nothing = {"mu": 0.0, "tpm": 0.0}
        state.spawn(
            state.limiter.settle(
                tenant_id=flight.key.tenant_id, endpoint_id=flight.endpoint.id, buckets=flight.charged, actual=nothing
            )
        )
        flight.charged = []
    admission = flight.admission
    if admission is not None and admission.slot is not None:
        admission.runtime.release(admission.slot, admission.route, admission.mu, 0.0)
    flight.admission = flight.outcome = flight.dispatched_at = None
    flight.degraded_to = flight.slot_share = None
