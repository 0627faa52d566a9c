"""The stages of a proxied completion, in the order ``pipeline.py`` runs them: authenticate → parse
(``read_request``, ``resolve_endpoint``) → price → limit (``charge_limits``) → admit (``routing_request``, then
``admit``, which routes) → relay → meter (``metering.py``). Each takes what it needs and returns what the next one
needs; a refusal is a ``ProxyError``. ``authenticate``, ``resolve_endpoint``, ``price_request`` and
``routing_request`` are pure: they run against a snapshot, without sockets."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import hashlib
import logging
import time
from pathlib import Path

from django.conf import settings

from capacity.runtimes.vllm import model_argument
from capacity.units import estimate_prompt_tokens
from endpoints.rollouts.keys import FAILED_ATTEMPTS_KEY, FAILED_ATTEMPTS_RETENTION_S
from gateway.admission import ENGINE_PRIORITY, effective_priority
from gateway.proxy import metrics as m
from gateway.proxy.budgets import Budgets
from gateway.proxy.config import ProxyConfig
from gateway.proxy.errors import ProxyError
from gateway.proxy.flight import Admission, Flight, Price
from gateway.proxy.limits import (
    Bucket,
    LimiterUnavailable,
    RateLimiter,
    buckets_for,
    key_buckets,
    retry_after_from_wait,
)
from gateway.proxy.model_names import ModelRename
from gateway.proxy.relay import (
    AdapterMissing,
    Outcome,
    PriorityRefused,
    ResumeRefused,
    StreamBroken,
    UpstreamFailed,
    end_stream,
    plain_exchange,
    stream_exchange,
)
from gateway.proxy.replica_adapters import ensure_loaded, load_mu
from gateway.proxy.request import ParsedRequest, parse_request, read_body, request_cost, upstream_payload
from gateway.proxy.resume import MAX_RESUMES, Continued, continuation, streamed
from gateway.proxy.runtime import EndpointRuntime, Shed, Slot
from gateway.proxy.snapshot import AdapterInfo, EndpointInfo, KeyInfo, Snapshot
from gateway.proxy.state import ProxyState
from gateway.proxy.unfinished import replica_prompt_tokens
from gateway.routing.base import RouteRequest
from gateway.routing.llmd import KV_TOKENS_KEY
from gateway.routing.session import prompt_text_of, session_id_of

log = logging.getLogger(__name__)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
UPSTREAM_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
SHED_MESSAGES = {
    "queue_full": "`{model}` is saturated and its queue is full; retry after the Retry-After delay.",
    "queue_age": "The request waited longer than its priority class allows for `{model}`; retry after the Retry-After delay.",
    "evicted": "The request was evicted from `{model}`'s queue to make room for higher-priority work.",
    "overloaded": "`{model}` is overloaded; retry after the Retry-After delay.",
    "no_replica": "`{model}` has no ready replica.",
}


# -- authenticate ---------------------------------------------------------------------------------------------
def authenticate(snapshot: Snapshot, headers: dict[bytes, bytes], *, now: float, scope: str | None = None) -> KeyInfo:
    """The key of ``Authorization: Bearer <key>``, by its SHA-256 in the snapshot; with ``scope``, it must carry
    that scope (403)."""
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
    key = snapshot.keys_by_hash.get(digest)
    if key is None or not key.usable(now):
        # One message for unknown, revoked and expired keys: a caller learns nothing about which keys exist.
        raise ProxyError(
            401, "Invalid, revoked or expired API key.", type="authentication_error", code="invalid_api_key"
        )
    if scope is not None and scope not in key.scopes:
        raise ProxyError(
            403, f"This API key lacks the '{scope}' scope.", type="permission_error", code="insufficient_scope"
        )
    return key


# -- parse ------------------------------------------------------------------------------------------------------
async def read_request(receive, headers: dict[bytes, bytes], *, kind: str, config: ProxyConfig) -> ParsedRequest:
    """The body, bounded in size and time, parsed and checked (``request.parse_request``)."""
    cl = headers.get(b"content-length")
    try:
        content_length = int(cl) if cl is not None else None
    except ValueError:
        raise ProxyError(400, "Invalid Content-Length header.", code="invalid_request") from None
    raw = await read_body(
        receive, limit=config.max_body_bytes, content_length=content_length, timeout_s=config.body_timeout_s
    )
    return parse_request(kind, raw, max_n=config.max_n)


def resolve_endpoint(snapshot: Snapshot, key: KeyInfo, req: ParsedRequest) -> EndpointInfo:
    """The endpoint ``req.model`` names (``resolve_model`` without the adapter)."""
    return resolve_model(snapshot, key, req)[0]


def resolve_model(snapshot: Snapshot, key: KeyInfo, req: ParsedRequest) -> tuple[EndpointInfo, AdapterInfo | None]:
    """The endpoint ``req.model`` names, or the base endpoint of the LoRA adapter it names (docs/lora-serving.md), if this
    key's tenant may see it: another tenant's private endpoint or adapter is a 404 like a missing one."""
    adapter = None
    found = snapshot.endpoints_by_name.get(req.model)
    if found is None and (resolved := snapshot.adapter_for(req.model, key.tenant_id)) is not None:
        adapter, found = resolved
    if found is None or not found.visible_to(key.tenant_id):
        raise ProxyError(404, f"The model `{req.model}` does not exist.", param="model", code="model_not_found")
    if not key.may_call(req.model):
        # The key's allowlist (docs/security.md, "Per-key controls"): its own tenant's model, so no secret to keep.
        raise ProxyError(
            403,
            f"This API key may not call `{req.model}`; its models: {', '.join(sorted(key.allowed_models))}.",
            type="permission_error",
            param="model",
            code="model_not_allowed",
        )
    if req.max_tokens is not None and req.max_tokens > found.max_model_len:
        # Refused here rather than by the replica: it is neither charged to the tenant's limits nor dispatched.
        raise ProxyError(
            400,
            f"'max_tokens' is {req.max_tokens}, but `{req.model}` has a context of {found.max_model_len} tokens.",
            param="max_tokens",
            code="invalid_value",
        )
    return found, adapter


# -- price ------------------------------------------------------------------------------------------------------
def price_request(
    snapshot: Snapshot,
    *,
    key: KeyInfo,
    endpoint: EndpointInfo,
    req: ParsedRequest,
    requested: str | None,
    best_effort_mu_per_min: float,
    mu_factor: float = 1.0,
    adapter: AdapterInfo | None = None,
) -> Price:
    """The class (the reservation's, capped by the key, lowered by the header), the MU and token estimate, and
    the tenant's buckets on this endpoint that estimate is charged to. ``mu_factor``: a LoRA adapter's requests
    cost the base endpoint's MU times its factor (docs/lora-serving.md). A request naming ``adapter`` draws from
    that adapter's reservation when the tenant holds one, else from its base-model reservation (docs/lora.md)."""
    reservation = snapshot.reservation_for(key.tenant_id, endpoint.id, adapter.name if adapter is not None else None)
    priority = effective_priority(
        key_max=key.max_priority,
        reservation=reservation.priority if reservation else None,
        requested=requested,
    )
    cost = request_cost(req, endpoint.coeffs, max_model_len=endpoint.max_model_len)
    mu = cost.mu * mu_factor
    buckets = buckets_for(
        reservation=reservation,
        mu=cost.charge_mu * mu_factor,
        tokens=cost.charge_tokens,
        best_effort_mu_per_min=best_effort_mu_per_min,
    ) + key_buckets(key, mu=cost.charge_mu * mu_factor, tokens=cost.charge_tokens)
    # Fair pain weighs the tenant's whole load on the endpoint, so against everything it reserved there.
    reserved_mu_per_s = snapshot.reserved_mu_per_min(key.tenant_id, endpoint.id) / 60.0
    return Price(
        priority=priority, mu=mu, tokens=cost.charge_tokens, buckets=buckets, reserved_mu_per_s=reserved_mu_per_s
    )


# -- limit ------------------------------------------------------------------------------------------------------
async def charge_limits(
    limiter: RateLimiter, *, key: KeyInfo, endpoint: EndpointInfo, price: Price, budgets: Budgets | None = None
) -> list[Bucket]:
    """Take the estimate from the tenant's buckets, all or none; returns the buckets charged (metering settles
    them to the real cost). Over a limit: 429 with the bucket's wait as Retry-After. A spent dollar budget
    (``budgets``) refuses first, before any bucket is charged."""
    if budgets is not None:
        budgets.check(key)
    if not price.buckets:
        return []
    try:
        wait_s, limit_name = await limiter.acquire(
            tenant_id=key.tenant_id, endpoint_id=endpoint.id, buckets=price.buckets
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
        m.child(m.RATE_LIMITED, endpoint.name, key.tenant_slug, limit_name).inc()
        whose = "this API key" if limit_name.startswith("key ") else f"this tenant on `{endpoint.name}`"
        raise ProxyError(
            429,
            f"Rate limit exceeded for {whose} ({limit_name}); retry after the Retry-After delay.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            retry_after=retry_after_from_wait(wait_s),
            usage_status="rate_limited",
        )
    return price.buckets


# -- admit (and route) ------------------------------------------------------------------------------------------
def routing_request(
    request_id: str,
    *,
    key: KeyInfo,
    req: ParsedRequest,
    headers: dict[bytes, bytes],
    mu: float,
    cache_salt: str,
    adapter: str | None = None,
) -> RouteRequest:
    """What the router sees of the request: its prompt (prefix affinity), its session (stickiness) and cost."""
    sid = headers.get(b"x-session-id")
    session_id = session_id_of({"x-session-id": sid.decode("latin-1")} if sid else {}, req.body)
    return RouteRequest(
        request_id=request_id,
        prompt_text=prompt_text_of(req.body),
        mu=mu,
        # Per tenant, like the replicas' caches (the salt) and stickiness: another tenant's session id or
        # identical prompt must not pull this request onto a replica as if it were a cache hit.
        session_id=f"{key.tenant_id}:{session_id}" if session_id else None,
        adapter=adapter,
        # The request's size for the cost_aware router's buckets: the prompt's tokens as admission estimated them
        # (token-id prompts count their ids; the text alone would make them one token) and the max_tokens asked
        # (None: the router's default).
        extra={
            "cache_salt": cache_salt,
            "prompt_tokens": estimate_prompt_tokens(req.prompt_chars),
            "max_tokens": req.max_tokens,
        },
    )


async def prompt_tokens(state: ProxyState, runtime: EndpointRuntime, route: RouteRequest, req: ParsedRequest) -> None:
    """The prompt's token ids for the precise prefix index (``route.extra``), when a replica of the endpoint publishes
    KV events and the endpoint's model has a local tokenizer; rendered and encoded in a worker thread (0.3 ms for a
    short chat, 5 ms for 4k characters on the dev machine: too long for the event loop). Otherwise nothing: the
    router uses its approximate index."""
    if not runtime.kv_feeds.active:
        return
    directory = model_directory(runtime.info.model)
    if directory is None:
        return
    loop = asyncio.get_running_loop()
    tokenizer = state.tokenizers.cached(directory)
    if tokenizer is False:  # not loaded yet: reading tokenizer.json takes tens of milliseconds
        tokenizer = await loop.run_in_executor(state.tokenize_pool, state.tokenizers.get, directory)
    if tokenizer is None:
        return
    tokens = await loop.run_in_executor(state.tokenize_pool, tokenizer.tokens, req.kind, req.body)
    if tokens:
        route.extra[KV_TOKENS_KEY] = tokens


@functools.lru_cache(maxsize=256)
def model_directory(model: str) -> str | None:
    """The local directory vLLM loads for this model profile name (``vllm.model_argument``), if it is one."""
    models_dir = getattr(settings, "INFERCAP", {}).get("VLLM_MODELS_DIR")
    path = Path(model_argument(model, models_dir=Path(models_dir) if models_dir else None))
    return str(path) if path.is_absolute() and path.is_dir() else None


async def admit(
    runtime: EndpointRuntime, route: RouteRequest, *, key: KeyInfo, endpoint: EndpointInfo, price: Price
) -> Admission:
    """A slot on a replica the router picked, now or after waiting in the endpoint's priority queue. Refused:
    429 (queue full, too old, evicted) or 503 (no replica), with Retry-After."""
    try:
        slot, queue_s = await runtime.acquire(route, tenant=str(key.tenant_id), priority=price.priority, mu=price.mu)
    except Shed as shed:
        status = 503 if shed.reason == "no_replica" else 429
        raise ProxyError(
            status,
            SHED_MESSAGES.get(shed.reason, shed.reason).format(model=endpoint.name),
            type="server_overloaded" if status == 429 else "server_error",
            code=shed.reason,
            retry_after=shed.retry_after,
            usage_status="shed",
        ) from None
    return Admission(runtime=runtime, route=route, slot=slot, queue_s=queue_s, mu=price.mu)


# -- relay ------------------------------------------------------------------------------------------------------
class Upstream:
    """What goes to a replica for one request: the body (built once per kind of replica it meets: taking
    ``priority`` or not, serving the endpoint's model name or another), the headers and the path. ``model``: the
    endpoint's name when it is not the one the client named (a fallback), sent as the body's ``model``."""

    __slots__ = (
        "req", "path", "cache_salt", "engine_priority", "headers", "response_headers", "model", "adapter",
        "transform", "_payloads",
    )  # fmt: skip

    def __init__(
        self,
        req: ParsedRequest,
        *,
        request_id: str,
        priority: str,
        cache_salt: str,
        rid_header,
        model: str | None = None,
        adapter: AdapterInfo | None = None,
    ) -> None:
        self.req = req
        self.model = model
        # A LoRA adapter's request names the adapter's engine name upstream (what the replica holds this artifact
        # version under) and the answer is renamed back to the adapter's public name (docs/lora-serving.md).
        self.adapter = adapter
        self.path = UPSTREAM_PATH[req.kind]
        self.cache_salt = cache_salt
        self.engine_priority = ENGINE_PRIORITY[priority]
        self.headers = {"content-type": "application/json", "x-request-id": request_id}
        self.response_headers = (SSE_HEADERS if req.stream else []) + rid_header
        self.transform: Continued | None = None  # a resumed stream's (``continued``)
        self._payloads: dict[tuple[bool, str | None], bytes] = {}

    def continued(self, req: ParsedRequest, streamed_tokens: int, *, resume: bool = True) -> Upstream:
        """The same exchange for ``req``, the continuation of a broken stream (``resume.continuation``): same
        request id (so the same completion id), class, salt and model; its SSE goes through ``resume.Continued``.
        ``resume`` False: ``req`` replaces the request before anything was relayed (no transform)."""
        other = copy.copy(self)
        other.req, other._payloads = req, {}
        if resume:
            other.transform = Continued(streamed_tokens)
        return other

    def payload(self, takes_priority: bool, engine_model: str | None = None) -> bytes:
        payload = self._payloads.get((takes_priority, engine_model))
        if payload is None:
            payload = self._payloads[(takes_priority, engine_model)] = upstream_payload(
                self.req,
                cache_salt=self.cache_salt,
                engine_priority=self.engine_priority if takes_priority else None,
                engine_model=engine_model,
            )
        return payload

    async def exchange(self, session, slot: Slot, send, *, outcome: Outcome, connect_timeout_s: float) -> None:
        sends_priority, rename = slot.takes_priority, slot.rename
        if self.adapter is not None:
            rename = ModelRename(engine=self.adapter.engine_name, endpoint=self.adapter.name)
        url = slot.url + self.path
        payload = self.payload(sends_priority, rename.engine if rename is not None else self.model)
        lora = self.adapter is not None
        if self.req.stream:
            await stream_exchange(
                session,
                url,
                payload,
                self.headers,
                send,
                response_headers=self.response_headers,
                forward_usage=self.req.client_wants_usage,
                outcome=outcome,
                connect_timeout_s=connect_timeout_s,
                priority_sent=sends_priority,
                rename=rename,
                transform=self.transform,
                adapter_request=lora,
            )
        else:
            await plain_exchange(
                session,
                url,
                payload,
                self.headers,
                send,
                response_headers=self.response_headers,
                outcome=outcome,
                connect_timeout_s=connect_timeout_s,
                priority_sent=sends_priority,
                rename=rename,
                adapter_request=lora,
            )


async def relay(state: ProxyState, flight: Flight, upstream: Upstream, send) -> None:
    """Send the request to its admitted replica and relay the answer to the client. A failure before anything
    reached the client is retried once on another replica; a stream that breaks after it is resumed on another
    (``resume.py``, at most ``MAX_RESUMES`` times); a replica that refuses ``priority`` gets the request again
    without it."""
    admission, outcome, first = flight.admission, flight.outcome, upstream
    outcome.on_first_token = lambda: admission.runtime.first_token(admission.slot, admission.route)
    tried: set[str] = set()
    reloaded: set[str] = set()
    retried = False
    resumes = 0
    while True:
        slot = admission.slot
        tried.add(slot.view.replica_id)
        if upstream.adapter is not None:
            await load_adapter(state, flight, upstream.adapter)
        try:
            await upstream.exchange(
                state.session, slot, send, outcome=outcome, connect_timeout_s=state.config.connect_timeout_s
            )
            return
        except AdapterMissing:
            adapter_gone(admission, upstream.adapter, reloaded)
            continue
        except PriorityRefused:
            # A replica on vLLM's default fcfs scheduler (launched by hand, or its options say priority but it is
            # not): remember it and resend on the same slot without the field; nothing was sent to the client yet.
            log.warning("replica %s refuses 'priority' (fcfs scheduler); sending it none", slot.name)
            slot.refused_priority = True
            continue
        except (StreamBroken, UpstreamFailed) as failed:
            note_failed_attempt(state, flight.endpoint.id, slot.replica_id, flight.request_id)
            if outcome.started_client:
                # Mid-stream (or a continuation that failed): resume elsewhere, or end the client's stream.
                buf = failed.buf if isinstance(failed, StreamBroken) else b""
                resumable = resumes < MAX_RESUMES and not isinstance(failed, ResumeRefused)
                going_on = resumed(first, outcome) if resumable else None
                if going_on is None or not move_to_another_replica(admission, tried, allowed=True):
                    m.child(m.STREAM_RESUMES, flight.endpoint.name, "ended").inc()
                    await end_stream(send, first.response_headers, outcome, buf=buf, done=False)
                    return
                upstream, resumes = going_on, resumes + 1
                flight.resumed_after.append(going_on.transform.streamed_tokens)
                # The original prompt as the new replica counts it, so its usage splits exactly (resume.py).
                going_on.transform.prompt_tokens = await replica_prompt_tokens(
                    state.session, admission.slot.url, flight.req
                )
                m.child(m.STREAM_RESUMES, flight.endpoint.name, "resumed").inc()
                outcome.last_read_at = time.perf_counter()  # the stream-idle watchdog counts from the switch
                continue
            if not move_to_another_replica(admission, tried, allowed=not retried):
                outcome.status = "upstream_error"
                raise ProxyError(
                    failed.status, f"Upstream replica failed: {failed}", type="server_error", code="upstream_error"
                ) from None
            retried = True
            upstream = first = for_retry(flight, upstream)
            flight.dispatched_at = time.perf_counter()
        outcome.first_token_at = outcome.last_read_at = None


def for_retry(flight: Flight, upstream: Upstream) -> Upstream:
    """Count the retry on another replica; the exchange it sends. A NIXL decode whose replica failed goes without its
    KV hand-over (the blocks it was to pull may be gone): the next replica prefills the prompt itself."""
    m.child(m.UPSTREAM_RETRIES, flight.endpoint.name).inc()
    if "kv_transfer_params" not in upstream.req.body:
        return upstream
    return upstream.continued(without_kv_transfer(upstream.req), 0, resume=False)


def without_kv_transfer(req: ParsedRequest) -> ParsedRequest:
    """``req`` without the KV hand-over the proxy put in it (docs/request-path.md, prefill/decode disaggregation)."""
    body = {k: v for k, v in req.body.items() if k != "kv_transfer_params"}
    return dataclasses.replace(req, body=body, controlled=True)


def resumed(upstream: Upstream, outcome: Outcome) -> Upstream | None:
    """The exchange that continues ``upstream`` (the first attempt) from all the client has read, or None if it
    cannot be."""
    if outcome.relayed is None:
        return None  # longer than what a stream keeps to resume it (relay.RELAYED_BYTES_KEPT)
    done = streamed(outcome.relayed, upstream.req.kind)
    req = continuation(upstream.req, done)
    return upstream.continued(req, done.tokens) if req is not None else None


async def load_adapter(state: ProxyState, flight: Flight, adapter: AdapterInfo) -> None:
    """Make the admitted replica hold the request's LoRA adapter, loading it first if it does not (``lora.py``); a
    load this request caused is charged to it (``Flight.adapter_load_mu``)."""
    admission, config = flight.admission, state.config
    runtime, slot = admission.runtime, admission.slot
    if admission.route.adapter != adapter.engine_name:  # the adapter changed between resolve and admission
        raise adapter_unavailable(adapter, "it changed while the request waited")
    load_s = await ensure_loaded(
        state.session,
        url=slot.url,
        replica=runtime.adapters_of(slot),
        adapter=adapter,
        max_loras=slot.view.max_loras,
        timeout_s=config.lora_load_timeout_s,
        tenant_slots=config.tenant_adapter_slots(slot.view.max_loras),
    )
    mu_per_s = runtime.info.coeffs.mu_per_min / 60.0
    flight.adapter_load_mu += load_mu(load_s, mu_per_s=mu_per_s, min_mu=config.lora_load_min_s * mu_per_s)


def adapter_unavailable(adapter: AdapterInfo, why: str) -> ProxyError:
    return ProxyError(
        503,
        f"The adapter `{adapter.name}` could not be served: {why}; retry shortly.",
        type="server_error",
        code="adapter_unavailable",
        param="model",
        retry_after=1,
        usage_status="upstream_error",
    )


def adapter_gone(admission: Admission, adapter: AdapterInfo, reloaded: set[str]) -> None:
    """The replica answered 404 for an adapter it was thought to hold: forget it there, so the next attempt loads
    it again; a second time on the same replica is a 503 with Retry-After, never the engine's 404."""
    slot = admission.slot
    admission.runtime.adapters_of(slot).last_used.pop(adapter.engine_name, None)
    if slot.view.replica_id in reloaded:
        raise adapter_unavailable(adapter, "the replica lost it twice")
    reloaded.add(slot.view.replica_id)


def move_to_another_replica(admission: Admission, tried: set[str], *, allowed: bool) -> bool:
    """Give the failed slot back and hold one on a replica not tried yet, if ``allowed`` and one is free; the
    new slot is taken first, so the freed one goes to the queue rather than back to this request."""
    runtime, route, mu = admission.runtime, admission.route, admission.mu
    retry_slot = runtime.try_take(route, mu, exclude=tried) if allowed else None
    runtime.release(admission.slot, route, mu, 0.0)
    admission.slot = retry_slot
    return retry_slot is not None


def note_failed_attempt(state: ProxyState, endpoint_id: int, replica_id, request_id: str) -> None:
    """Count an attempt that failed before the first byte against its replica, for the rollouts' canary comparison
    (the usage record names the replica that answered in the end, if any). Only on failures; fire and forget."""
    if state.redis is None:
        return

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
