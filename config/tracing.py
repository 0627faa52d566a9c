"""OpenTelemetry traces, off by default (docs/request-path.md#tracing).

On when ``INFERCAP_TRACING=1`` or ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``); spans go to
the OTLP/HTTP exporter, which reads the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_*``
variables, in batches off the request path; ``OTEL_SERVICE_NAME`` names the process (default ``infercap``).
Off, ``TRACER`` stays None and nothing here is imported from OpenTelemetry: every caller checks ``TRACER is not
None`` and does nothing else. The proxy's spans are built in ``gateway/proxy/tracing.py``; this module holds the
provider, the Django middleware (views) and the Celery task spans (beat ticks and every other task)."""

from __future__ import annotations

import os
import time

TRACER = None  # an opentelemetry Tracer while tracing is on
_PROVIDER = None
# perf_counter -> epoch nanoseconds: the proxy stamps its stages with perf_counter and builds spans from them.
_EPOCH_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


def ns(perf: float) -> int:
    """Epoch nanoseconds of a ``time.perf_counter()`` reading (span start and end times)."""
    return int(perf * 1e9) + _EPOCH_OFFSET_NS


def wanted(env=os.environ) -> bool:
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    return env.get("INFERCAP_TRACING", "").strip().lower() in ("1", "true", "yes") or exporter not in ("", "none")


def configure(exporter=None, *, batch: bool = True, service_name: str | None = None):
    """Turn tracing on with ``exporter`` (default: from the environment) and return the tracer. Tests pass an
    in-memory exporter with ``batch=False`` so spans are there as soon as they end."""
    global TRACER, _PROVIDER
    # Imported here, not at the top: with tracing off the process never loads the SDK.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    if exporter is None:
        exporter = _exporter_from_env()
    name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "infercap"
    provider = TracerProvider(resource=Resource.create({"service.name": name}), id_generator=_preset_ids())
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    if _PROVIDER is not None:
        _PROVIDER.shutdown()
    _PROVIDER, TRACER = provider, provider.get_tracer("infercap")
    return TRACER


class Preset:
    """Ids the next span started takes (``with_ids``): the proxy names its trace and its upstream span before it
    builds them, so that the replica's ``traceparent`` is sent without a span started on the request path."""

    trace_id: int | None = None
    span_id: int | None = None


def _preset_ids():
    # Imported here: with tracing off the process never loads the SDK.
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PresetIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            return Preset.trace_id or super().generate_trace_id()

        def generate_span_id(self) -> int:
            return Preset.span_id or super().generate_span_id()

    return PresetIds()


def with_ids(trace_id: int | None, span_id: int | None, name: str, **kwargs):
    """``TRACER.start_span(name, **kwargs)`` taking these ids (a parent in ``context`` keeps its trace id)."""
    Preset.trace_id, Preset.span_id = trace_id, span_id
    try:
        return TRACER.start_span(name, **kwargs)
    finally:
        Preset.trace_id = Preset.span_id = None


def disable() -> None:
    global TRACER, _PROVIDER
    if _PROVIDER is not None:
        _PROVIDER.shutdown()
    TRACER = _PROVIDER = None


def configure_from_env() -> None:
    """At process start (``config.asgi``, ``config.celery_app``): on if the environment asks for it."""
    if TRACER is None and wanted():
        configure()


def _exporter_from_env():
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        # Imported here: only the exporter the environment names is loaded.
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # Imported here: only the exporter the environment names is loaded.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def traceparent(span) -> str:
    """The W3C ``traceparent`` header (version 00) naming ``span`` as the parent; of the flags only "sampled"."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 1:02x}"


def parent_context(header: str | None):
    """The OpenTelemetry context of an incoming ``traceparent`` (None when absent or malformed)."""
    if not header:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # only when tracing is on

    return TraceContextTextMapPropagator().extract({"traceparent": header}) or None


class TracingMiddleware:
    """A span per Django view (``http <METHOD> <route>``, status attribute); a pass-through while tracing is off."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        from asgiref.sync import iscoroutinefunction, markcoroutinefunction  # Django's own dependency

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        if TRACER is None:
            return self.get_response(request)
        with _view_span(request) as span:
            response = self.get_response(request)
            _end_view_span(span, request, response)
            return response

    async def _acall(self, request):
        if TRACER is None:
            return await self.get_response(request)
        with _view_span(request) as span:
            response = await self.get_response(request)
            _end_view_span(span, request, response)
            return response


def _view_span(request):
    ctx = parent_context(request.headers.get("traceparent"))
    return TRACER.start_as_current_span(f"http {request.method}", context=ctx, kind=_server_kind())


def _server_kind():
    from opentelemetry.trace import SpanKind  # only when tracing is on

    return SpanKind.SERVER


def _end_view_span(span, request, response) -> None:
    match = getattr(request, "resolver_match", None)
    if match is not None and match.route:
        span.update_name(f"http {request.method} /{match.route}")
        span.set_attribute("http.route", "/" + match.route)
    span.set_attribute("http.request.method", request.method)
    span.set_attribute("http.response.status_code", response.status_code)


# -- Celery ------------------------------------------------------------------------------------------------------
_TASK_SPANS: dict[str, object] = {}


def task_started(task_id=None, task=None, **_) -> None:
    """``task_prerun``: a span per task run (the beat ticks are tasks)."""
    if TRACER is None or task_id is None:
        return
    span = TRACER.start_span(f"celery.task {task.name}")
    span.set_attribute("celery.task_id", task_id)
    _TASK_SPANS[task_id] = span


def task_failed(task_id=None, exception=None, **_) -> None:
    span = _TASK_SPANS.get(task_id)
    if span is not None and exception is not None:
        span.record_exception(exception)
        from opentelemetry.trace import Status, StatusCode  # only when tracing is on and a task failed

        span.set_status(Status(StatusCode.ERROR, str(exception)))


def task_finished(task_id=None, state=None, **_) -> None:
    span = _TASK_SPANS.pop(task_id, None)
    if span is not None:
        span.set_attribute("celery.state", str(state))
        span.end()
