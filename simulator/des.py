"""Virtual-time discrete-event simulation of a fleet of simulated vLLM replicas, driving the platform's real policies.

Usage::

    from simulator.des import Simulation, VirtualClock
    from simulator import workloads
    clock = VirtualClock()
    router = MyRouter(...)                         # anything with gateway.routing.base.Router's methods
    sim = Simulation(router=router, replicas=8, profile="llama-13b-a100", clock=clock, seed=1)
    result = sim.run(workloads.shared_prefix(groups=32, prompts_per_group=32, qps=20, seed=1))
    result.percentile("ttft_s", 95), result.slo_attainment(ttft_s=2, tpot_s=0.1), result.gpu_hours()

Requests are ``workloads.SimRequest`` (arrival time, prompt text, output tokens, priority, tenant, session), read
lazily in arrival order: the workload must be finite (or pass ``run(until_s=…)``).
Results are ``results.SimResult`` (per request: arrival, queue, TTFT, TPOT, e2e, tokens, cached tokens, replica,
status; per replica: busy time, replica-seconds, prefix hits). Same seed and inputs → identical results.

Interfaces the simulation drives (all optional except the router):

* **Router** (``gateway.routing.base.Router``): for every dispatch the simulation builds one ``ReplicaView`` per
  ready, draining or failed (crashed, metrics going stale) replica from the engine's state as last *scraped* (every ``scrape_interval_s``, default
  50 ms; ``metrics_age_s`` is the time since that scrape): ``num_running``, ``num_waiting``, ``kv_usage``, plus
  the simulation's own bookkeeping ``in_flight`` / ``in_flight_mu`` (sent, not finished), ``concurrency_limit``,
  ``mu_capacity``, ``block_size``, ``num_gpu_blocks``, ``healthy`` (see ``set_healthy``). It calls ``pick(request, views, now)`` →
  replica id or None, then ``on_routed`` and later ``on_finished``. ``RouteRequest.extra`` carries ``tenant``,
  ``priority`` (vLLM int), ``priority_class``, ``prompt_tokens``, ``max_tokens``. A None pick parks the request
  in a FIFO backlog that is retried whenever a request finishes and every tick. (Queued work that no replica
  is serving or starting for ``stall_limit_s`` ends the run; those requests stay ``unserved``.)
* **Admission** (``Admission`` protocol below): ``offer(request, views, now)`` on arrival and
  ``poll(views, now)`` after every finish, every tick and at the time ``next_expiry()`` (optional) names;
  both return a ``Verdict`` listing requests to dispatch now (routed as above) and requests to reject
  (recorded as status ``rejected`` with ``retry_after_s`` and the reason). A request neither dispatched nor
  rejected is queued by the controller; the simulation counts it in the fleet's ``queued`` demand.
  ``on_finished`` (optional) is called like the router's. Without an admission controller every arrival is
  dispatched at once. ``ProxyAdmission`` (``admission.py``) is the proxy's own admission
  (``gateway.admission.AdmissionController``): priority classes, tenant fairness, eviction, queue-age
  shedding and Retry-After as production answers them.
* **Autoscaler** (``Autoscaler`` protocol below): ``tick(fleet, actions, now)`` every simulated ``tick_s``
  (1 s) with a ``FleetView`` (replicas with state starting/ready/draining and their load, in-flight and
  queued demand in requests and MU, arrivals and completions during the last tick). ``FleetActions`` can
  ``add_replicas(n, cold_start_s=None)`` (GPUs count from the request; routable after the cold start),
  ``drain(id)`` (no new requests; removed when empty), ``remove(id)`` (at once; in-flight requests are
  aborted), ``set_concurrency(limit, replica_id=None)`` (the ``concurrency_limit`` routers and admission
  see) and ``set_healthy(id, bool)`` (a health checker's verdict, ``ReplicaView.healthy``).
* **Faults**: ``sim.inject_fault(replica_id, "crash" | "hang" | "slow" | "recover", at_s=…, factor=…)``; a
  crashed replica shows state ``failed`` and stale metrics, a hung one stops advancing ``last_progress_s``; the
  crashed one's requests go on elsewhere as the proxy sends them (retried before their first token, resumed after).
* **Spot capacity** (``spot.py``): with ``spot_market=SpotMarket(…)``, ``add_replicas(n, capacity_type="spot")``
  borrows replicas the market takes back after a seeded lifetime, with a 30-120 s interruption notice
  (``ReplicaStatus.terminate_at_s``); outage windows refuse launches and notice every spot replica. A stream cut
  by a reclaim is resumed on another replica, up to ``resume_streams`` times, as the proxy resumes it
  (``gateway/proxy/resume.py``): the continuation's prompt is the prompt plus what was streamed.
* **Clock**: ``VirtualClock.now()`` is the simulated time; give the same object to policies that read a clock.
* **Mixed fleets**: ``replica_profiles`` (one profile per initial replica, e.g. 4 H100 and 4 A100) and
  ``replica_mu_capacity`` (each one's ``ReplicaView.mu_capacity``); replicas added later take ``profile``.
* **KV-cache events**: with ``kv_event_sink(replica_id, seq, batch)`` every engine publishes vLLM's KV events
  (``gateway.routing.kv_events``) after each scheduler step that changed its prefix cache, and the router's
  ``RouteRequest.extra["kv_block_hashes"]`` holds the prompt's block hashes as the engine computes them (what a
  router that tokenizes and hashes like vLLM, llm-d's precise prefix-cache scorer, would compute).
  ``set_kv_events(replica_id, False)`` stops delivery (the sequence numbers go on: the consumer sees a gap).
* **Cost**: ``cost_fn(request, prompt_tokens) -> MU`` (e.g. the capacity engineer's estimate); default counts
  1 MU per 1,000 prompt tokens plus 1 MU per 100 output tokens.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable

from capacity.hardware.profiles import EngineProfile, get_profile
from gateway.routing.base import Router, RouteRequest
from simulator.adapter_slots import LoraConfig
from simulator.admission import ProxyAdmission  # noqa: F401 (re-exported, with the interfaces below)
from simulator.engine import Sequence as EngineSeq
from simulator.fleet import (
    _ARRIVAL,
    _FAULT,
    _FOLLOWUP,
    _LORA,
    _READY,
    _SPOT,
    _STEP_END,
    _TICK,
    _WAKE,
    FleetActions,
    FleetOps,
    SimReplica,
)
from simulator.interfaces import (  # noqa: F401 (re-exported: policies import them from here)
    Admission,
    Autoscaler,
    FleetView,
    Rejection,
    ReplicaStatus,
    Verdict,
    VirtualClock,
)
from simulator.lora_des import LoraOps
from simulator.results import RequestResult, SimResult
from simulator.spot import SpotMarket, SpotOps
from simulator.tokens import partial_block
from simulator.workloads import SimRequest

_MANY_STEPS = 1 << 30


def _default_cost(request: SimRequest, prompt_tokens: int) -> float:
    return prompt_tokens / 1000 + request.output_tokens / 100


class Simulation(FleetOps, LoraOps, SpotOps):
    def __init__(
        self,
        *,
        router: Router,
        replicas: int = 1,
        profile: str | EngineProfile = "llama-13b-a100",
        clock: VirtualClock | None = None,
        admission: Admission | None = None,
        autoscaler: Autoscaler | None = None,
        cost_fn: Callable[[SimRequest, int], float] | None = None,
        mu_capacity: float = 1.0,
        concurrency_limit: int | None = None,
        cold_start_s: float = 60.0,
        scrape_interval_s: float = 0.05,
        tick_s: float = 1.0,
        stall_limit_s: float = 600.0,
        retry_connect_errors: bool = True,
        resume_streams: int = 2,
        scheduling_policy: str = "priority",
        seed: int = 0,  # recorded only: the simulation draws no random numbers; workloads and routers seed theirs
        replica_profiles: list[str | EngineProfile] | None = None,
        replica_mu_capacity: list[float] | None = None,
        kv_event_sink: Callable | None = None,
        lora: LoraConfig | None = None,
        spot_market: SpotMarket | None = None,
    ):
        self.profile = get_profile(profile) if isinstance(profile, str) or profile is None else profile
        self.clock = clock or VirtualClock()
        self.router = router
        self.admission = admission
        self.autoscaler = autoscaler
        self.cost_fn = cost_fn or _default_cost
        self.mu_capacity = mu_capacity
        self.concurrency_limit = concurrency_limit or self.profile.max_num_seqs
        self.cold_start_s = cold_start_s
        self.scrape_interval_s = scrape_interval_s
        self._on_first_token = getattr(router, "on_first_token", None)
        self.tick_s = tick_s
        self.stall_limit_s = stall_limit_s
        self.retry_connect_errors = retry_connect_errors
        self.resume_streams = resume_streams
        self._stalled_since: float | None = None
        self.policy = scheduling_policy
        self.seed = seed
        self.replicas: dict[str, SimReplica] = {}
        self._all_replicas: list[SimReplica] = []
        self._events: list = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self._results: list[RequestResult] = []
        self._pending: dict[str, tuple[RouteRequest, RequestResult, SimRequest]] = {}  # offered, not dispatched
        self._backlog: deque[RouteRequest] = deque()
        self._arrivals_tick = 0
        self._arrivals_mu_tick = 0.0
        self._finished_tick: list[RequestResult] = []
        self._wake_at: float | None = None  # the admission's next queue-age expiry, when one is scheduled
        self._actions = FleetActions(self)
        self.timeline: list[dict] = []
        self.kv_event_sink = kv_event_sink
        self.lora = lora
        self.spot_market = spot_market
        self._schedule_outages()
        if replica_profiles is not None:
            replicas = len(replica_profiles)
        for i in range(replicas):
            profile = replica_profiles[i] if replica_profiles is not None else None
            self._make_ready(
                self.add_replica(
                    cold_start_s=0.0,
                    schedule=False,
                    profile=get_profile(profile) if isinstance(profile, str) else profile,
                    mu_capacity=replica_mu_capacity[i] if replica_mu_capacity is not None else None,
                )
            )

    # -- event loop --------------------------------------------------------------------------------
    def _push(self, at: float, kind: int, payload) -> None:
        heapq.heappush(self._events, (at, next(self._seq), kind, payload))

    def run(self, workload: Iterable[SimRequest], *, until_s: float | None = None) -> SimResult:
        """Simulate until every request is finished or rejected (or ``until_s``); returns the results."""
        started = time.perf_counter()
        arrivals = iter(workload)
        self._next_arrival(arrivals)
        self._push(self.clock.now() + self.tick_s, _TICK, None)
        while self._events:
            at, _, kind, payload = heapq.heappop(self._events)
            if until_s is not None and at > until_s:
                self.clock._now = until_s
                break
            if kind == _SPOT and not (self._busy() or self._has_future_arrivals()):
                continue  # the market's far-off notices do not keep a finished run going
            self.clock._now = at
            if kind == _STEP_END:
                rep, version = payload
                if version == rep.version:
                    self._step_end(rep)
            elif kind == _ARRIVAL:
                self._arrive(payload)
                self._next_arrival(arrivals)
            elif kind == _FOLLOWUP:
                self._arrive(payload)
            elif kind == _LORA:
                self._lora_ready(*payload)
            elif kind == _FAULT:
                self._apply_fault(*payload)
            elif kind == _SPOT:
                self._apply_spot(*payload)
            elif kind == _READY:
                if payload.state == "starting" and payload.replica_id in self.replicas:
                    self._make_ready(payload.replica_id)
                    self._pump()
            elif kind == _WAKE:
                if payload == self._wake_at:
                    self._wake_at = None
                    self._pump()
            elif kind == _TICK:
                self._tick()
                if self._stalled():
                    break  # queued work that nothing will ever serve: stop, it stays "unserved"
                if self._busy() or self._has_future_arrivals():
                    self._push(at + self.tick_s, _TICK, None)
        for rep in self._all_replicas:
            self._sync_record(rep)
        return SimResult(
            requests=self._results,
            replicas=[rep.record for rep in self._all_replicas],
            end_s=self.clock.now(),
            wall_s=time.perf_counter() - started,
            timeline=self.timeline,
        )

    def _next_arrival(self, arrivals) -> None:
        request = next(arrivals, None)
        if request is not None:
            self._push(request.arrival_s, _ARRIVAL, request)

    def _has_future_arrivals(self) -> bool:
        return any(kind in (_ARRIVAL, _READY, _FOLLOWUP, _FAULT) for _, _, kind, _ in self._events)

    def _busy(self) -> bool:
        return bool(self._pending or self._backlog or any(rep.in_flight for rep in self.replicas.values()))

    def _stalled(self) -> bool:
        """True after ``stall_limit_s`` of unfinished requests with no replica working (a hung one is not) or
        starting, and nothing scheduled that could change it."""
        replicas = self.replicas.values()
        progressing = any((rep.in_flight and rep.hung_since is None) or rep.state == "starting" for rep in replicas)
        waiting = self._pending or self._backlog or any(rep.in_flight for rep in replicas)
        if progressing or not waiting or self._has_future_arrivals():
            self._stalled_since = None
            return False
        if self._stalled_since is None:
            self._stalled_since = self.clock.now()
        return self.clock.now() - self._stalled_since >= self.stall_limit_s

    def _tick(self) -> None:
        now = self.clock.now()
        if self.autoscaler is not None:
            self.autoscaler.tick(self.fleet_view(), self._actions, now)
        self._arrivals_tick = 0
        self._arrivals_mu_tick = 0.0
        self._finished_tick = []
        self._pump()
        states = [rep.state for rep in self.replicas.values()]
        self.timeline.append(
            {
                "t": round(now, 3),
                "ready": states.count("ready"),
                "starting": states.count("starting"),
                "draining": states.count("draining"),
                "failed": states.count("failed"),
                "in_flight": sum(len(rep.in_flight) for rep in self.replicas.values()),
                "queued": len(self._pending),
            }
        )

    # -- requests ----------------------------------------------------------------------------------
    def _arrive(self, request: SimRequest) -> None:
        prompt = request.prompt_text
        prompt_tokens = request.prompt_tokens
        mu = self.cost_fn(request, prompt_tokens)
        result = RequestResult(
            request_id=request.request_id,
            tenant=request.tenant,
            priority=request.priority,
            arrival_s=request.arrival_s,
            prompt_tokens=prompt_tokens,
            max_tokens=request.output_tokens,
            mu=mu,
            session_id=request.session_id,
            priority_class=request.priority_class,
        )
        self._results.append(result)
        self._arrivals_tick += 1
        self._arrivals_mu_tick += mu
        route = RouteRequest(
            request_id=request.request_id,
            prompt_text=prompt,
            mu=mu,
            session_id=request.session_id,
            adapter=request.adapter,
            extra={
                "tenant": request.tenant,
                "priority": request.priority,
                "priority_class": request.priority_class,
                "prompt_tokens": prompt_tokens,
                "max_tokens": request.output_tokens,
                "workload": request.extra,  # what the workload knows (oracles read it; policies must not)
            },
        )
        if self.kv_event_sink is not None:
            route.extra["kv_block_hashes"] = request.block_hashes()
        self._pending[request.request_id] = (route, result, request)
        if self.admission is None:
            self._dispatch(route)
        else:
            self._apply(self.admission.offer(route, self.views(), self.clock.now()))

    def _apply(self, verdict: Verdict) -> None:
        now = self.clock.now()
        self._arm_wake()
        for rejection in verdict.reject:
            entry = self._pending.pop(rejection.request.request_id, None)
            if entry is None:
                continue
            _route, result, request = entry
            result.status, result.retry_after_s, result.reason = "rejected", rejection.retry_after_s, rejection.reason
            result.finish_s = now
            self._finished_tick.append(result)
            self._followup(request, result)
        for route in verdict.dispatch:
            self._dispatch(route)

    def _dispatch(self, route: RouteRequest) -> bool:
        entry = self._pending.get(route.request_id)
        if entry is None:
            return True
        now = self.clock.now()
        views = self.views()
        if (failed_on := route.extra.get("failed_on")) is not None:
            views = [v for v in views if v.replica_id != failed_on]  # the proxy's retry skips the replica that failed
        replica_id = self.router.pick(route, views, now)
        rep = self.replicas.get(replica_id) if replica_id is not None else None
        if rep is not None and rep.state == "failed":
            return self._connection_refused(route, entry[1], replica_id)
        if rep is None or rep.state not in ("ready", "draining"):
            self._backlog.append(route)
            return False
        self.router.on_routed(route, replica_id, now)
        return self._send(route, rep)

    def _send(self, route: RouteRequest, rep: SimReplica) -> bool:
        now, replica_id = self.clock.now(), rep.replica_id
        _route, result, request = self._pending.pop(route.request_id)
        streamed = route.extra.get("streamed_tokens", 0)  # a resumed stream's continuation (spot.py)
        seq = EngineSeq(
            request_id=request.request_id,
            prompt_tokens=result.prompt_tokens + streamed,
            max_tokens=max(1, request.output_tokens - streamed),
            block_hashes=route.extra.get("kv_block_hashes") or request.block_hashes(),
            priority=route.extra.get("priority", request.priority),  # admission may set the engine priority
            arrival_s=now,
            tag=request,
            prompt_tail=partial_block(route.prompt_text),
            cache_salt=request.cache_salt,
        )
        result.dispatch_s, result.replica_id = now, replica_id
        if route.adapter is not None:
            return self._send_adapter(rep, route, result, seq)
        rep.in_flight[request.request_id] = (route, result, seq)
        rep.in_flight_mu += route.mu
        self._enter(rep, request.request_id)
        return True

    def _enter(self, rep: SimReplica, request_id: str) -> None:
        """The request (in ``rep.in_flight``) joins the engine's queue; too long for the model, vLLM's 400."""
        route, result, seq = rep.in_flight[request_id]
        now = self.clock.now()
        seq.arrival_s = now
        try:
            rep.engine.add(seq)
        except ValueError as exc:
            del rep.in_flight[request_id]
            rep.in_flight_mu -= route.mu
            result.status, result.reason, result.finish_s = "error", str(exc), now
            self.router.on_finished(route, rep.replica_id, now)
            self._finished_tick.append(result)
            self._release_adapter(rep, seq)
            return
        self._kick(rep)

    def _connection_refused(self, route: RouteRequest, result: RequestResult, replica_id: str) -> bool:
        """A request sent to a crashed replica: retried once elsewhere (before any byte reached the client)."""
        now = self.clock.now()
        if self.retry_connect_errors and not route.extra.get("retried_from"):
            route.extra["retried_from"] = replica_id
            others = [v for v in self.views() if v.replica_id != replica_id]
            other_id = self.router.pick(route, others, now)
            other = self.replicas.get(other_id) if other_id is not None else None
            if other is not None and other.state in ("ready", "draining"):
                self.router.on_routed(route, other_id, now)
                return self._send(route, other)
        del self._pending[route.request_id]
        result.status, result.reason, result.finish_s, result.replica_id = (
            "error",
            "connection_refused",
            now,
            replica_id,
        )
        self._finished_tick.append(result)
        return True

    def _kick(self, rep: SimReplica) -> None:
        """A request joined ``rep``: start its engine, or cut its batch of steps at the step now under way."""
        now = self.clock.now()
        plan = rep.plan
        if rep.hung_since is not None or rep.state == "failed":
            return
        if plan is None:
            self._start_plan(rep)
            return
        if plan.steps > 1 and rep.engine.num_running < rep.profile.max_num_seqs:
            self._cut_plan(rep, now)

    def _cut_plan(self, rep: SimReplica, now: float) -> None:
        """End ``rep``'s batch of steps with the step under way at ``now``."""
        plan = rep.plan
        done = plan.steps_started_before((now - plan.start_s) / rep.slow)
        if done < plan.steps:
            plan.steps = done
            rep.version += 1
            self._push(rep.end_of(plan), _STEP_END, (rep, rep.version))

    def _start_plan(self, rep: SimReplica) -> None:
        now = self.clock.now()
        plan = rep.engine.plan(now, _MANY_STEPS)
        rep.plan = plan
        self._publish_kv_events(rep)
        if plan is not None:
            rep.version += 1
            self._push(rep.end_of(plan), _STEP_END, (rep, rep.version))

    def _step_end(self, rep: SimReplica) -> None:
        now = self.clock.now()
        plan = rep.plan
        rep.plan = None
        finished = rep.engine.commit(plan, plan.steps, now)
        rep.busy_s += plan.duration(plan.steps) * rep.slow
        rep.last_progress_s = now
        if plan.admitted and self._on_first_token is not None:
            # The prompts this step completed have their first token, as the proxy sees a stream's first bytes.
            for seq in plan.admitted:
                entry = rep.in_flight.get(seq.request_id)
                if entry is not None:
                    self._on_first_token(entry[0], rep.replica_id, now)
        for seq in finished:
            self._complete(rep, seq)
        if rep.replica_id in self.replicas:
            self._start_plan(rep)
        if finished:
            self._pump()

    def _complete(self, rep: SimReplica, seq: EngineSeq) -> None:
        now = self.clock.now()
        route, result, _ = rep.in_flight.pop(seq.request_id)
        rep.in_flight_mu -= route.mu
        result.status = "ok"
        result.scheduled_s, result.first_token_s, result.finish_s = seq.scheduled_s, seq.first_token_s, now
        result.output_tokens, result.cached_tokens, result.preemptions = (
            seq.generated,
            seq.cached_tokens,
            seq.preemptions,
        )
        if "streamed_tokens" in route.extra:  # resumed: the client's one answer began on an earlier replica
            result.scheduled_s, result.first_token_s = route.extra["scheduled_s"], route.extra["first_token_s"]
            result.output_tokens += route.extra["streamed_tokens"]
        rep.record.requests += 1
        self._finished_tick.append(result)
        self._release_adapter(rep, seq)
        self.router.on_finished(route, rep.replica_id, now)
        on_finished = getattr(self.admission, "on_finished", None)
        if on_finished is not None:
            on_finished(route, rep.replica_id, now)
        if rep.state == "draining" and not rep.in_flight:
            self.remove_replica(rep.replica_id)
        self._followup(seq.tag, result)

    def _followup(self, request: SimRequest, result: RequestResult) -> None:
        if request.followup is None:
            return
        nxt = request.followup(result)
        if nxt is not None:
            nxt.arrival_s = max(nxt.arrival_s, self.clock.now())
            self._push(nxt.arrival_s, _FOLLOWUP, nxt)

    def _pump(self) -> None:
        """Give freed capacity to queued work: the admission controller first, then the routing backlog."""
        if self.admission is not None:
            self._apply(self.admission.poll(self.views(), self.clock.now()))
        for _ in range(len(self._backlog)):
            route = self._backlog.popleft()
            if not self._dispatch(route):
                # _dispatch re-appended it at the back; keep FIFO order and stop at the first unroutable one.
                self._backlog.appendleft(self._backlog.pop())
                break

    def _arm_wake(self) -> None:
        """Poll the admission when its next queued request goes over age, as the proxy's expiry timer does."""
        next_expiry = getattr(self.admission, "next_expiry", None)
        at = next_expiry() if next_expiry is not None else None
        if at is not None and (self._wake_at is None or at < self._wake_at) and at < float("inf"):
            self._wake_at = at
            # Just past the deadline (the proxy's timer adds 1 ms): at it exactly, rounding may keep the request.
            self._push(max(at, self.clock.now()) + 1e-6, _WAKE, at)

    def _sync_record(self, rep: SimReplica) -> None:
        stats, record = rep.engine.stats, rep.record
        record.busy_s = rep.busy_s
        record.prompt_tokens, record.generation_tokens = stats.prompt_tokens, stats.generation_tokens
        record.prefix_queries, record.prefix_hits, record.preemptions = (
            stats.prefix_queries,
            stats.prefix_hits,
            stats.preemptions,
        )
