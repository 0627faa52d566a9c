"""One proxied request's record as it goes through the stages (``stages.py``, run by ``pipeline.py``): each field
is set by the stage that produces it, so metering, the error answer and the cancel paths can tell how far the
request got. Also the request ids every proxy response carries."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from gateway.proxy.limits import Bucket
from gateway.proxy.relay import Outcome
from gateway.proxy.runtime import EndpointRuntime, Slot
from gateway.proxy.snapshot import AdapterInfo, EndpointInfo, KeyInfo
from gateway.routing.base import RouteRequest


def new_request_id() -> str:
    """96 random bits: unique across processes, and two of a client's ids tell it nothing of the traffic between
    them (a counter would count it; so would a seeded generator, whose state a few ids give away)."""
    return "req-" + os.urandom(12).hex()


# Not frozen: a frozen dataclass takes three times as long to build, once per request.
@dataclass(slots=True)
class Price:
    """What the price stage decided: the class the request runs in, its estimated cost and the tenant's buckets
    that cost is charged to."""

    priority: str
    mu: float
    tokens: int
    buckets: list[Bucket]
    reserved_mu_per_s: float = 0.0  # the tenant's reservation on this endpoint (fair pain measures excess on it)


@dataclass(slots=True, eq=False)
class Admission:
    """A replica slot held for the request. ``slot`` moves when the relay retries on another replica and is None
    once given back."""

    runtime: EndpointRuntime
    route: RouteRequest
    slot: Slot | None
    queue_s: float
    mu: float  # reserved on the slot; given back with the actual cost at release


class Flight:
    """One request in flight, shared by the stages, the disconnect watcher and the watchdog."""

    __slots__ = (
        "request_id",
        "rid_header",
        "t0",
        "started_at",
        "task",
        "key",
        "endpoint",
        "adapter",
        "adapter_load_mu",
        "price",
        "charged",
        "admission",
        "outcome",
        "dispatched_at",
        "cancel_reason",
        "usage_status",
        "watcher",
        "watchdog",
        "before_serve_s",
        "requested",
        "requested_price",
        "fallback_from",
        "degraded_to",
        "slot_share",
        "level",
        "first_error",
        "span",
        "marks",
        "upstream_span",
        "req",
        "resumed_after",
        "pd",
    )

    def __init__(self, *, t0: float, task: asyncio.Task) -> None:
        self.t0 = t0  # perf_counter at arrival: TTFT and E2E are measured from here
        self.started_at = time.time()
        self.request_id = new_request_id()
        self.rid_header = [(b"x-request-id", self.request_id.encode())]
        self.task = task
        self.key: KeyInfo | None = None  # authenticated
        # Set once the request is valid and its endpoint known: from then on every outcome is metered.
        self.endpoint: EndpointInfo | None = None
        self.adapter: AdapterInfo | None = None  # the LoRA adapter it names (``endpoint`` is its base endpoint)
        # MU of the adapter loads this request caused on its replicas (``stages.load_adapter``; docs/lora-serving.md)
        self.adapter_load_mu: float = 0.0
        self.price: Price | None = None
        self.charged: list[Bucket] = []  # buckets the limit stage took from: settled to the real cost
        self.admission: Admission | None = None
        self.outcome: Outcome | None = None  # the relay's, from the first upstream attempt on
        self.dispatched_at: float | None = None  # the current attempt's start, for the first-token limit
        self.cancel_reason: str | None = None  # "client", "ttft" or "idle"
        self.usage_status: str | None = None  # overrides the outcome's status in the usage record
        self.watcher: asyncio.Task | None = None
        # The watchdog's next check (``pipeline.arm_watchdog``): cancelled when the request ends, so a finished
        # request is not held in memory, with all it refers to, until its timer comes due.
        self.watchdog: asyncio.TimerHandle | None = None
        self.before_serve_s: float | None = None  # arrival to the first endpoint's attempt (Server-Timing)
        # Brownout (``brownout.py``): the endpoint the client named and its price (``endpoint`` and ``price`` move
        # to a fallback), the name of the endpoint fallen back from, the max_tokens a degraded request was capped
        # at, the degradation level of the endpoint that served it, and the first refusal (answered when no
        # fallback serves).
        self.requested: EndpointInfo | None = None
        self.requested_price: Price | None = None
        self.fallback_from: str | None = None
        self.degraded_to: int | None = None
        self.slot_share: float | None = None  # the slot share it was admitted under (runtime.SLOT_SHARE_KEY)
        self.level: int | None = None
        self.first_error = None
        # Tracing (``tracing.py``): the root span, the stages' end stamps and the upstream span; None while off.
        self.span = None
        self.marks: list | None = None
        self.upstream_span = None
        self.req = None  # the parsed request (request.ParsedRequest), once read: metering an unfinished one counts it
        self.resumed_after: list[int] = []  # tokens already streamed at each resume (the platform's prefill again)
        # A disaggregated endpoint's split (``disaggregation.PDRoute``): prefill replica, route, prefill usage.
        self.pd = None

    @property
    def degradation(self) -> str:
        """The usage record's ``degradation``: "fallback", "degraded" or ""."""
        if self.fallback_from is not None:
            return "fallback"
        return "degraded" if self.degraded_to is not None or self.slot_share is not None else ""

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """What every response to this request carries: its id and, once an endpoint is known, the brownout
        signals (the degradation level; what was degraded; the endpoint fallen back from)."""
        headers = list(self.rid_header)
        if self.level is not None:
            headers.append((b"x-infercap-degradation-level", str(self.level).encode()))
        kinds = [f"max_tokens={self.degraded_to}"] if self.degraded_to is not None else []
        if self.slot_share is not None:
            kinds.append(f"slot_share={self.slot_share:g}")
        if kinds:
            headers.append((b"x-infercap-degraded", ", ".join(kinds).encode()))
        if self.fallback_from is not None:
            headers.append((b"x-infercap-fallback-from", self.fallback_from.encode()))
        return headers

    @property
    def priority(self) -> str:
        return self.price.priority if self.price is not None else "standard"

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.task.cancel()
