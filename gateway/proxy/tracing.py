"""A proxied request's spans (docs/request-path.md#tracing), while tracing is on (``config/tracing.py``).

Off, ``start`` leaves ``flight.marks`` None and every other function here returns at its first check: no span, no
allocation. On, the request path starts no span either: ``start`` draws the trace id (or takes the client's from
its ``traceparent``), the stages stamp ``flight.marks`` with ``perf_counter`` as each ends (``mark``), and
``dispatched`` draws the upstream span's id and sends it to the replica as the ``traceparent`` parent. ``finish``
(after metering, once the client has its answer) builds every span from the stamps with its real start and end
times and those ids: the root ``proxy.request``; ``proxy.authenticate``, ``proxy.parse``, ``proxy.price``,
``proxy.limits``, ``proxy.admit`` (routing: the chosen replica and the candidates' load signals; a
``proxy.queue_wait`` child when it queued), ``proxy.prefill`` (a disaggregated endpoint's), ``proxy.upstream`` (``proxy.upstream.first_token`` and
``proxy.upstream.stream`` children) and ``proxy.meter``."""

from __future__ import annotations

import random
import time

from config import tracing as t
from gateway.proxy.flight import Flight

_random_bits = random.Random().getrandbits  # ids, not secrets (as the SDK's own generator)


class TraceIds:
    """What the request path knows of its trace before ``finish`` builds it."""

    __slots__ = ("trace_id", "parent_span_id", "sampled")

    def __init__(self, trace_id: int, parent_span_id: int | None, sampled: bool) -> None:
        self.trace_id, self.parent_span_id, self.sampled = trace_id, parent_span_id, sampled


def parse_traceparent(value: bytes | None) -> TraceIds | None:
    """A client's W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``); None when absent or invalid."""
    parts = value.decode("latin-1").strip().split("-") if value else []
    if len(parts) < 4 or (parts[0] == "00" and len(parts) != 4):
        return None
    version, trace, span, flags = parts[:4]
    try:
        if len(version) != 2 or version == "ff" or len(trace) != 32 or len(span) != 16 or len(flags) != 2:
            return None
        ids = TraceIds(int(trace, 16), int(span, 16), bool(int(flags, 16) & 1))
    except ValueError:
        return None
    return ids if ids.trace_id and ids.parent_span_id else None


def start(flight: Flight, headers: dict[bytes, bytes]) -> None:
    if t.TRACER is None:
        return
    flight.span = parse_traceparent(headers.get(b"traceparent")) or TraceIds(_random_bits(128) or 1, None, True)
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


def prefilled(flight: Flight) -> None:
    """A disaggregated request's prefill phase's end (``disaggregation.prefill_phase``; docs/request-path.md): how
    it was served, the prefill replica and, for a fallback, why."""
    if flight.marks is None:
        return
    pd = flight.pd
    mark(
        flight,
        "prefill",
        {
            "infercap.pd.route": pd.route,
            "infercap.pd.prefill_replica.id": "" if pd.prefill_replica_id is None else str(pd.prefill_replica_id),
            "infercap.pd.fallback_reason": pd.reason,
        },
    )


def dispatched(flight: Flight, headers: dict) -> None:
    """The upstream attempt starts: its span id goes to the replica as the parent in ``traceparent`` (vLLM
    continues the trace when launched with ``--otlp-traces-endpoint``)."""
    if flight.marks is None:
        return
    ids, span_id = flight.span, _random_bits(64) or 1
    headers["traceparent"] = f"00-{ids.trace_id:032x}-{span_id:016x}-{'01' if ids.sampled else '00'}"
    flight.marks.append(("dispatch", flight.dispatched_at, span_id))


def finish(flight: Flight, meter_started: float) -> None:
    """After metering: the root, the stage spans from the marks, the upstream span, the meter span."""
    if flight.marks is None:
        return
    done = time.perf_counter()
    root = _root(flight)
    ctx = _in(root)
    previous, upstream = flight.t0, None
    for stage, at, attributes in flight.marks:
        if stage == "dispatch":  # an upstream attempt: it runs until the next stage (a fallback) or the end
            upstream = _end_upstream(flight, upstream, at)
            span_id = attributes  # drawn at dispatch, sent to the replica
            upstream = t.with_ids(
                None, span_id, "proxy.upstream", context=ctx, start_time=t.ns(at), kind=_kind("CLIENT")
            )
            continue
        span = t.TRACER.start_span(f"proxy.{stage}", context=ctx, start_time=t.ns(previous), attributes=attributes)
        if stage == "admit" and attributes["infercap.queue_wait_ms"] > 0:
            queued = at - attributes["infercap.queue_wait_ms"] / 1000
            t.TRACER.start_span("proxy.queue_wait", context=_in(span), start_time=t.ns(queued)).end(t.ns(at))
        span.end(t.ns(at))
        upstream = _end_upstream(flight, upstream, at)
        previous = at
    _end_upstream(flight, upstream, None)
    t.TRACER.start_span("proxy.meter", context=ctx, start_time=t.ns(meter_started)).end(t.ns(done))
    root.end(t.ns(done))


def _root(flight: Flight):
    ids = flight.span
    parent = _remote_parent(ids) if ids.parent_span_id is not None else None
    outcome = flight.outcome
    attributes = {
        "infercap.request_id": flight.request_id,
        "infercap.status": flight.usage_status or (outcome.status if outcome is not None else "refused"),
    }
    if flight.key is not None:
        attributes["infercap.tenant"] = flight.key.tenant_slug
    if flight.endpoint is not None:
        attributes["infercap.endpoint"] = flight.endpoint.name
        attributes["infercap.priority"] = flight.priority
    return t.with_ids(
        ids.trace_id, None, "proxy.request", context=parent, start_time=t.ns(flight.t0), kind=_kind("SERVER"),
        attributes=attributes,
    )  # fmt: skip


def _end_upstream(flight: Flight, span, until: float | None):
    """End an upstream attempt's span: at ``until`` (the next stage began: it failed over), else at the stream's
    end, with its first-token and stream children. Returns None (no attempt open)."""
    if span is None:
        return None
    outcome = flight.outcome
    if until is not None or outcome is None:
        span.end(t.ns(until or time.perf_counter()))
        return None
    slot = flight.admission.slot if flight.admission is not None else None
    if slot is not None:
        span.set_attribute("infercap.replica.id", str(slot.replica_id))
    span.set_attribute("infercap.upstream.status", str(outcome.status))
    end, first, ctx = outcome.finished_at or time.perf_counter(), outcome.first_token_at, _in(span)
    if first is not None:
        start = flight.dispatched_at
        t.TRACER.start_span("proxy.upstream.first_token", context=ctx, start_time=t.ns(start)).end(t.ns(first))
        t.TRACER.start_span("proxy.upstream.stream", context=ctx, start_time=t.ns(first)).end(t.ns(end))
    span.end(t.ns(end))
    return None


def _in(span):
    # Deferred: OpenTelemetry is loaded only when tracing is on (config/tracing.py).
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _remote_parent(ids: TraceIds):
    # Deferred: OpenTelemetry is loaded only when tracing is on (config/tracing.py).
    from opentelemetry import trace

    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if ids.sampled else trace.TraceFlags.DEFAULT)
    context = trace.SpanContext(ids.trace_id, ids.parent_span_id, is_remote=True, trace_flags=flags)
    return trace.set_span_in_context(trace.NonRecordingSpan(context))


def _kind(name: str):
    # Deferred: OpenTelemetry is loaded only when tracing is on (config/tracing.py).
    from opentelemetry.trace import SpanKind

    return SpanKind[name]
