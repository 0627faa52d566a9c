"""A discrete-event run of one endpoint's fleet under a scaling policy, in virtual time (pure: no Django).

Not what ``bench autoscale`` measures with (that is the shared engine simulator, ``simulator.des``,
through ``sim_adapter``): this lighter model, with H100-class prefill that does not stall decode, no longer feeds
the bench (its cross-check ran the old single-day trace); the bench still counts flaps with ``count_flaps``.

Replicas follow the simulator's 13B profile: continuous batching with decode step ``t0 + k·batch``, prefill
``overhead + tokens / rate`` serialized per replica, a KV budget in tokens, and a cold start drawn from
[cold_min, cold_max]. Admission is the proxy's (``gateway.admission.AdmissionController`` with its production
defaults: a 512-request queue, 429 after the class's max queue age, checked every sample); every request has the
class ``SimConfig.priority_class`` and counts one unit (this model has no MU). A request admission hands out goes to
the least-loaded ready replica with a free slot and KV room, or waits at the head for KV room, as vLLM's waiting
queue would hold it. Scale-in drains: a draining replica takes no new request and stops once its last one
finishes. Billed GPU time counts every replica holding a GPU: booting, standby, ready and draining.
"""

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from capacity.autoscaling.demand import DemandSample
from capacity.percentiles import percentile
from gateway.admission import DEFAULT_MAX_AGE_S, DEFAULT_MAX_QUEUE, STANDARD, AdmissionController, QueuedItem


@dataclass(frozen=True)
class ReplicaProfile:
    step_t0_s: float = 0.0078
    step_k_s: float = 0.000108
    prefill_overhead_s: float = 0.010
    # H100-class prefill. The engine simulator's A100 profile prefills 6,000 tok/s; at that rate this trace's
    # spikes (500-token prompts at up to 270 req/s) are prefill-bound and replica counts sized on concurrency,
    # static peak included, miss the TTFT SLO: scaling on MU (which weighs prompt tokens) is what that needs.
    prefill_tok_s: float = 16_000.0
    kv_tokens: int = 268_000
    cold_min_s: float = 60.0
    cold_max_s: float = 120.0
    gpus: int = 1

    def seconds_per_request(self, concurrency: float, *, in_tok: float = 500, out_tok: float = 300) -> float:
        """Mean in-flight time of a request on a replica running ``concurrency`` sequences (for Little's law)."""
        return self.prefill_s(int(in_tok)) + (out_tok - 1) * self.step_s(int(concurrency))

    def step_s(self, batch: int) -> float:
        return self.step_t0_s + self.step_k_s * batch

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_overhead_s + tokens / self.prefill_tok_s


@dataclass(slots=True)
class Request:
    arrival: float
    in_tok: int
    out_tok: int
    first_token_at: float | None = None
    finished_at: float | None = None
    shed_reason: str = ""  # why admission refused it (queue_age, queue_full, evicted, no_replica); "" if it did not
    dispatched_at: float | None = None

    @property
    def shed(self) -> bool:
        return bool(self.shed_reason)

    def ttft_s(self) -> float | None:
        """Arrival at the proxy → first token: what the client sees and the SLO counts."""
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    def replica_ttft_s(self) -> float | None:
        """Arrival at the replica → first token: what vLLM's TTFT histogram (the vertical policy's input) sees."""
        return None if self.first_token_at is None else self.first_token_at - self.dispatched_at

    def fresh(self, shift_s: float = 0.0) -> "Request":
        """The same arrival, unserved (each policy's run gets its own copies)."""
        return Request(arrival=self.arrival + shift_s, in_tok=self.in_tok, out_tok=self.out_tok)

    def tpot_s(self) -> float | None:
        if self.finished_at is None or self.first_token_at is None:
            return None
        return (self.finished_at - self.first_token_at) / max(1, self.out_tok - 1)


@dataclass
class SimReplica:
    rid: int
    state: str  # booting | standby | ready | draining | stopped
    limit: int
    boot_done_at: float
    promoted: bool = True  # False while it is a warm-pool standby
    in_flight: int = 0
    kv_used: int = 0
    prefill_free_at: float = 0.0
    token_clock: float = 0.0
    clock_at: float = 0.0
    version: int = 0
    decoding: list = field(default_factory=list)  # heap of (token_clock threshold, seq, request)

    def advance(self, now: float, profile: ReplicaProfile) -> None:
        if self.decoding:
            self.token_clock += (now - self.clock_at) / profile.step_s(len(self.decoding))
        self.clock_at = now


