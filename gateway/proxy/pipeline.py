"""A proxied completion as a pipeline of named stages (``stages.py``): authenticate → parse → price → degrade →
limit → admit (routing) → relay → meter (``metering.py``), the attempt moving to the endpoint's fallback when it
would be shed or fails before the first byte (``brownout.py``). This module runs them in order on one ``Flight``, answers a refusal
with its OpenAI-shaped error, ends a request whose client left or whose replica stalled, and meters every request
whatever happened."""

from __future__ import annotations

import asyncio
import time

from capacity.units import estimate_prompt_tokens
from config.request_log import request_id as log_request_id
from gateway.proxy.brownout import degrade, fall_back, mark_slot_share
from gateway.proxy.disaggregation import prefill_phase
from gateway.proxy.errors import ProxyError, send_error, sse_error_event
from gateway.proxy.flight import Flight, Price
from gateway.proxy.metering import meter
from gateway.proxy.prefill_pool import DISAGGREGATED
from gateway.proxy.relay import Outcome
from gateway.proxy.request import ParsedRequest, requested_priority
from gateway.proxy.snapshot import EndpointInfo
from gateway.proxy.stages import (
    Upstream,
    admit,
    authenticate,
    charge_limits,
    price_request,
    prompt_tokens,
    read_request,
    relay,
    resolve_model,
    routing_request,
)
from gateway.proxy.state import ProxyState, get_state
from gateway.proxy.tracing import dispatched, finish, mark, routed, start
from gateway.proxy.unfinished import needs_partial_usage, partial_usage, prompt_token_count

NON_STREAM_MIN_TOKENS_PER_S = 5.0


async def completion(scope, receive, send, kind: str) -> None:
    """``POST /v1/chat/completions`` (``kind`` "chat") or ``/v1/completions`` ("completions")."""
    flight = Flight(t0=time.perf_counter(), task=asyncio.current_task())
    log_request_id.set(flight.request_id)  # on this request's log lines (its own task's context: nothing to reset)
    state = await get_state()
    headers = dict(scope["headers"])
    start(flight, headers)
    try:
        await run_stages(state, flight, headers, receive, send, kind)
    except ProxyError as err:
        outcome = flight.outcome
        flight.usage_status = err.usage_status or (outcome.status if outcome and outcome.status != "ok" else None)
        await send_error(send, err, flight.response_headers())
    except asyncio.CancelledError:
        if flight.cancel_reason is None:
            raise  # not ours: the server is shutting the task down
        flight.task.uncancel()
        await end_cancelled(flight, send)
    finally:
        if flight.watcher is not None:
            flight.watcher.cancel()
        if flight.watchdog is not None:
            flight.watchdog.cancel()
        if needs_partial_usage(flight.outcome, flight.cancel_reason) and flight.req is not None:
            await count_unfinished(state, flight)
        meter_started = time.perf_counter() if flight.marks is not None else 0.0
        meter(state, flight)
        finish(flight, meter_started)


async def run_stages(state: ProxyState, flight: Flight, headers: dict[bytes, bytes], receive, send, kind: str) -> None:
    key = flight.key = authenticate(state.snapshot, headers, now=time.time(), scope="inference")
    mark(flight, "authenticate")
    req = flight.req = await read_request(receive, headers, kind=kind, config=state.config)
    endpoint, flight.adapter = resolve_model(state.snapshot, key, req)
    mark(flight, "parse")
    requested = requested_priority(headers)
    flight.endpoint = flight.requested = endpoint  # from here on an error is metered (one refused above is not)
    visited = {endpoint.id}
    while True:
        try:
            await serve(state, flight, endpoint, req, headers, requested, receive, send)
            return
        except ProxyError as err:
            if flight.adapter is not None:
                raise  # a LoRA adapter is served by its base endpoint only: no fallback holds it
            # Shed, failing or no ready replica: the endpoint's fallback, if one may serve it (brownout.py).
            endpoint = fall_back(state, flight, err, visited)
            flight.pd = None  # the named endpoint's prefill/decode split, if any, is not the fallback's


