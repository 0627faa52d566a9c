"""The small interfaces the discrete-event runner (``des``) drives (pure).

Read ``des``'s module docstring for how each is called. Everything here is re-exported by ``des``; the admission
that implements ``Admission`` is the proxy's own, in ``admission.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.routing.base import ReplicaView, RouteRequest

if TYPE_CHECKING:
    from simulator.results import RequestResult


class VirtualClock:
    """The simulated time, readable by injected policies (``now()``, ``monotonic()``, ``time()``)."""

    def __init__(self, start_s: float = 0.0):
        self._now = start_s

    def now(self) -> float:
        return self._now

    monotonic = now
    time = now


@dataclass
class Rejection:
    request: RouteRequest
    retry_after_s: float | None = None
    reason: str = "rejected"


@dataclass
class Verdict:
    dispatch: list[RouteRequest] = field(default_factory=list)
    reject: list[Rejection] = field(default_factory=list)


class Admission(Protocol):
    def offer(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> Verdict: ...

    def poll(self, replicas: Sequence[ReplicaView], now: float) -> Verdict: ...


@dataclass
class ReplicaStatus:
    replica_id: str
    state: str  # starting | ready | draining
    added_s: float
    in_flight: int
    in_flight_mu: float
    num_running: int
    num_waiting: int
    kv_usage: float
    concurrency_limit: int
    last_progress_s: float = 0.0  # end of the replica's last engine step (a hung engine stops advancing it)
    capacity_type: str = "on_demand"  # or "spot"
    terminate_at_s: float | None = None  # spot: when the interruption notice says the instance goes


@dataclass
class FleetView:
    now: float
    replicas: list[ReplicaStatus]
    in_flight: int
    in_flight_mu: float
    queued: int  # held by the admission controller or the routing backlog
    queued_mu: float
    arrivals_last_tick: int
    finished_last_tick: list[RequestResult]
    mu_capacity_per_replica: float
    arrivals_mu_last_tick: float = 0.0  # MU (the cost function's) of those arrivals: a predictor's history in MU

    @property
    def demand_mu(self) -> float:
        return self.in_flight_mu + self.queued_mu

    def count(self, state: str) -> int:
        return sum(r.state == state for r in self.replicas)


class FleetControl(Protocol):
    """What an autoscaler may do to the simulated fleet (``fleet.FleetActions`` does it)."""

    def add_replicas(
        self, n: int = 1, cold_start_s: float | None = None, capacity_type: str = "on_demand"
    ) -> list[str]: ...

    def drain(self, replica_id: str) -> None: ...

    def remove(self, replica_id: str) -> None: ...

    def set_healthy(self, replica_id: str, healthy: bool) -> None: ...

    def set_concurrency(self, limit: int, replica_id: str | None = None) -> None: ...


class Autoscaler(Protocol):
    def tick(self, fleet: FleetView, actions: FleetControl, now: float) -> None: ...
