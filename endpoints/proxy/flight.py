"""One proxied request's record as it goes through the stages (``stages.py``, run by ``pipeline.py``): each field
is set by the stage that produces it, so metering, the error answer and the cancel paths can tell how far the
request got. Also the request ids every proxy response carries."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass

from endpoints.proxy.limits import Bucket
from endpoints.proxy.relay import Outcome
from endpoints.proxy.runtime import EndpointRuntime, Slot
from endpoints.proxy.snapshot import EndpointInfo, KeyInfo
from endpoints.routing.base import RouteRequest

# Request ids: a random per-process prefix and a counter, unique across processes without a syscall per request.
_ID_PREFIX = "req-" + uuid.uuid4().hex[:16]
_id_counter = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_id_counter):08x}"


# Not frozen: a frozen dataclass takes three times as long to build, once per request.
@dataclass(slots=True)
class Price:
    """What the price stage decided: the class the request runs in, its estimated cost and the tenant's buckets
    that cost is charged to."""

    priority: str
    mu: float
    tokens: int
    buckets: list[Bucket]


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
        "price",
        "charged",
        "admission",
        "outcome",
        "dispatched_at",
        "cancel_reason",
        "usage_status",
        "watcher",
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
        self.price: Price | None = None
        self.charged: list[Bucket] = []  # buckets the limit stage took from: settled to the real cost
        self.admission: Admission | None = None
        self.outcome: Outcome | None = None  # the relay's, from the first upstream attempt on
        self.dispatched_at: float | None = None  # the current attempt's start, for the first-token limit
        self.cancel_reason: str | None = None  # "client", "ttft" or "idle"
        self.usage_status: str | None = None  # overrides the outcome's status in the usage record
        self.watcher: asyncio.Task | None = None

    @property
    def priority(self) -> str:
        return self.price.priority if self.price is not None else "standard"

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
            self.task.cancel()
