"""The last stage of a proxied completion, run for every request whatever happened before (``pipeline.py``
calls it in its ``finally``): give the replica slot back with the request's actual cost, and, for a request that
reached a known endpoint, record its latency metrics and one usage record (written off the path by
``billing.ingest.UsageWriter``) and settle the tenant's buckets to the real cost. A request that ended before its
replica's usage block carries the usage of what it delivered (``unfinished.py``) by the time it gets here.
``measure``, ``meets_slo`` and ``usage_record`` are pure."""

from __future__ import annotations

import time
from dataclasses import dataclass

from capacity.units import MUCoefficients, usage_mu
from gateway.proxy import metrics as m
from gateway.proxy.disaggregation import SPLIT, split_mu, split_usage, usage_fields
from gateway.proxy.flight import Flight
from gateway.proxy.relay import Outcome
from gateway.proxy.snapshot import EndpointInfo
from gateway.proxy.state import ProxyState


# Not frozen: a frozen dataclass takes three times as long to build, once per request.
@dataclass(slots=True)
class Measured:
    """A finished request's tokens and latencies (seconds)."""

    input_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float


def meter(state: ProxyState, flight: Flight) -> None:
    done_at = time.perf_counter()
    outcome = flight.outcome
    if outcome is not None and outcome.finished_at is None:
        outcome.finished_at = done_at  # also stops the watchdog
    usage = outcome.usage if outcome is not None else None
    if usage is not None and flight.req is not None:
        usage = engine_usage(usage, flight.req.body.get("n"), streamed_block_size=_streamed_block_size(flight))
    endpoint, pd, prefill_mu = flight.endpoint, flight.pd, 0.0
    if pd is not None and pd.route == SPLIT and usage is not None:
        # Priced by phase (disaggregation.py), the prompt once: the prefill replica computed it once for all n.
        usage = split_usage(pd, outcome.usage)
        mu_done, prefill_mu = split_mu(endpoint, usage)
    else:
        mu_done = actual_mu(endpoint.coeffs, usage) if usage is not None and endpoint is not None else 0.0
    if flight.adapter is not None:
        mu_done *= flight.adapter.mu_factor  # a LoRA adapter's overhead on its base endpoint (docs/lora-serving.md)
        mu_done += flight.adapter_load_mu  # and the replica time of the load this request caused, if it did
    admission = flight.admission
    if admission is not None and admission.slot is not None:
        admission.runtime.release(admission.slot, admission.route, admission.mu, mu_done)
    key = flight.key
    if key is None or endpoint is None:
        return  # refused before its endpoint was known: not metered
    status = flight.usage_status or (outcome.status if outcome is not None else "ok")
    measured = measure(outcome, usage, t0=flight.t0, done_at=done_at)
    slo_met = meets_slo(status, measured, endpoint)
    queue_s = admission.queue_s if admission is not None else None
    _observe(endpoint.name, key.tenant_slug, flight.priority, status, slo_met, measured, queue_s)
    record = usage_record(flight, status=status, measured=measured, mu=mu_done, slo_met=slo_met)
    if pd is not None:
        record.update(usage_fields(pd, prefill_mu))
    state.usage.submit(record)
    if (key.budget_usd is not None or key.tenant_budget_usd is not None) and record["mu"] > 0:
        state.spawn(state.budgets.add(key, record["mu"]))  # spend against the key's and tenant's budgets
    if flight.charged:
        # Every bucket that took an estimate is settled to the real cost, the best-effort cap included.
        actual = {
            "mu": mu_done,
            "best_effort_mu": mu_done,
            "tpm": float(usage.get("total_tokens") or 0) if usage else 0.0,
        }
        state.spawn(
            state.limiter.settle(
                tenant_id=key.tenant_id, endpoint_id=endpoint.id, buckets=flight.charged, actual=actual
            )
        )


