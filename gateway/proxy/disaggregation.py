"""Prefill/decode disaggregation on the request path (docs/request-path.md, "Prefill/decode disaggregation").

A disaggregated endpoint has two pools. Its runtime (``runtime.EndpointRuntime``) admits over the decode replicas,
so priorities, queue-age shedding and 429 Retry-After hold for the pair as for any request. Once a decode replica
is admitted, ``prefill_phase`` decides: a prompt whose estimated uncached part on that decode replica is under the
endpoint's ``pd_min_uncached_tokens`` goes there alone (selective disaggregation, as llm-d does it); otherwise a
prefill replica is picked (``prefill_pool.PrefillPool``: infercap's prefix affinity and prefill load) and
sent the same request with ``max_tokens`` 1, not streamed, whose KV the connector hands to the decode replica (NIXL:
through the ``kv_transfer_params`` the prefill answers). A prefill replica that fails, times out or has no free slot
leaves the prefill to the decode replica: no client error, counted (``infercap_proxy_pd_prefill_fallbacks``) and
written on the usage record. Metering prices a split request by phase (``split_mu``).

Nothing here runs for an aggregated endpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass

import aiohttp

from capacity.units import MUCoefficients, request_mu
from gateway.admission import ENGINE_PRIORITY
from gateway.proxy import metrics as m
from gateway.proxy.isolation import STRIPPED_FIELDS
from gateway.proxy.prefill_pool import CLASS_KEY, STANDARD_CLASS, PrefillSlot, prefill_pool
from gateway.proxy.relay import PriorityRefused, UpstreamFailed, upstream_url
from gateway.proxy.request import ParsedRequest
from gateway.proxy.snapshot import EndpointInfo
from gateway.proxy.stages import UPSTREAM_PATH
from gateway.proxy.tracing import prefilled
from gateway.routing.base import RouteRequest
from gateway.routing.bounded_affinity import PREFIX_MATCHES_KEY

log = logging.getLogger(__name__)

# How a disaggregated endpoint served a request (``UsageRecord.pd_route``).
SPLIT, DECODE_ONLY, FALLBACK = "split", "decode_only", "fallback"
# Body fields the prefill does not carry: it is one sequence of one token, answered whole.
_PREFILL_DROPPED = frozenset({"stream", "stream_options", "max_completion_tokens", "min_tokens", "n", "best_of"})
# What vLLM's NixlConnector reads on the prefill request (its disaggregated-serving proxy sends the same): keep the
# KV blocks for a remote decode; the answer's ``kv_transfer_params`` say where the decode replica pulls them from.
NIXL_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
PREFILL_TIMEOUT_FLOOR_S = 1.0
PREFILL_ATTEMPTS = 2  # a prefill replica that fails fast: one more, on another, within the same time budget


@dataclass(slots=True, eq=False)
class PDRoute:
    """What the split stage decided for one request (``Flight.pd``), for metering and the usage record."""

    route: str  # SPLIT, DECODE_ONLY or FALLBACK
    prefill_replica_id: int | None = None
    prefill_usage: dict | None = None  # the prefill replica's usage block (its cached/uncached prompt split)
    reason: str = ""  # a fallback's: no_prefill_slot, failed, timeout, refused


# -- the split ----------------------------------------------------------------------------------------------------
def uncached_estimate(route: RouteRequest, decode_replica_id: str) -> float:
    """The prompt tokens the admitted decode replica would have to prefill: the admission's estimate less the
    share its router expects cached there (infercap's prefix match; other policies: none)."""
    tokens = route.extra.get("prompt_tokens", 0)
    matches = route.extra.get(PREFIX_MATCHES_KEY)
    match = matches.get(decode_replica_id, 0.0) if matches else 0.0
    return tokens * (1.0 - match)


def prefill_timeout_s(ttft_timeout_s: float, endpoint: EndpointInfo) -> float:
    """How long a prefill may take before the decode replica prefills instead: twice the endpoint's TTFT SLO (at
    least a second), never more than half the proxy's first-token limit, so the decode keeps the other half."""
    return min(ttft_timeout_s / 2, max(PREFILL_TIMEOUT_FLOOR_S, 2 * endpoint.ttft_slo_ms / 1000))


def prefill_payload(
    req: ParsedRequest, *, cache_salt: str, engine_priority: int | None, engine_model: str, kv_connector: str
) -> bytes:
    """The prefill request: the client's, as one sequence of one token answered whole, under the tenant's cache
    salt, the admitted class's engine priority and the engine's model name (the decode request's own)."""
    body = {k: v for k, v in req.body.items() if k not in _PREFILL_DROPPED and k not in STRIPPED_FIELDS}
    body["model"] = engine_model
    body["max_tokens"] = 1
    body["stream"] = False
    body["cache_salt"] = cache_salt
    if engine_priority is not None:
        body["priority"] = int(engine_priority)
    else:
        body.pop("priority", None)
    if kv_connector == "nixl":
        body["kv_transfer_params"] = dict(NIXL_PREFILL_PARAMS)
    return json.dumps(body, separators=(",", ":")).encode()


def decode_request(req: ParsedRequest, answer: dict, kv_connector: str) -> ParsedRequest:
    """The request the decode replica gets: the client's, plus (NIXL) the prefill answer's ``kv_transfer_params``,
    which name where its KV blocks wait. The shared-storage connector finds them by the prompt itself."""
    params = answer.get("kv_transfer_params")
    if kv_connector != "nixl" or not isinstance(params, dict):
        return req
    body = {**req.body, "kv_transfer_params": params}
    return dataclasses.replace(req, body=body, controlled=True)


async def call_prefill(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    headers: dict,
    *,
    timeout_s: float,
    connect_timeout_s: float,
    priority_sent: bool = False,
) -> dict:
    """POST the prefill and return its JSON answer. Raises TimeoutError past ``timeout_s``, ``PriorityRefused`` for
    a 400 naming the ``priority`` it was sent, ``UpstreamFailed`` for an unreachable replica or any other answer but
    a 200 JSON object; a cancel (the client left) closes the connection, which aborts the request in the engine."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
    async with asyncio.timeout(timeout_s):
        try:
            resp = await session.post(upstream_url(url), data=payload, headers=headers, timeout=timeout)
            async with resp:
                body = await resp.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamFailed(f"prefill replica unreachable: {type(exc).__name__}") from exc
    if priority_sent and resp.status == 400 and b"priority" in body.lower():
        raise PriorityRefused()
    if resp.status != 200:
        raise UpstreamFailed(f"prefill replica answered {resp.status}", status=resp.status)
    try:
        answer = json.loads(body)
    except ValueError:
        raise UpstreamFailed("prefill replica answered no JSON") from None
    if not isinstance(answer, dict):
        raise UpstreamFailed("prefill replica answered no JSON object")
    return answer


def prefill_route(route: RouteRequest, coeffs: MUCoefficients) -> RouteRequest:
    """What the prefill router sees: the decode route's prompt, salt and session, costed as a prefill alone (its
    own ``extra``: the two routers' notes on one request must not mix)."""
    tokens = route.extra.get("prompt_tokens", 0)
    return RouteRequest(
        request_id=route.request_id,
        prompt_text=route.prompt_text,
        mu=request_mu(coeffs, tokens, 0, 0),
        session_id=route.session_id,
        extra={
            "cache_salt": route.extra.get("cache_salt", ""),
            "prompt_tokens": tokens,
            CLASS_KEY: route.extra.get(CLASS_KEY, STANDARD_CLASS),  # its class, for the slots' shares
        },
    )


async def prefill_phase(state, flight, req: ParsedRequest, *, cache_salt: str) -> ParsedRequest:
    """The request the admitted decode replica is sent, after its prefill phase (``split``), which is a span of the
    request's trace when tracing is on (``tracing.prefilled``)."""
    req = await split(state, flight, req, cache_salt=cache_salt)
    prefilled(flight)
    return req


async def split(state, flight, req: ParsedRequest, *, cache_salt: str) -> ParsedRequest:
    """Run the prefill of a request admitted on a disaggregated endpoint's decode replica, or decide it needs none;
    returns the request the decode replica is sent. A prefill replica that cannot be reached or answers 5xx is given
    a cooldown and the prefill tried once more on another, within the same time budget; past that, a timeout or a
    refusal, the decode replica prefills (``FALLBACK``): never an error for the client. A cancel while it runs (the
    client left) aborts it and ends the request."""
    admission, endpoint = flight.admission, flight.endpoint
    # A LoRA adapter is loaded on the decode replica only (the prefill pool holds none): its request stays there;
    # an embedding is one prefill with nothing to decode.
    if (
        flight.adapter is not None
        or req.kind == "embeddings"
        or (uncached_estimate(admission.route, admission.slot.view.replica_id) < endpoint.pd_min_uncached_tokens)
    ):
        return _decided(flight, PDRoute(DECODE_ONLY), req)
    pool = prefill_pool(admission.runtime)
    route = prefill_route(admission.route, endpoint.prefill_coeffs or endpoint.coeffs)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + prefill_timeout_s(state.config.ttft_timeout_s, endpoint)
    tried: set[str] = set()
    reason = "no_prefill_slot"
    for _ in range(PREFILL_ATTEMPTS):
        slot = pool.take(route, exclude=tried)
        if slot is None:
            break
        tried.add(slot.view.replica_id)
        flight.pd = PDRoute(SPLIT, prefill_replica_id=slot.replica_id)
        try:
            answer = await _prefill_on(state, flight, slot, req, cache_salt, timeout_s=deadline - loop.time())
        except TimeoutError:
            reason = "timeout"
            break  # the budget is spent: no time for another prefill before the decode's own
        except UpstreamFailed as failed:
            # A 404 is the replica's (it does not serve the model it is sent): cooled down like a failure.
            reason = "refused" if 400 <= failed.status < 500 and failed.status != 404 else "failed"
            if reason == "refused":
                break  # the request, not the replica: the decode replica answers it (a 4xx passes through)
            pool.cool_down(slot)
            continue
        finally:
            pool.release(slot, route)
        usage = answer.get("usage")
        flight.pd.prefill_usage = usage if isinstance(usage, dict) else None
        # The prompt is computed: no prefill of it waits on the decode replica (its router's pending prefill).
        admission.runtime.first_token(admission.slot, admission.route)
        m.child(m.PD_REQUESTS, endpoint.name, SPLIT).inc()
        return decode_request(req, answer, endpoint.kv_connector)
    prefill_replica = flight.pd.prefill_replica_id if flight.pd is not None else None
    # A busy pool is routine under load (counted, not logged per request); a failure is worth a line.
    (log.debug if reason == "no_prefill_slot" else log.warning)(
        "prefill for %s: %s; the decode replica prefills", endpoint.name, reason
    )
    return _decided(flight, PDRoute(FALLBACK, prefill_replica_id=prefill_replica, reason=reason), req)


async def _prefill_on(state, flight, slot: PrefillSlot, req: ParsedRequest, cache_salt: str, *, timeout_s: float):
    """One prefill on ``slot`` (``call_prefill``), as the decode request would be sent but one token long. A replica
    that refuses ``priority`` (vLLM's fcfs scheduler) is remembered and sent the prefill again without it."""
    endpoint, config = flight.endpoint, state.config
    headers = {"content-type": "application/json", "x-request-id": flight.request_id}
    url = slot.url + UPSTREAM_PATH[req.kind]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        sends_priority = slot.takes_priority
        payload = prefill_payload(
            req,
            cache_salt=cache_salt,
            engine_priority=ENGINE_PRIORITY[flight.priority] if sends_priority else None,
            engine_model=slot.rename.engine if slot.rename is not None else endpoint.name,
            kv_connector=endpoint.kv_connector,
        )
        left_s = deadline - asyncio.get_running_loop().time()
        try:
            return await call_prefill(
                state.session,
                url,
                payload,
                headers,
                timeout_s=left_s,
                connect_timeout_s=config.connect_timeout_s,
                priority_sent=sends_priority,
            )
        except PriorityRefused:
            log.warning("prefill replica %s refuses 'priority' (fcfs scheduler); sending it none", slot.name)
            slot.refused_priority = True


def _decided(flight, pd: PDRoute, req: ParsedRequest) -> ParsedRequest:
    flight.pd = pd
    name = flight.endpoint.name
    m.child(m.PD_REQUESTS, name, pd.route).inc()
    if pd.route == FALLBACK:
        m.child(m.PD_PREFILL_FALLBACKS, name, pd.reason).inc()
    return req


# -- metering -----------------------------------------------------------------------------------------------------
def split_usage(pd: PDRoute, usage: dict) -> dict:
    """A split request's usage as billed: the decode replica's, with the prompt's cached part as the prefill replica
    counted it (the decode replica reports the transferred KV as cached; the prompt was computed on the prefill)."""
    prefill = pd.prefill_usage or {}
    cached = int((prefill.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    prompt = int(usage.get("prompt_tokens") or 0)
    details = {**(usage.get("prompt_tokens_details") or {}), "cached_tokens": min(max(cached, 0), prompt)}
    return {**usage, "prompt_tokens_details": details}


def split_mu(endpoint: EndpointInfo, usage: dict) -> tuple[float, float]:
    """(the request's MU, its prefill part): the prompt at the prefill pool's alpha, alpha_cached and gamma, the
    output at the decode pool's beta (``capacity.units.request_mu`` per phase)."""
    prefill = endpoint.prefill_coeffs or endpoint.coeffs
    prompt = max(int(usage.get("prompt_tokens") or 0), 0)
    cached = min(int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0), prompt)
    prefill_mu = request_mu(prefill, prompt - cached, max(cached, 0), 0)
    return prefill_mu + endpoint.coeffs.beta * max(int(usage.get("completion_tokens") or 0), 0), prefill_mu


def usage_fields(pd: PDRoute, prefill_mu: float) -> dict:
    """The usage record's P/D columns (``billing.UsageRecord.pd_route``, ``prefill_replica``, ``prefill_mu``)."""
    return {"pd_route": pd.route, "prefill_replica_id": pd.prefill_replica_id, "prefill_mu": round(prefill_mu, 6)}
