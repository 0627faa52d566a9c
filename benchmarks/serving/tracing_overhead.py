"""Tracing's cost on the proxy's own path, in process: the real pipeline (``gateway.proxy.pipeline.completion``)
over an in-memory snapshot and a scripted replica that answers at once, requests alternating tracing off and on
(one interleaved loop, so both see the same machine), each timed from the request's arrival to its first streamed
byte (the proxy's share of TTFT) and to its end. Tracing on exports through the real batch processor and OTLP/HTTP
exporter to a sink that answers 200 (``proxy._OtlpSink``), so the export thread's share of the interpreter is in the
figures. No sockets on the request path and no replica noise: the end-to-end figure is ``bench proxy --opt
tracing=1``, whose one-stream TTFT p50 swings by milliseconds on a loaded machine; this one resolves microseconds.
Used by ``bench deploy`` (``tracing_added_ttft_p50_ms``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

from benchmarks.serving.proxy import _OtlpSink, _pct
from capacity.units import MUCoefficients
from config import tracing
from gateway.proxy import pipeline
from gateway.proxy.budgets import Budgets
from gateway.proxy.config import ProxyConfig
from gateway.proxy.isolation import CacheSalts
from gateway.proxy.limits import RateLimiter
from gateway.proxy.runtime import EndpointRuntime
from gateway.proxy.snapshot import EndpointInfo, KeyInfo, ReplicaInfo, ReservationInfo, Snapshot

RAW_KEY = "ic-bench-tracing"
MODEL = "bench-tracing"
_CHUNKS = [
    b'data: {"id":"c1","choices":[{"delta":{"content":"hi"}}]}\n\n',
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n",
]


class _Content:
    def __init__(self) -> None:
        self.chunks = list(_CHUNKS)

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class _Response:
    status = 200

    def __init__(self) -> None:
        self.content = _Content()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> bool:
        return False


class _Session:
    """A replica that answers every request at once with a two-chunk stream."""

    async def post(self, url, *, data, headers, timeout):
        url = str(url)  # the proxy hands aiohttp a parsed yarl.URL
        return _Response()


class _Usage:
    def submit(self, record) -> None:
        pass


class _State:
    """What the stages use of ``ProxyState``: one endpoint, two replicas, one tenant, no Redis."""

    def __init__(self) -> None:
        coeffs = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.1, mu_per_min=6000.0)
        replicas = tuple(
            ReplicaInfo(id=100 + i, name=f"r{i}", url=f"http://replica-{i}", concurrency_limit=64) for i in range(2)
        )
        info = EndpointInfo(
            id=1, name=MODEL, owner_tenant_id=None, coeffs=coeffs, routing_policy="least_request",
            scale_to_zero=False, concurrency_limit=64, ttft_slo_ms=500, tpot_slo_ms=50, max_model_len=4096,
            created=0, replicas=replicas,
        )  # fmt: skip
        key = KeyInfo(
            id=1, prefix="ic-bench", tenant_id=1, tenant_slug="bench", scopes=frozenset({"inference"}),
            max_priority="critical", expires_at=None,
        )  # fmt: skip
        reservation = ReservationInfo(
            mu_per_min=1e9, burst_minutes=1.0, priority="standard", rpm_limit=None, tpm_limit=None
        )
        self.snapshot = Snapshot(
            version="1",
            loaded_at=0.0,
            keys_by_hash={hashlib.sha256(RAW_KEY.encode()).hexdigest(): key},
            endpoints_by_name={MODEL: info},
            reservations={(1, 1): reservation},
        )
        self.config = ProxyConfig()
        self.session, self.usage, self.redis = _Session(), _Usage(), None
        self.limiter = RateLimiter(None)
        self.budgets = Budgets(None, usd_per_mu=0.00005, spawn=self.spawn)
        self.cache_salts = CacheSalts("bench-secret")
        self.runtime = EndpointRuntime(info, config=self.config)
        self.background: set = set()

    def runtime_for(self, info):
        return self.runtime

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


async def _one(body: bytes) -> tuple[float, float]:
    """One request through the pipeline: (seconds to the first body byte, seconds to the end)."""
    first = None
    sent_body = False

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()

    async def send(message):
        nonlocal first
        if first is None and message["type"] == "http.response.body" and message.get("body"):
            first = time.perf_counter()

    scope = {"type": "http", "headers": [(b"authorization", f"Bearer {RAW_KEY}".encode())]}
    started = time.perf_counter()
    await pipeline.completion(scope, receive, send, "chat")
    return first - started, time.perf_counter() - started


async def _measure(pairs: int, tracer) -> dict:
    state = _State()

    async def get_state():
        return state

    real, pipeline.get_state = pipeline.get_state, get_state  # no snapshot loader, no Redis
    try:
        return await _pairs(pairs, tracer)
    finally:
        pipeline.get_state = real


async def _pairs(pairs: int, tracer) -> dict:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "stream": True}
    ).encode()
    times = {False: ([], []), True: ([], [])}
    for i in range(pairs + 50):  # the first 50 pairs warm both paths
        for on in (False, True) if i % 2 else (True, False):  # the order alternates too
            # Off for this request only: the provider and its export thread stay up, as in a traced process.
            tracing.TRACER = tracer if on else None
            ttft, e2e = await _one(body)
            if i >= 50:
                times[on][0].append(ttft)
                times[on][1].append(e2e)
    tracing.TRACER = tracer
    return times


def _exporter(url: str):
    # Deferred: only loaded when the benchmark runs.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=url)


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    pairs = int(opts.get("pairs", 1500 if quick else 10000))
    sink = _OtlpSink()
    tracer = tracing.configure(_exporter(sink.url), batch=True, service_name="infercap-bench")
    try:
        times = asyncio.run(_measure(pairs, tracer))
    finally:
        tracing.disable()  # flushes the last batches to the sink
        sink.close()
    off, on = times[False], times[True]
    result = {
        "tracing_added_ttft_p50_ms": round((_pct(on[0], 50) - _pct(off[0], 50)) * 1000, 4),
        "tracing_added_e2e_p50_ms": round((_pct(on[1], 50) - _pct(off[1], 50)) * 1000, 4),
        "tracing_off_proxy_ttft_p50_ms": round(_pct(off[0], 50) * 1000, 4),
        "tracing_on_proxy_ttft_p50_ms": round(_pct(on[0], 50) * 1000, 4),
        "tracing_pairs": pairs,
        "tracing_otlp_batches": sink.batches,
    }
    progress(f"tracing in process, {pairs} pairs: {result}")
    return result