def engine_usage(usage: dict, n, *, streamed_block_size: int = 0) -> dict:
    """The usage of what the engine computed for a request of ``n`` sequences per prompt. vLLM fans it out into
    ``n`` sequences, each prefilled, the later ones from the full blocks the first one cached, while its usage block
    counts the prompt once (measured on vLLM 0.32, CPU build, 128-token blocks: a 613-token prompt with n=4 is 2,452
    prompt tokens and 1,536 prefix-cache hits in the engine's counters). Not streaming, its cached tokens are one
    later sequence's (512 there): the cached part counts ``n - 1`` times. Streaming, they are the first sequence's
    (0 for a new prompt: a 457-token chat with n=3 reported 0 while the engine counted 768 hits), so each later
    sequence is given the full blocks of the prompt, by the replica's ``streamed_block_size`` (0: unknown, the
    usage's figure stands)."""
    if not isinstance(n, int) or isinstance(n, bool) or n <= 1:
        return usage
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    if streamed_block_size > 0:
        later = max(cached, (max(prompt - 1, 0) // streamed_block_size) * streamed_block_size)
        cached_total = cached + (n - 1) * later
    else:
        cached_total = cached * (n - 1)
    return {
        **usage,
        "prompt_tokens": prompt * n,
        "prompt_tokens_details": {**(usage.get("prompt_tokens_details") or {}), "cached_tokens": cached_total},
        "total_tokens": prompt * n + completion,
    }


def _streamed_block_size(flight: Flight) -> int:
    """The serving replica's KV block size for a stream of one prompt (``engine_usage``), else 0."""
    req, admission = flight.req, flight.admission
    if not req.stream or req.prompts != 1 or admission is None or admission.slot is None:
        return 0
    return int(getattr(admission.slot.view, "block_size", 0) or 0)


def actual_mu(coeffs: MUCoefficients, usage: dict) -> float:
    """The request's cost from the replica's usage block (cached prompt tokens at their own rate)."""
    details = usage.get("prompt_tokens_details") or {}
    return usage_mu(
        coeffs,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )


def measure(outcome: Outcome | None, usage: dict | None, *, t0: float, done_at: float) -> Measured:
    """Tokens from the usage block; without one (a stream that broke first), the output is the content events
    delivered (one token per chunk, as vLLM streams). TTFT from arrival; TPOT over the tokens after the first."""
    input_tokens = cached = output = 0
    if usage is not None:
        input_tokens = int(usage.get("prompt_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        output = int(usage.get("completion_tokens") or 0)
    elif outcome is not None and outcome.content_events:
        output = max(0, outcome.content_events)
    ttft_s = tpot_s = None
    if outcome is not None and outcome.first_token_at is not None:
        ttft_s = outcome.first_token_at - t0
        if output > 1:
            tpot_s = ((outcome.finished_at or done_at) - outcome.first_token_at) / (output - 1)
    return Measured(input_tokens, cached, output, ttft_s, tpot_s, done_at - t0)


def meets_slo(status: str, measured: Measured, endpoint: EndpointInfo) -> bool:
    """Goodput: answered ok, with TTFT and TPOT within the endpoint's SLO."""
    return (
        status == "ok"
        and measured.ttft_s is not None
        and measured.ttft_s * 1000 <= endpoint.ttft_slo_ms
        and (measured.tpot_s is None or measured.tpot_s * 1000 <= endpoint.tpot_slo_ms)
    )


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None


def usage_record(flight: Flight, *, status: str, measured: Measured, mu: float, slo_met: bool) -> dict:
    """The request's row for ``billing.UsageRecord`` (``request_id`` is unique: a retried write is a no-op)."""
    admission = flight.admission
    slot = admission.slot if admission is not None else None
    return {
        "request_id": flight.request_id,
        "tenant_id": flight.key.tenant_id,
        "api_key_id": flight.key.id,
        "endpoint_id": flight.endpoint.id,
        "replica_id": slot.replica_id if slot is not None else None,
        "priority": flight.priority,
        "input_tokens": measured.input_tokens,
        "cached_tokens": measured.cached_tokens,
        "output_tokens": measured.output_tokens,
        "mu": round(mu, 6),
        "queue_ms": _ms(admission.queue_s if admission is not None else None),
        "ttft_ms": _ms(measured.ttft_s),
        "tpot_ms": _ms(measured.tpot_s),
        "e2e_ms": round(measured.e2e_s * 1000, 3),
        "status": status,
        "slo_met": slo_met,
        "degradation": flight.degradation,
        "adapter": flight.adapter.name if flight.adapter is not None else "",
        "adapter_load_mu": round(flight.adapter_load_mu, 6),
        # The continuation's prompt is the original one and what was streamed before each resume.
        "platform_prompt_tokens": sum(measured.input_tokens + k for k in flight.resumed_after),
        "requested_endpoint_id": flight.requested.id if flight.requested is not None else flight.endpoint.id,
        "started_at": flight.started_at,
        "finished_at": flight.started_at + measured.e2e_s,
    }


def _observe(
    endpoint: str, tenant: str, priority: str, status: str, slo_met: bool, measured: Measured, queue_s
) -> None:
    m.child(m.REQUESTS, endpoint, tenant, priority, status).inc()
    if slo_met:
        m.child(m.GOOD_REQUESTS, endpoint, tenant, priority).inc()
    m.child(m.E2E, endpoint).observe(measured.e2e_s)
    if measured.ttft_s is not None:
        m.child(m.TTFT, endpoint).observe(measured.ttft_s)
    if measured.tpot_s is not None:
        m.child(m.TPOT, endpoint).observe(measured.tpot_s)
    if queue_s is not None:
        m.child(m.QUEUE_TIME, endpoint, priority).observe(queue_s)