@dataclass
class SimConfig:
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    max_queue: int = DEFAULT_MAX_QUEUE
    max_age_s: dict = field(default_factory=lambda: dict(DEFAULT_MAX_AGE_S))
    priority_class: str = STANDARD  # every request's
    sample_s: float = 1.0
    seed: int = 7
    score_from: float = 0.0  # requests arriving earlier (a history day) are simulated but not scored
    profile: ReplicaProfile = field(default_factory=ReplicaProfile)


@dataclass
class SimResult:
    name: str
    gpu_hours: float
    requests: int
    good: int
    shed: int
    replica_series: list  # (t, billed replicas, ready replicas, queued) once per sample
    scale_events: list  # (t, +1 up / −1 down)
    requests_scored: list

    @property
    def slo_attainment(self) -> float:
        return self.good / self.requests if self.requests else 1.0

    @property
    def rate_429(self) -> float:
        return self.shed / self.requests if self.requests else 0.0


def generate_requests(rate_at: Callable[[float], float], *, start: float, end: float, seed: int) -> list[Request]:
    """Poisson arrivals with a per-second rate; prompts 200–800 tokens, outputs 100–500 (means 500 / 300)."""
    rng = random.Random(seed)
    out: list[Request] = []
    t = start
    while t < end:
        lam = rate_at(t)
        n = _poisson(rng, lam) if lam > 0 else 0
        for arrival in sorted(t + rng.random() for _ in range(n)):
            out.append(Request(arrival=arrival, in_tok=rng.randint(200, 800), out_tok=rng.randint(100, 500)))
        t += 1.0
    return out


