"""A proxied request's spans (docs/request-path.md#tracing), while tracing is on (``config/tracing.py``).

Off, ``start`` leaves ``flight.marks`` None and every other function here returns at its first check: no span, no
allocation. On, the root span ``proxy.request`` starts at arrival; the stages stamp ``flight.marks`` with
``perf_counter`` as each ends (``mark``), the upstream span starts live at dispatch so that its ``traceparent`` goes
to the replica, and ``finish`` (after metering) builds the stage spans from the stamps with their real start and
end times: ``proxy.authenticate``, ``proxy.parse``, ``proxy.price``, ``proxy.limits``, ``proxy.admit`` (routing:
the chosen replica and the candidates' load signals; a ``proxy.queue_wait`` child when it queued),
``proxy.upstream`` (``proxy.upstream.first_token``, ``proxy.upstream.stream`` children) and ``proxy.meter``."""

from __future__ import annotations

import time

from config import tracing as t
from endpoints.proxy.flight import Flight


def start(flight: Flight, headers: dict[bytes, bytes]) -> None:
    tracer = t.TRACER
    if tracer is None:
        return
    incoming = headers.get(b"traceparent")
    ctx = t.parent_context(incoming.decode("latin-1") if incoming else None)
    flight.span = tracer.start_span("proxy.request", context=ctx, start_time=t.ns(flight.t0), kind=_kind("SERVER"))
    flight.span.set_attribute("infercap.request_id", flight.request_id)
    flight.marks = []


def mark(flight: Flight, stage: str, attributes: dict | None = None) -> None:
    """The end of ``stage`` (its span runs from the previous mark, or arrival, to now)."""
    if flight.marks is not None:
        flight.marks.append((stage, time.perf_counter(), attributes))


def routed(flight: Flight) -> None:
    """The admit stage's end: which replica the router chose, and the load signals it chose on."""
    if flight.marks is None:
        return
    admission = flight.admission
    slot, runtime = admission.slot, admission.runtime
    views = [s.view for s in runtime.slots.values()]
    mark(
        flight,
        "admit",
        {
            "infercap.replica.id": str(slot.replica_id),
            "infercap.replica.name": slot.name,
            "infercap.router": getattr(runtime.router, "name", type(runtime.router).__name__),
            "infercap.queue_wait_ms": round(admission.queue_s * 1000, 3),
            "infercap.route.candidates": [str(v.replica_id) for v in views],
            "infercap.route.in_flight": [v.in_flight for v in views],
            "infercap.route.num_waiting": [v.num_waiting for v in views],
            "infercap.route.kv_usage": [float(v.kv_usage) for v in views],
            "infercap.route.metrics_age_s": [round(float(v.metrics_age_s), 3) for v in views],
        },
    )


def dispatched(flight: Flight, headers: dict) -> None:
    """The upstream span starts; the replica gets it as the parent in ``traceparent`` (vLLM continues the trace
    when launched with ``--otlp-traces-endpoint``)."""
    if flight.marks is None:
        return
    span = flight.upstream_span = t.TRACER.start_span(
        "proxy.upstream", context=_in(flight.span), start_time=t.ns(flight.dispatched_at), kind=_kind("CLIENT")
    )
    headers["traceparent"] = t.traceparent(span)


def finish(flight: Flight, meter_started: float) -> None:
    """After metering: the stage spans from the marks, the upstream span's end, the root's attributes and end."""
    if flight.marks is None:
        return
    root, ctx = flight.span, _in(flight.span)
    previous = flight.t0
    for stage, at, attributes in flight.marks:
        span = t.TRACER.start_span(f"proxy.{stage}", context=ctx, start_time=t.ns(previous), attributes=attributes)
        if stage == "admit" and attributes["infercap.queue_wait_ms"] > 0:
            queued = at - attributes["infercap.queue_wait_ms"] / 1000
            t.TRACER.start_span("proxy.queue_wait", context=_in(span), start_time=t.ns(queued)).end(t.ns(at))
        span.end(t.ns(at))
        previous = at
    _end_upstream(flight)
    done = time.perf_counter()
    t.TRACER.start_span("proxy.meter", context=ctx, start_time=t.ns(meter_started)).end(t.ns(done))
    outcome = flight.outcome
    status = flight.usage_status or (outcome.status if outcome is not None else "refused")
    root.set_attribute("infercap.status", status)
    if flight.key is not None:
        root.set_attribute("infercap.tenant", flight.key.tenant_slug)
    if flight.endpoint is not None:
        root.set_attribute("infercap.endpoint", flight.endpoint.name)
        root.set_attribute("infercap.priority", flight.priority)
    root.end(t.ns(done))


def _end_upstream(flight: Flight) -> None:
    span, outcome = flight.upstream_span, flight.outcome
    if span is None or outcome is None:
        return
    slot = flight.admission.slot if flight.admission is not None else None
    if slot is not None:
        span.set_attribute("infercap.replica.id", str(slot.replica_id))
    span.set_attribute("infercap.upstream.status", str(outcome.status))
    end = outcome.finished_at or time.perf_counter()
    first = outcome.first_token_at
    ctx = _in(span)
    if first is not None:
        start = flight.dispatched_at
        t.TRACER.start_span("proxy.upstream.first_token", context=ctx, start_time=t.ns(start)).end(t.ns(first))
        t.TRACER.start_span("proxy.upstream.stream", context=ctx, start_time=t.ns(first)).end(t.ns(end))
    span.end(t.ns(end))


def _in(span):
    # Deferred: OpenTelemetry is loaded only when tracing is on (config/tracing.py).
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _kind(name: str):
    # Deferred: OpenTelemetry is loaded only when tracing is on (config/tracing.py).
    from opentelemetry.trace import SpanKind

    return SpanKind[name]
