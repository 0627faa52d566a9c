"""The fleet side of the discrete-event runner: simulated replicas, what autoscalers may do, faults (pure).

``FleetOps`` is mixed into ``des.Simulation``; it manages replicas (add after a cold start, drain, remove,
faults) and builds the views policies see (``ReplicaView`` for routers, ``FleetView`` for autoscalers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from capacity.hardware.profiles import EngineProfile
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.kv_events import KVEventBatch
from simulator.adapter_slots import AdapterSlots
from simulator.engine import Engine
from simulator.engine import Sequence as EngineSeq
from simulator.interfaces import FleetView, ReplicaStatus
from simulator.results import ReplicaRecord, RequestResult

# Event kinds of the simulation's queue (des imports them). _WAKE: a queued request goes over age (admission's timer).
# _LORA: a request's adapter finished loading on its replica (lora_des). _SPOT: the spot market's notices (spot).
_ARRIVAL, _STEP_END, _READY, _TICK, _FOLLOWUP, _FAULT, _WAKE, _LORA, _SPOT = range(9)


class FleetHost(Protocol):
    """The replica management ``FleetActions`` drives: ``des.Simulation``, through ``FleetOps`` and ``SpotOps``."""

    replicas: dict[str, SimReplica]

    def add_replica(self, *, cold_start_s: float | None = None) -> str: ...

    def add_spot_replicas(self, n: int, *, cold_start_s: float | None = None) -> list[str]: ...

    def drain_replica(self, replica_id: str) -> None: ...

    def remove_replica(self, replica_id: str) -> None: ...

    def live_replicas(self) -> Iterable[SimReplica]: ...


class FleetActions:
    """What an autoscaler may do to the simulated fleet (``interfaces.FleetControl``)."""

    def __init__(self, sim: FleetHost):
        self._sim = sim

    def add_replicas(
        self, n: int = 1, cold_start_s: float | None = None, capacity_type: str = "on_demand"
    ) -> list[str]:
        """New replicas, routable after the cold start. Spot ones come from the simulation's ``SpotMarket``: fewer
        (none) while it has no spot capacity."""
        if capacity_type == "spot":
            return self._sim.add_spot_replicas(max(0, n), cold_start_s=cold_start_s)
        if capacity_type != "on_demand":
            raise ValueError(f"unknown capacity type {capacity_type!r}; expected on_demand or spot")
        return [self._sim.add_replica(cold_start_s=cold_start_s) for _ in range(max(0, n))]

    def drain(self, replica_id: str) -> None:
        self._sim.drain_replica(replica_id)

    def remove(self, replica_id: str) -> None:
        self._sim.remove_replica(replica_id)

    def set_healthy(self, replica_id: str, healthy: bool) -> None:
        """What a health checker concludes; routers see it as ``ReplicaView.healthy``."""
        rep = self._sim.replicas.get(replica_id)
        if rep is not None:
            rep.healthy = healthy

    def set_concurrency(self, limit: int, replica_id: str | None = None) -> None:
        for rep in self._sim.live_replicas():
            if replica_id is None or rep.replica_id == replica_id:
                rep.concurrency_limit = max(1, int(limit))


class SimReplica:
    def __init__(self, replica_id: str, profile: EngineProfile, now: float, concurrency_limit: int, policy: str):
        self.replica_id = replica_id
        self.profile = profile
        self.engine = Engine(profile, scheduling_policy=policy)
        self.state = "starting"
        self.record = ReplicaRecord(replica_id, profile.name, profile.gpus, added_s=now)
        self.concurrency_limit = concurrency_limit
        self.in_flight: dict[str, tuple[RouteRequest, RequestResult, EngineSeq]] = {}
        self.in_flight_mu = 0.0
        self.plan = None
        self.version = 0
        self.scraped_s = -1e18
        self.scraped = (0, 0, 0.0)
        self.slow = 1.0  # fault: step time factor
        self.hung_since: float | None = None  # fault: engine frozen since
        self.last_progress_s = now  # last step end (tokens produced)
        self.busy_s = 0.0
        self.healthy = True  # set by a health controller through FleetActions.set_healthy
        self.mu_capacity = 1.0  # in-flight MU it sustains (ReplicaView.mu_capacity): per replica in a mixed fleet
        self.kv_events_on = True  # its KV-event publisher is delivering (Simulation.set_kv_events)
        self.kv_event_seq = 0  # the publisher's sequence number, counting batches dropped too
        self.slots: AdapterSlots | None = None  # its LoRA adapter slots (Simulation(lora=…))
        self.lora_queue: list[str] = []  # requests waiting for a free adapter slot, in arrival order
        self.scraped_adapters: frozenset = frozenset()  # vllm:lora_requests_info running ∪ waiting, as scraped
        self.capacity_type = "on_demand"  # or "spot": lent by the simulation's SpotMarket (spot.py)
        self.terminate_at_s: float | None = None  # spot: the interruption notice's deadline

    def adapters_in_requests(self) -> frozenset:
        """Adapters of its requests, running or waiting (vllm:lora_requests_info's two lists together)."""
        if self.slots is None:
            return frozenset()
        queued = {self.in_flight[r][0].adapter for r in self.lora_queue if r in self.in_flight}
        return frozenset(self.slots.in_use) | queued

    def end_of(self, plan, steps: int | None = None) -> float:
        return plan.start_s + plan.duration(steps) * self.slow


class FleetOps:
    """Replica management for ``des.Simulation`` (which provides clock, router, _push, _start_plan, …)."""

    def add_replica(
        self,
        *,
        cold_start_s: float | None = None,
        schedule: bool = True,
        profile: EngineProfile | None = None,
        mu_capacity: float | None = None,
        capacity_type: str = "on_demand",
    ) -> str:
        now = self.clock.now()
        rep = SimReplica(f"r{next(self._ids)}", profile or self.profile, now, self.concurrency_limit, self.policy)
        rep.capacity_type = rep.record.capacity_type = capacity_type
        rep.mu_capacity = self.mu_capacity if mu_capacity is None else mu_capacity
        if self.kv_event_sink is not None:
            rep.engine.kv.events = []
        if self.lora is not None:
            rep.slots = self._new_slots(rep.replica_id)
            rep.engine.lora_overhead = self.lora.overhead
        self.replicas[rep.replica_id] = rep
        self._all_replicas.append(rep)
        if schedule:
            delay = self.cold_start_s if cold_start_s is None else cold_start_s
            self._push(now + delay, _READY, rep)
        return rep.replica_id

    def _make_ready(self, replica_id: str) -> None:
        rep = self.replicas[replica_id]
        rep.state = "ready"
        rep.record.ready_s = self.clock.now()

    def drain_replica(self, replica_id: str) -> None:
        rep = self.replicas.get(replica_id)
        if rep is None:
            return
        if rep.state == "starting" or not rep.in_flight:
            self.remove_replica(replica_id)
        else:
            rep.state = "draining"

    def remove_replica(self, replica_id: str) -> None:
        rep = self.replicas.pop(replica_id, None)
        if rep is None:
            return
        now = self.clock.now()
        rep.state = "removed"
        rep.version += 1
        rep.record.removed_s = now
        rep.engine.abort_all(now)
        self._publish_kv_events(rep)
        for route, result, _seq in list(rep.in_flight.values()):
            result.status, result.reason, result.finish_s = "aborted", "replica_removed", now
            self._finished_tick.append(result)
            self.router.on_finished(route, replica_id, now)
        rep.in_flight.clear()
        self._sync_record(rep)

    def inject_fault(self, replica_id: str, kind: str, *, at_s: float | None = None, factor: float = 1.0) -> None:
        """Schedule a replica fault at ``at_s`` (default now), as the HTTP replica's fault injection does:

        ``crash``: the replica dies; its requests go elsewhere as the proxy sends them (not started: retried;
        streaming: resumed, up to ``resume_streams`` times, else ``error``/``replica_crashed``), its metrics go
        stale, new requests routed to it are refused and retried once elsewhere; it holds its GPUs until an
        autoscaler or health controller calls ``remove``. ``hang``: the engine freezes (requests accepted, no tokens;
        metrics still answer, frozen). ``slow``: steps take ``factor`` times longer. ``recover``: undo hang/slow.
        """
        if kind not in ("crash", "hang", "slow", "recover"):
            raise ValueError(f"unknown fault {kind!r}; expected crash, hang, slow or recover")
        if kind == "slow" and factor <= 0:
            raise ValueError("slow factor must be positive")
        self._push(self.clock.now() if at_s is None else at_s, _FAULT, (replica_id, kind, factor))

    def _apply_fault(self, replica_id: str, kind: str, factor: float) -> None:
        rep = self.replicas.get(replica_id)
        if rep is None or rep.state == "failed":
            return
        now = self.clock.now()
        if kind == "crash":
            rep.state = "failed"
            rep.version += 1
            rep.plan = None
            rep.record.failed_s = now
            self._cut_in_flight(rep, now, lost_reason="replica_crashed")  # retried or resumed, as the proxy does
            rep.engine.abort_all(now)
            rep.engine.kv.drain_events()  # a dead engine publishes nothing
            rep.in_flight.clear()
            rep.in_flight_mu = 0.0
            self._sync_record(rep)
            self._pump()
            return
        if kind == "hang":
            if rep.hung_since is None:
                rep.hung_since = now
                rep.version += 1  # the step under way never ends
            return
        if rep.plan is not None and rep.hung_since is None:
            self._cut_plan(rep, now)  # the new speed applies from the next step
        if kind == "slow":
            rep.slow = factor
            return
        rep.slow = 1.0  # recover
        if rep.hung_since is not None:
            frozen = now - rep.hung_since
            rep.hung_since = None
            if rep.plan is not None:
                rep.plan.start_s += frozen
                rep.version += 1
                self._push(rep.end_of(rep.plan), _STEP_END, (rep, rep.version))
            else:
                self._start_plan(rep)

    def set_kv_events(self, replica_id: str, enabled: bool) -> None:
        """Stop (or resume) delivering a replica's KV events, as a dead subscriber link would: the publisher's
        sequence numbers go on counting, so a consumer sees the gap when delivery resumes."""
        rep = self.replicas.get(replica_id)
        if rep is not None:
            rep.kv_events_on = enabled

    def _publish_kv_events(self, rep: SimReplica) -> None:
        """Hand the engine's KV events since the last step to ``kv_event_sink(replica_id, seq, batch)``."""
        if self.kv_event_sink is None:
            return
        events = rep.engine.kv.drain_events()
        if not events:
            return
        seq = rep.kv_event_seq
        rep.kv_event_seq += 1
        if rep.kv_events_on:
            self.kv_event_sink(rep.replica_id, seq, KVEventBatch(ts=self.clock.now(), events=events))

    def live_replicas(self) -> list[SimReplica]:
        return list(self.replicas.values())

    def views(self) -> list[ReplicaView]:
        now = self.clock.now()
        views = []
        for rep in self.replicas.values():
            if rep.state not in ("ready", "draining", "failed"):
                continue
            if rep.state != "failed" and now - rep.scraped_s >= self.scrape_interval_s:
                rep.scraped_s = now
                rep.scraped = (rep.engine.num_running, rep.engine.num_waiting, rep.engine.kv_usage)
                rep.scraped_adapters = rep.adapters_in_requests()
            running, waiting, kv = rep.scraped
            views.append(
                ReplicaView(
                    replica_id=rep.replica_id,
                    healthy=rep.healthy,
                    draining=rep.state == "draining",
                    metrics_age_s=now - rep.scraped_s,
                    num_running=running,
                    num_waiting=waiting,
                    kv_usage=kv,
                    in_flight=len(rep.in_flight),
                    in_flight_mu=rep.in_flight_mu,
                    mu_capacity=rep.mu_capacity,
                    concurrency_limit=rep.concurrency_limit,
                    block_size=rep.profile.block_size,
                    num_gpu_blocks=rep.profile.num_gpu_blocks,
                    adapters=rep.slots.held() if rep.slots is not None else frozenset(),
                    max_loras=rep.slots.max_loras if rep.slots is not None else 0,
                    active_adapters=rep.scraped_adapters,
                )
            )
        return views

    def fleet_view(self) -> FleetView:
        statuses = [
            ReplicaStatus(
                rep.replica_id,
                rep.state,
                rep.record.added_s,
                len(rep.in_flight),
                rep.in_flight_mu,
                rep.engine.num_running,
                rep.engine.num_waiting,
                rep.engine.kv_usage,
                rep.concurrency_limit,
                rep.last_progress_s,
                rep.capacity_type,
                rep.terminate_at_s,
            )
            for rep in self.replicas.values()
        ]
        in_flight = sum(s.in_flight for s in statuses)
        return FleetView(
            now=self.clock.now(),
            replicas=statuses,
            in_flight=in_flight,
            in_flight_mu=sum(s.in_flight_mu for s in statuses),
            queued=len(self._pending),
            queued_mu=sum(route.mu for route, _, _ in self._pending.values()),
            arrivals_last_tick=self._arrivals_tick,
            finished_last_tick=list(self._finished_tick),
            mu_capacity_per_replica=self.mu_capacity,
            arrivals_mu_last_tick=self._arrivals_mu_tick,
        )