async def serve(
    state: ProxyState, flight: Flight, endpoint: EndpointInfo, req: ParsedRequest, headers, requested, receive, send
) -> None:
    """One attempt on one endpoint (the one named, or a fallback): price, degrade, limit, admit, relay."""
    config, key = state.config, flight.key
    flight.endpoint, runtime = endpoint, state.runtime_for(endpoint)
    started = attempt_started(flight)

    def reprice(r: ParsedRequest) -> Price:
        return price_request(
            state.snapshot,
            key=key,
            endpoint=endpoint,
            req=r,
            requested=requested,
            best_effort_mu_per_min=config.best_effort_mu_per_min,
            mu_factor=flight.adapter.mu_factor if flight.adapter is not None else 1.0,
            adapter=flight.adapter,
        )

    price = flight.price = reprice(req)
    flight.requested_price = flight.requested_price or price
    req, price = degrade(runtime, flight, req, price, reprice=reprice)
    flight.price = price
    mark(flight, "price")
    flight.charged = await charge_limits(state.limiter, key=key, endpoint=endpoint, price=price, budgets=state.budgets)
    mark(flight, "limits")
    if flight.watcher is None:  # from here on the body is read: a disconnect cancels whatever we are waiting for
        flight.watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, flight))
    cache_salt, adapter = state.cache_salts.for_tenant(key.tenant_id), flight.adapter
    route = routing_request(
        flight.request_id,
        key=key,
        req=req,
        headers=headers,
        mu=price.mu,
        cache_salt=cache_salt,
        adapter=adapter.name if adapter is not None else None,
    )
    await prompt_tokens(state, runtime, route, req)
    flight.admission = await admit(runtime, route, key=key, endpoint=endpoint, price=price)
    routed(flight)
    mark_slot_share(flight, flight.admission)
    timing = server_timing(flight, time.perf_counter() - started)
    if endpoint.serving_mode == DISAGGREGATED:
        req = await prefill_phase(state, flight, req, cache_salt=cache_salt)  # disaggregation.py
    upstream = Upstream(
        req,
        request_id=flight.request_id,
        priority=price.priority,
        cache_salt=cache_salt,
        rid_header=[*flight.response_headers(), timing],
        model=endpoint.name if endpoint is not flight.requested else None,
        adapter=adapter,
    )
    flight.outcome = Outcome()
    flight.dispatched_at = time.perf_counter()
    dispatched(flight, upstream.headers)
    arm_watchdog(flight, req, config.ttft_timeout_s, config.idle_timeout_s, asyncio.get_running_loop())
    await relay(state, flight, upstream, send)


async def count_unfinished(state: ProxyState, flight: Flight) -> None:
    """Give a request that ended before its usage block the usage of what its replica computed
    (``unfinished.py``), asking the replica that served it for the prompt's exact count."""
    admission = flight.admission
    slot = admission.slot if admission is not None else None
    prompt_tokens = estimate_prompt_tokens(flight.req.prompt_chars)
    try:
        prompt_tokens = await prompt_token_count(state.session, slot.url if slot is not None else None, flight.req)
    except asyncio.CancelledError:
        pass  # the server is shutting down: metered with the estimate
    flight.outcome.usage = partial_usage(prompt_tokens, flight.outcome)


async def watch_disconnect(receive, flight: Flight) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            outcome = flight.outcome
            if outcome is not None and outcome.done:
                return  # our own end of the response, not the client leaving; let the upstream drain
            if outcome is not None and outcome.first_token_at is None:
                leave_at_first_byte(flight, outcome)
                return
            flight.cancel("client")  # queued (nothing computed yet) or mid-stream (metered as delivered)
            return


def leave_at_first_byte(flight: Flight, outcome: Outcome) -> None:
    """The client left a dispatched request before the replica's first byte: the replica is computing the prompt
    (or, not streaming, the whole answer), work the engine counts only once that byte comes. The request runs until
    then and is cancelled there, so it is metered as the engine counts it (docs/request-path.md, metering): a
    stream for its prompt, a non-streaming answer in full, as OpenAI bills one. The first-token watchdog still
    bounds the wait."""
    flight.usage_status = "client_cancelled"
    if not flight.req.stream:
        return  # its first byte is the whole answer, read to the end and metered from the replica's usage
    heard = outcome.on_first_token

    def first_byte_then_leave() -> None:
        if heard is not None:
            heard()
        flight.cancel("client")

    outcome.on_first_token = first_byte_then_leave