def _poisson(rng: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    threshold, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= threshold:
            return k
        k += 1


class FleetSim:
    def __init__(
        self, policy, requests: Sequence[Request], *, cfg: SimConfig, end: float, initial_replicas: int = 1
    ) -> None:
        self.policy, self.cfg, self.profile, self.end = policy, cfg, cfg.profile, end
        self.requests = list(requests)
        self.rng = random.Random(cfg.seed + 1)
        self.events: list = []
        self.seq = 0
        self.replicas: list[SimReplica] = []
        self.live: list[SimReplica] = []  # not stopped; rebuilt every sample so scans skip the dead
        self.admission = AdmissionController(max_queue=cfg.max_queue, max_age_s=cfg.max_age_s)
        self.held: Request | None = None  # handed out by admission, waiting for KV room on a replica
        self.finished: deque[Request] = deque()  # for the vertical policy's 30 s percentiles
        self.billed_s = 0.0
        self.arrivals = 0
        self.series: list = []
        self.scale_events: list = []
        self.limit = getattr(policy, "concurrency_limit", 64)
        self.warm_pool = getattr(policy, "warm_pool", 0)
        for _ in range(initial_replicas):
            self._start_replica(0.0, promoted=True, cold=False)

    # -- events -------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, *payload) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self) -> SimResult:
        self._push(0.0, "sample")
        self._push(0.0, "policy")
        if hasattr(self.policy, "adjust_concurrency"):
            self._push(self.policy.vertical_interval_s, "vertical")
        arrivals = iter(self.requests)
        next_arrival = next(arrivals, None)
        while True:
            t_event = self.events[0][0] if self.events else math.inf
            if next_arrival is not None and next_arrival.arrival <= t_event:
                now, req = next_arrival.arrival, next_arrival
                next_arrival = next(arrivals, None)
                if now >= self.end:
                    break
                self.arrivals += 1
                self._arrive(now, req)
                continue
            if t_event >= self.end:
                break
            now, _, kind, payload = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(now, *payload)
        return self._result()

    def _on_sample(self, now: float) -> None:
        self.live = [r for r in self.live if r.state != "stopped"]
        self._refuse(self.admission.shed_expired(now=now, **self._load()))
        in_flight = sum(r.in_flight for r in self.live if r.state in ("ready", "draining"))
        queued = len(self.admission.queue) + (self.held is not None)
        self.policy.observe(DemandSample(t=now, in_flight=in_flight, queued=queued, arrivals=self.arrivals))
        self.arrivals = 0
        billed = sum(1 for r in self.live if r.state != "stopped")
        if now >= self.cfg.score_from:
            self.billed_s += billed * self.cfg.sample_s * self.profile.gpus
        ready = sum(1 for r in self.live if r.state == "ready" and r.promoted)
        self.series.append((now, billed, ready, queued))
        self._push(now + self.cfg.sample_s, "sample")

    def _on_policy(self, now: float) -> None:
        ready = [r for r in self.live if r.state == "ready" and r.promoted]
        starting = [r for r in self.live if r.state == "booting" and r.promoted]
        current = len(ready) + len(starting)
        desired = self.policy.desired(now=now, ready=len(ready), starting=len(starting))
        if desired > current:
            self.scale_events.append((now, +1))
            for _ in range(desired - current):
                standby = next((r for r in self.live if not r.promoted and r.state in ("standby", "booting")), None)
                if standby is not None:
                    standby.promoted = True
                    if standby.state == "standby":
                        standby.state = "ready"
                else:
                    self._start_replica(now, promoted=True)
        elif desired < current:
            self.scale_events.append((now, -1))
            # Cancel replicas still booting first (no work lost), then drain the least-loaded ready ones.
            victims = sorted(starting, key=lambda r: -r.boot_done_at) + sorted(ready, key=lambda r: r.in_flight)
            for replica in victims[: current - desired]:
                self._drain(now, replica)
        standby_count = sum(1 for r in self.live if not r.promoted and r.state != "stopped")
        for _ in range(self.warm_pool - standby_count):
            self._start_replica(now, promoted=False)
        self._dispatch(now)
        self._push(now + self.policy.interval_s, "policy")

    def _on_vertical(self, now: float) -> None:
        window = [r for r in self.finished if r.finished_at > now - self.policy.vertical_interval_s]
        self.finished = deque(window)
        active = [r for r in self.live if r.state == "ready" and r.promoted]
        kv = max((r.kv_used / self.profile.kv_tokens for r in active), default=None)
        ttfts = sorted(r.replica_ttft_s() * 1000 for r in window)
        tpots = sorted(r.tpot_s() * 1000 for r in window)
        busy = sum(r.in_flight for r in active) / (len(active) * self.limit) if active else None
        self.limit = self.policy.adjust_concurrency(
            ttft_p95_ms=percentile(ttfts, 95),
            tpot_p95_ms=percentile(tpots, 95),
            kv_usage=kv,
            waiting_per_replica=0.0 if active else None,
            busy_fraction=busy,
        )
        for r in self.live:
            r.limit = self.limit
        self._dispatch(now)
        self._push(now + self.policy.vertical_interval_s, "vertical")

    def _on_booted(self, now: float, replica: SimReplica) -> None:
        if replica.state != "booting":
            return
        replica.state = "ready" if replica.promoted else "standby"
        self._dispatch(now)

    def _on_prefilled(self, now: float, replica: SimReplica, req: Request) -> None:
        req.first_token_at = now
        if req.out_tok <= 1:
            self._finish(now, replica, req)
            return
        replica.advance(now, self.profile)
        heapq.heappush(replica.decoding, (replica.token_clock + req.out_tok - 1, id(req), req))
        self._reschedule(now, replica)

    def _on_decoded(self, now: float, replica: SimReplica, version: int) -> None:
        if version != replica.version:
            return
        replica.advance(now, self.profile)
        done = []
        while replica.decoding and replica.decoding[0][0] <= replica.token_clock + 1e-6:
            done.append(heapq.heappop(replica.decoding)[2])
        self._reschedule(now, replica)
        for req in done:
            self._finish(now, replica, req)

    # -- mechanics ----------------------------------------------------------------------------------------
    def _start_replica(self, now: float, *, promoted: bool, cold: bool = True) -> None:
        boot = self.rng.uniform(self.profile.cold_min_s, self.profile.cold_max_s) if cold else 0.0
        replica = SimReplica(
            rid=len(self.replicas),
            state="booting",
            limit=self.limit,
            boot_done_at=now + boot,
            promoted=promoted,
            clock_at=now,
        )
        self.replicas.append(replica)
        self.live.append(replica)
        if cold:
            self._push(now + boot, "booted", replica)
        else:
            replica.state = "ready" if promoted else "standby"

    def _drain(self, now: float, replica: SimReplica) -> None:
        replica.state = "draining" if replica.state == "ready" and replica.in_flight else "stopped"

    def _reschedule(self, now: float, replica: SimReplica) -> None:
        replica.version += 1
        if replica.decoding:
            remaining = replica.decoding[0][0] - replica.token_clock
            self._push(
                now + max(0.0, remaining) * self.profile.step_s(len(replica.decoding)),
                "decoded",
                replica,
                replica.version,
            )

    def _finish(self, now: float, replica: SimReplica, req: Request) -> None:
        req.finished_at = now
        replica.in_flight -= 1
        replica.kv_used -= req.in_tok + req.out_tok
        self.finished.append(req)
        self.admission.finished(mu_done=1.0, now=now)
        if replica.state == "draining" and replica.in_flight == 0:
            replica.state = "stopped"
        self._dispatch(now)

    def _arrive(self, now: float, req: Request) -> None:
        if self.admission.may_skip_queue() and self.held is None and self._send(now, req):
            return
        item = QueuedItem(
            request_id=str(id(req)), tenant="", priority=self.cfg.priority_class, mu=1.0, enqueued_at=now, payload=req
        )
        has_replicas = any(r.state == "ready" and r.promoted for r in self.live)
        outcome = self.admission.enqueue(item, now=now, has_replicas=has_replicas, scale_to_zero=False, **self._load())
        self._refuse(outcome.evicted + ([outcome.refused] if outcome.refused is not None else []))

    def _refuse(self, refusals) -> None:
        for refusal in refusals:
            refusal.item.payload.shed_reason = refusal.reason

    def _load(self) -> dict[str, float]:
        """In flight and the ready replicas' nominal rate, in requests (this model's unit), for Retry-After."""
        ready = [r for r in self.live if r.state == "ready" and r.promoted]
        in_flight = sum(r.in_flight for r in self.live)
        nominal = len(ready) * self.limit / self.profile.seconds_per_request(self.limit) if ready else 0.0
        return {"in_flight_mu": float(in_flight), "nominal_mu_per_s": nominal}

    def _dispatch(self, now: float) -> None:
        """Hand free slots to queued requests in admission order."""
        while True:
            if self.held is None:
                # Only a free slot takes a request out of the queue: one still queued can be shed for age.
                if not any(r.state == "ready" and r.promoted and r.in_flight < r.limit for r in self.live):
                    return
                item = self.admission.next_to_serve(now)
                if item is None:
                    return
                self.held = item.payload
            if not self._send(now, self.held):
                return
            self.held = None

    def _send(self, now: float, req: Request) -> bool:
        """To the least-loaded ready replica with a free slot and KV room; False when none has both."""
        need = req.in_tok + req.out_tok
        best = None
        for r in self.live:
            if (
                r.state == "ready"
                and r.promoted
                and r.in_flight < r.limit
                and r.kv_used + need <= self.profile.kv_tokens
            ):
                if best is None or r.in_flight < best.in_flight:
                    best = r
        if best is None:
            return False
        req.dispatched_at = now
        best.in_flight += 1
        best.kv_used += need
        start = max(now, best.prefill_free_at)
        best.prefill_free_at = start + self.profile.prefill_s(req.in_tok)
        self._push(best.prefill_free_at, "prefilled", best, req)
        return True

    def _result(self) -> SimResult:
        scored = [r for r in self.requests if self.cfg.score_from <= r.arrival < self.end]
        good = shed = 0
        for r in scored:
            if r.shed:
                shed += 1
            elif r.finished_at is not None and r.ttft_s() <= self.cfg.ttft_slo_s and r.tpot_s() <= self.cfg.tpot_slo_s:
                good += 1
        return SimResult(
            name=self.policy.name,
            gpu_hours=self.billed_s / 3600.0,
            requests=len(scored),
            good=good,
            shed=shed,
            replica_series=self.series,
            scale_events=self.scale_events,
            requests_scored=scored,
        )


def count_flaps(scale_events: Sequence[tuple[float, int]], *, within_s: float = 300.0) -> int:
    """Scale-downs that came less than ``within_s`` after a scale-up."""
    flaps, last_up = 0, None
    for t, direction in scale_events:
        if direction > 0:
            last_up = t
        elif last_up is not None and t - last_up < within_s:
            flaps += 1
    return flaps


def spike_absorb_s(requests: Sequence[Request], *, onset: float, horizon_s: float, ttft_slo_s: float) -> float:
    """Seconds from a spike's onset to the arrival of the last request in the horizon that missed its TTFT SLO."""
    last_bad = onset
    for r in requests:
        if onset <= r.arrival < onset + horizon_s:
            ttft = r.ttft_s()
            if r.shed or ttft is None or ttft > ttft_slo_s:
                last_bad = max(last_bad, r.arrival)
    return last_bad - onset
