"""The proxy's ASGI application: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
and ``GET /metrics``.

Request path: authenticate the key against the in-process snapshot → validate → resolve the endpoint →
tenant limits (Redis token buckets) → estimate MU → admission (a free replica slot now, or the endpoint's
priority queue) → route → relay the upstream stream → meter (one usage record, written off the path).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import time
import uuid

from capacity.units import usage_mu
from endpoints.admission import ENGINE_PRIORITY, effective_priority
from endpoints.proxy import metrics as m
from endpoints.proxy.errors import ProxyError, error_body, send_error, send_json, sse_error_event
from endpoints.proxy.limits import LimiterUnavailable, buckets_for, retry_after_from_wait
from endpoints.proxy.relay import Outcome, PriorityRefused, UpstreamFailed, plain_exchange, stream_exchange
from endpoints.proxy.request import parse_request, read_body, request_cost, requested_priority, upstream_payload
from endpoints.proxy.runtime import Shed
from endpoints.proxy.state import ProxyState, get_state
from endpoints.routing.base import RouteRequest
from endpoints.routing.session import prompt_text_of, session_id_of

log = logging.getLogger(__name__)

NON_STREAM_MIN_TOKENS_PER_S = 5.0
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


# Request ids: a random per-process prefix and a counter, unique across processes without a syscall per request.
_ID_PREFIX = "req-" + uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):08x}"


class _Ctx:
    """Per-request bookkeeping shared by the handler, the disconnect watcher and the watchdog."""

    __slots__ = ("cancel_reason", "task", "outcome", "dispatched_at")

    def __init__(self, task: asyncio.Task) -> None:
        self.cancel_reason: str | None = None
        self.task = task
        self.outcome: Outcome | None = None
        self.dispatched_at: float | None = None

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.task.cancel()


async def application(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    method = scope["method"]
    if path != "/metrics":
        try:
            await get_state()
        except Exception:  # noqa: BLE001 - e.g. the database is down when this process starts
            log.exception("proxy could not load its configuration")
            rid = [(b"x-request-id", new_request_id().encode()), (b"retry-after", b"1")]
            body = error_body(
                "The proxy is starting and cannot read its configuration yet.",
                type="server_error",
                code="proxy_unavailable",
            )
            await send_json(send, 503, body, rid)
            return
    kind = _ROUTES.get(path)
    if kind is not None:
        if method != "POST":
            await _plain_error(send, 405, f"{method} is not allowed on {path}; use POST.", "method_not_allowed")
            return
        await _completion(scope, receive, send, kind)
    elif path == "/v1/models" and method == "GET":
        await _models(scope, send)
    elif path == "/metrics" and method == "GET":
        if not _metrics_allowed(_headers(scope)):
            # Not 401: an unauthenticated caller learns nothing, not even that metrics are served here.
            await _plain_error(send, 404, f"Unknown path {path}.", "not_found")
            return
        body, content_type = m.exposition()
        headers = [(b"content-type", content_type.encode()), (b"x-request-id", new_request_id().encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    else:
        await _plain_error(send, 404, f"Unknown path {path}.", "not_found")


_metrics_token: bytes | None = None


def _metrics_allowed(headers: dict[bytes, bytes]) -> bool:
    """``Authorization: Bearer <INFERCAP_METRICS_TOKEN>``; with no token configured nobody may scrape (fail
    closed). Read once per process; compared in constant time."""
    global _metrics_token
    if _metrics_token is None:
        from endpoints.proxy.config import load_config

        _metrics_token = load_config().metrics_token.encode()
    if not _metrics_token:
        return False
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), _metrics_token)


async def _plain_error(send, status: int, message: str, code: str) -> None:
    rid = [(b"x-request-id", new_request_id().encode())]
    await send_json(send, status, error_body(message, type="invalid_request_error", code=code), rid)


def _headers(scope) -> dict[bytes, bytes]:
    return dict(scope["headers"])


def _authenticate(state: ProxyState, headers: dict[bytes, bytes]):
    auth = headers.get(b"authorization")
    if not auth:
        raise ProxyError(
            401,
            "Missing API key: send 'Authorization: Bearer <key>'.",
            type="authentication_error",
            code="missing_api_key",
        )
    scheme, _, raw = auth.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not raw.strip():
        raise ProxyError(
            401,
            "Malformed Authorization header; expected 'Bearer <key>'.",
            type="authentication_error",
            code="invalid_api_key",
        )
    digest = hashlib.sha256(raw.strip().encode("utf-8", "surrogatepass")).hexdigest()
    key = state.snapshot.keys_by_hash.get(digest)
    if key is None or not key.usable(time.time()):
        # One message for unknown, revoked and expired keys: a caller learns nothing about which keys exist.
        raise ProxyError(
            401, "Invalid, revoked or expired API key.", type="authentication_error", code="invalid_api_key"
        )
    return key


async def _models(scope, send) -> None:
    request_id = new_request_id()
    rid_header = [(b"x-request-id", request_id.encode())]
    try:
        state = await get_state()
        key = _authenticate(state, _headers(scope))
    except ProxyError as err:
        await send_error(send, err, rid_header)
        return
    import json

    data = [
        {
            "id": e.name,
            "object": "model",
            "created": e.created,
            "owned_by": "infercap",
            "max_model_len": e.max_model_len,
        }
        for e in sorted(state.snapshot.endpoints_for(key.tenant_id), key=lambda e: e.name)
    ]
    await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode(), rid_header)


async def _watch_disconnect(receive, ctx: _Ctx) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if ctx.outcome is not None and ctx.outcome.done:
                return  # our own end of the response, not the client leaving; let the upstream drain
            ctx.cancel("client")
            return


def _watchdog(ctx: _Ctx, ttft_s: float, idle_s: float, loop: asyncio.AbstractEventLoop) -> None:
    """Re-arming timer: ends a request with no first token after ``ttft_s`` or no data for ``idle_s``."""
    outcome = ctx.outcome
    if ctx.cancel_reason is not None or outcome is None or outcome.finished_at is not None:
        return
    now = time.perf_counter()
    if outcome.first_token_at is None:
        if ctx.dispatched_at is not None and now - ctx.dispatched_at > ttft_s:
            ctx.cancel("ttft")
            return
    elif now - (outcome.last_read_at or outcome.first_token_at) > idle_s:
        ctx.cancel("idle")
        return
    loop.call_later(min(ttft_s, idle_s) / 4, _watchdog, ctx, ttft_s, idle_s, loop)


async def _completion(scope, receive, send, kind: str) -> None:
    t0 = time.perf_counter()
    started_at = time.time()
    request_id = new_request_id()
    rid_header = [(b"x-request-id", request_id.encode())]
    headers = _headers(scope)
    state = await get_state()
    cfg = state.config
    key = endpoint = runtime = slot = route = None
    priority = "standard"
    mu_est = 0.0
    buckets: list = []
    queue_s: float | None = None
    usage_status: str | None = None
    outcome: Outcome | None = None
    watcher: asyncio.Task | None = None
    ctx = _Ctx(asyncio.current_task())
    loop = asyncio.get_running_loop()
    try:
        key = _authenticate(state, headers)
        if "inference" not in key.scopes:
            raise ProxyError(
                403, "This API key lacks the 'inference' scope.", type="permission_error", code="insufficient_scope"
            )
        cl = headers.get(b"content-length")
        try:
            content_length = int(cl) if cl is not None else None
        except ValueError:
            raise ProxyError(400, "Invalid Content-Length header.", code="invalid_request") from None
        raw = await read_body(
            receive, limit=cfg.max_body_bytes, content_length=content_length, timeout_s=cfg.body_timeout_s
        )
        req = parse_request(kind, raw, max_n=cfg.max_n)
        found = state.snapshot.endpoints_by_name.get(req.model)
        if found is None or not found.visible_to(key.tenant_id):
            raise ProxyError(404, f"The model `{req.model}` does not exist.", param="model", code="model_not_found")
        if req.max_tokens is not None and req.max_tokens > found.max_model_len:
            # Refused here rather than by the replica: it is neither charged to the tenant's limits nor dispatched.
            raise ProxyError(
                400,
                f"'max_tokens' is {req.max_tokens}, but `{found.name}` has a context of {found.max_model_len} tokens.",
                param="max_tokens",
                code="invalid_value",
            )
        requested = requested_priority(headers)
        # Set only now: from here on an error is metered (a request refused as invalid above is not).
        endpoint = found
        reservation = state.snapshot.reservations.get((key.tenant_id, endpoint.id))
        priority = effective_priority(
            key_max=key.max_priority,
            reservation=reservation.priority if reservation else None,
            requested=requested,
        )
        mu_est, tokens_est = request_cost(req, endpoint.coeffs)
        buckets = buckets_for(
            reservation=reservation,
            mu=mu_est,
            tokens=tokens_est,
            best_effort_mu_per_min=cfg.best_effort_mu_per_min,
        )
        if buckets:
            try:
                wait_s, limit_name = await state.limiter.acquire(
                    tenant_id=key.tenant_id, endpoint_id=endpoint.id, buckets=buckets
                )
            except LimiterUnavailable:
                raise ProxyError(
                    503,
                    "Rate limiter unavailable; retry shortly.",
                    type="server_error",
                    code="limiter_unavailable",
                    retry_after=1,
                ) from None
            if wait_s > 0:
                buckets = []  # nothing was charged
                m.child(m.RATE_LIMITED, endpoint.name, key.tenant_slug, limit_name).inc()
                raise ProxyError(
                    429,
                    f"Rate limit exceeded for this tenant on `{endpoint.name}` ({limit_name}); retry after the Retry-After delay.",
                    type="rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after=retry_after_from_wait(wait_s),
                    usage_status="rate_limited",
                )
        # From here on the body is read: a disconnect cancels whatever we are waiting for.
        watcher = loop.create_task(_watch_disconnect(receive, ctx))
        runtime = state.runtime_for(endpoint)
        sid = headers.get(b"x-session-id")
        session_id = session_id_of({"x-session-id": sid.decode("latin-1")} if sid else {}, req.body)
        cache_salt = state.cache_salts.for_tenant(key.tenant_id)
        route = RouteRequest(
            request_id=request_id,
            prompt_text=prompt_text_of(req.body),
            mu=mu_est,
            # Per tenant, like the replicas' caches (the salt) and stickiness: another tenant's session id or
            # identical prompt must not pull this request onto a replica as if it were a cache hit.
            session_id=f"{key.tenant_id}:{session_id}" if session_id else None,
            extra={"cache_salt": cache_salt},
        )
        try:
            slot, queue_s = await runtime.acquire(route, tenant=str(key.tenant_id), priority=priority, mu=mu_est)
        except Shed as shed:
            status = 503 if shed.reason == "no_replica" else 429
            raise ProxyError(
                status,
                _SHED_MESSAGES.get(shed.reason, shed.reason).format(model=endpoint.name),
                type="server_overloaded" if status == 429 else "server_error",
                code=shed.reason,
                retry_after=shed.retry_after,
                usage_status="shed",
            ) from None
        engine_priority = ENGINE_PRIORITY[priority]
        payloads: dict[bool, bytes] = {}  # by whether the replica takes ``priority``
        up_headers = {"content-type": "application/json", "x-request-id": request_id}
        response_headers = (_SSE_HEADERS if req.stream else []) + rid_header
        tried: set[str] = set()
        outcome = ctx.outcome = Outcome()
        ctx.dispatched_at = time.perf_counter()
        # A non-streaming answer shows no byte before it is complete, so its first-byte limit also allows
        # generation at a floor of NON_STREAM_MIN_TOKENS_PER_S.
        first_byte_s = cfg.ttft_timeout_s
        if not req.stream:
            first_byte_s += (req.max_tokens or 4096) / NON_STREAM_MIN_TOKENS_PER_S
        loop.call_later(
            min(cfg.ttft_timeout_s, cfg.idle_timeout_s) / 4, _watchdog, ctx, first_byte_s, cfg.idle_timeout_s, loop
        )
        attempt = 0
        while True:
            tried.add(slot.view.replica_id)
            sends_priority = slot.takes_priority
            payload = payloads.get(sends_priority)
            if payload is None:
                payload = payloads[sends_priority] = upstream_payload(
                    req, cache_salt=cache_salt, engine_priority=engine_priority if sends_priority else None
                )
            try:
                if req.stream:
                    await stream_exchange(
                        state.session,
                        slot.url + _UPSTREAM_PATH[kind],
                        payload,
                        up_headers,
                        send,
                        response_headers=response_headers,
                        forward_usage=req.client_wants_usage,
                        outcome=outcome,
                        connect_timeout_s=cfg.connect_timeout_s,
                        priority_sent=sends_priority,
                    )
                else:
                    await plain_exchange(
                        state.session,
                        slot.url + _UPSTREAM_PATH[kind],
                        payload,
                        up_headers,
                        send,
                        response_headers=response_headers,
                        outcome=outcome,
                        connect_timeout_s=cfg.connect_timeout_s,
                        priority_sent=sends_priority,
                    )
                break
            except PriorityRefused:
                # A replica on vLLM's default fcfs scheduler (launched by hand, or its options say priority but
                # it is not): remember it and resend on the same slot without the field; nothing was sent yet.
                log.warning("replica %s refuses 'priority' (fcfs scheduler); sending it none", slot.name)
                slot.refused_priority = True
                outcome.first_token_at = outcome.last_read_at = None
                continue
            except UpstreamFailed as failed:
                _note_failed_attempt(state, endpoint.id, slot.replica_id, request_id)
                # Nothing reached the client yet: one retry on another replica, never mid-stream.
                retry_slot = runtime.try_take(route, mu_est, exclude=tried) if attempt == 0 else None
                attempt += 1
                runtime.release(slot, route, mu_est, 0.0)
                slot = retry_slot
                if slot is None:
                    outcome.status = "upstream_error"
                    raise ProxyError(
                        failed.status, f"Upstream replica failed: {failed}", type="server_error", code="upstream_error"
                    ) from None
                m.child(m.UPSTREAM_RETRIES, endpoint.name).inc()
                outcome.first_token_at = outcome.last_read_at = None
                ctx.dispatched_at = time.perf_counter()
    except ProxyError as err:
        usage_status = err.usage_status or (outcome.status if outcome and outcome.status != "ok" else None)
        await send_error(send, err, rid_header)
    except asyncio.CancelledError:
        reason = ctx.cancel_reason
        if reason is None:
            raise
        ctx.task.uncancel()
        if outcome is not None and outcome.done:
            pass  # the whole answer was delivered; the client just closed first
        elif reason == "client":
            usage_status = "client_cancelled"
        else:
            usage_status = "timeout"
        if reason != "client" and usage_status == "timeout":
            message = (
                "no first token from the replica in time" if reason == "ttft" else "the replica stopped streaming"
            )
            try:
                if outcome is not None and outcome.started_client:
                    await send(
                        {
                            "type": "http.response.body",
                            "body": sse_error_event(message, type="timeout"),
                            "more_body": False,
                        }
                    )
                else:
                    await send_error(
                        send, ProxyError(504, message.capitalize() + ".", type="timeout", code=reason), rid_header
                    )
            except Exception:  # noqa: BLE001 - the client may be gone as well
                pass
    finally:
        if watcher is not None:
            watcher.cancel()
        done_at = time.perf_counter()
        if outcome is not None and outcome.finished_at is None:
            outcome.finished_at = done_at  # also stops the watchdog
        mu_done = 0.0
        usage = outcome.usage if outcome is not None else None
        if usage is not None and endpoint is not None:
            details = usage.get("prompt_tokens_details") or {}
            mu_done = usage_mu(
                endpoint.coeffs,
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                cached_tokens=int(details.get("cached_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        if slot is not None and runtime is not None:
            runtime.release(slot, route, mu_est, mu_done)
        if key is not None and endpoint is not None:
            status = usage_status or (outcome.status if outcome is not None else "ok")
            _meter(
                state,
                request_id=request_id,
                key=key,
                endpoint=endpoint,
                slot=slot,
                priority=priority,
                status=status,
                outcome=outcome,
                usage=usage,
                mu=mu_done,
                queue_s=queue_s,
                t0=t0,
                done_at=done_at,
                started_at=started_at,
            )
            if buckets:
                actual = {"mu": mu_done, "tpm": float(usage.get("total_tokens") or 0) if usage else 0.0}
                state.spawn(
                    state.limiter.settle(
                        tenant_id=key.tenant_id, endpoint_id=endpoint.id, buckets=buckets, actual=actual
                    )
                )


_UPSTREAM_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_SHED_MESSAGES = {
    "queue_full": "`{model}` is saturated and its queue is full; retry after the Retry-After delay.",
    "queue_age": "The request waited longer than its priority class allows for `{model}`; retry after the Retry-After delay.",
    "evicted": "The request was evicted from `{model}`'s queue to make room for higher-priority work.",
    "no_replica": "`{model}` has no ready replica.",
}


def _note_failed_attempt(state, endpoint_id: int, replica_id, request_id: str) -> None:
    """Count an attempt that failed before the first byte against its replica, for the rollouts' canary comparison
    (the usage record names the replica that answered in the end, if any). Only on failures; fire and forget."""
    if state.redis is None:
        return
    from endpoints.rollouts.keys import FAILED_ATTEMPTS_KEY, FAILED_ATTEMPTS_RETENTION_S

    async def write() -> None:
        now = time.time()
        key = FAILED_ATTEMPTS_KEY.format(endpoint_id=endpoint_id)
        try:
            pipe = state.redis.pipeline(transaction=False)
            pipe.zadd(key, {f"{replica_id}:{request_id}": now})
            pipe.zremrangebyscore(key, 0, now - FAILED_ATTEMPTS_RETENTION_S)
            pipe.expire(key, FAILED_ATTEMPTS_RETENTION_S)
            await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - advisory, like the demand reports
            log.debug("failed-attempt report failed: %s", exc)

    state.spawn(write())


def _meter(
    state, *, request_id, key, endpoint, slot, priority, status, outcome, usage, mu, queue_s, t0, done_at, started_at
) -> None:
    e2e_s = done_at - t0
    ttft_s = tpot_s = None
    input_tokens = cached = output = 0
    if usage is not None:
        input_tokens = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        output = int(usage.get("completion_tokens") or 0)
    elif outcome is not None and outcome.content_events:
        output = max(0, outcome.content_events)  # tokens delivered before a failure (one per chunk, as vLLM streams)
    if outcome is not None and outcome.first_token_at is not None:
        ttft_s = outcome.first_token_at - t0
        end = outcome.finished_at or done_at
        if output > 1:
            tpot_s = (end - outcome.first_token_at) / (output - 1)
    slo_met = (
        status == "ok"
        and ttft_s is not None
        and ttft_s * 1000 <= endpoint.ttft_slo_ms
        and (tpot_s is None or tpot_s * 1000 <= endpoint.tpot_slo_ms)
    )
    name = endpoint.name
    m.child(m.REQUESTS, name, key.tenant_slug, priority, status).inc()
    if slo_met:
        m.child(m.GOOD_REQUESTS, name, key.tenant_slug, priority).inc()
    m.child(m.E2E, name).observe(e2e_s)
    if ttft_s is not None:
        m.child(m.TTFT, name).observe(ttft_s)
    if tpot_s is not None:
        m.child(m.TPOT, name).observe(tpot_s)
    if queue_s is not None:
        m.child(m.QUEUE_TIME, name, priority).observe(queue_s)
    state.usage.submit(
        {
            "request_id": request_id,
            "tenant_id": key.tenant_id,
            "api_key_id": key.id,
            "endpoint_id": endpoint.id,
            "replica_id": slot.replica_id if slot is not None else None,
            "priority": priority,
            "input_tokens": input_tokens,
            "cached_tokens": cached,
            "output_tokens": output,
            "mu": round(mu, 6),
            "queue_ms": round(queue_s * 1000, 3) if queue_s is not None else None,
            "ttft_ms": round(ttft_s * 1000, 3) if ttft_s is not None else None,
            "tpot_ms": round(tpot_s * 1000, 3) if tpot_s is not None else None,
            "e2e_ms": round(e2e_s * 1000, 3),
            "status": status,
            "slo_met": slo_met,
            "started_at": started_at,
            "finished_at": started_at + e2e_s,
        }
    )