def attempt_started(flight: Flight) -> float:
    """Now, an endpoint's attempt beginning; the first one's start is where Server-Timing's first stages end."""
    now = time.perf_counter()
    if flight.before_serve_s is None:
        flight.before_serve_s = now - flight.t0
    return now


def server_timing(flight: Flight, serving_s: float) -> tuple[bytes, bytes]:
    """The ``Server-Timing`` header of an answer (W3C): how long the request waited in the endpoint's queue and how
    long the proxy itself took until it was sent to a replica (its stages before the endpoint was known, and this
    endpoint's until dispatch; an endpoint fallen back from is left out, its replica's time with it), the rest of
    its time before the replica's first byte (a prefill on another replica included) being the replica's.
    Milliseconds. ``serving_s``: since this endpoint's attempt began."""
    queued = flight.admission.queue_s if flight.admission is not None else 0.0
    own = (flight.before_serve_s or 0.0) + max(0.0, serving_s - queued)
    return b"server-timing", f"queue;dur={queued * 1000:.3f}, proxy;dur={own * 1000:.3f}".encode()


def arm_watchdog(
    flight: Flight, req: ParsedRequest, ttft_s: float, idle_s: float, loop: asyncio.AbstractEventLoop
) -> None:
    # A non-streaming answer shows no byte before it is complete, so its first-byte limit also allows generation
    # at a floor of NON_STREAM_MIN_TOKENS_PER_S.
    first_byte_s = ttft_s
    if not req.stream:
        first_byte_s += (req.max_tokens or 4096) / NON_STREAM_MIN_TOKENS_PER_S
    if flight.watchdog is not None:
        flight.watchdog.cancel()  # an earlier attempt's (a retry, a fallback): one watchdog a request
    flight.watchdog = loop.call_later(min(ttft_s, idle_s) / 4, watchdog, flight, first_byte_s, idle_s, loop)


def watchdog(flight: Flight, ttft_s: float, idle_s: float, loop: asyncio.AbstractEventLoop) -> None:
    """Re-arming timer: ends a request with no first byte after ``ttft_s`` or no data for ``idle_s``."""
    outcome = flight.outcome
    if flight.cancel_reason is not None or outcome is None or outcome.finished_at is not None:
        return
    now = time.perf_counter()
    if outcome.first_token_at is None:
        if flight.dispatched_at is not None and now - flight.dispatched_at > ttft_s:
            flight.cancel("ttft")
            return
    elif now - (outcome.last_read_at or outcome.first_token_at) > idle_s:
        flight.cancel("idle")
        return
    flight.watchdog = loop.call_later(min(ttft_s, idle_s) / 4, watchdog, flight, ttft_s, idle_s, loop)


async def end_cancelled(flight: Flight, send) -> None:
    """The watcher or the watchdog ended the request: meter it as the client's cancel or as a timeout, and tell
    the client about a timeout (an SSE error event if its stream had started, else a 504)."""
    outcome = flight.outcome
    if outcome is not None and outcome.done:
        return  # the whole answer was delivered; the client just closed first
    reason = flight.cancel_reason
    if reason == "client":
        flight.usage_status = "client_cancelled"
        return
    flight.usage_status = "timeout"
    message = "no first token from the replica in time" if reason == "ttft" else "the replica stopped streaming"
    try:
        if outcome is not None and outcome.started_client:
            await send(
                {"type": "http.response.body", "body": sse_error_event(message, type="timeout"), "more_body": False}
            )
        else:
            await send_error(
                send,
                ProxyError(504, message.capitalize() + ".", type="timeout", code=reason),
                flight.response_headers(),
            )
    except Exception:  # noqa: BLE001 - the client may be gone as well
        pass
