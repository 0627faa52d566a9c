"""Our policies (or a baseline) behind the engine simulator's ``Autoscaler`` hook (pure: no Django).

``simulator.des.Simulation`` calls ``tick(fleet, actions, now)`` every simulated second with a
``FleetView``; this adapter feeds the policy one demand sample per tick (requests and MU), asks for a replica count
every ``policy.interval_s`` and a concurrency limit every ``policy.vertical_interval_s`` (when the policy has a
vertical axis), and acts through ``FleetActions``: add replicas (cold start), cancel starting ones, drain ready ones
(the simulator removes a draining replica once its last request finished). With a ``spot.SpotPlanner`` the count
is split between on-demand and spot replicas, and a spot interruption notice is handled at the next tick: the
next decision, taken at once, replaces the noticed replica, which serves on until ``notice_drain_lead_s`` before
it is taken and then drains (no new requests), as the live autoscaler does.

Also here, for ``bench autoscale`` on the engine simulator: ``engine_seconds_per_request`` (how long a request
stays in flight on an engine profile, prefill stalls included). Admission there is the proxy's own
(``simulator.admission.ProxyAdmission``).
"""

import math
import random

from capacity.autoscaling.demand import DemandSample
from capacity.autoscaling.spot import NOTICE_DRAIN_LEAD_S, ON_DEMAND, SPOT
from capacity.autoscaling.vertical import sample_replicas
from capacity.percentiles import percentile


class EngineSimAutoscaler:
    """``cold_start_s``: a fixed cold start, a ``(min, max)`` range drawn uniformly per replica (seeded), or None
    for the simulation's own.

    ``warm_pool``: stand-by replicas kept booted beside the fleet (model loaded, not serving; a GPU each, billed in
    ``standby_gpu_s``): a scale-up takes one that has finished booting and it serves after ``warm_start_s``
    instead of a cold start; the pool is refilled at once, through a cold start. Every policy gets the same option.
    """

    def __init__(
        self,
        policy,
        *,
        cold_start_s: float | tuple[float, float] | None = None,
        seed: int = 0,
        warm_pool: int = 0,
        warm_start_s: float = 5.0,
        spot=None,
        handle_notices: bool = True,
        notice_drain_lead_s: float | None = NOTICE_DRAIN_LEAD_S,
    ) -> None:
        self.policy = policy
        self.spot = spot  # a capacity.autoscaling.spot.SpotPlanner, or None: on-demand only
        self.handle_notices = handle_notices  # False: a noticed replica serves on until it is taken (a comparison)
        self.noticed: set[str] = set()
        # None: a noticed replica drains at once; else it serves on until this long before it is taken (its
        # replacement is launched at once either way: a noticed replica is not counted).
        self.notice_drain_lead_s = notice_drain_lead_s
        self.notice_drained: set[str] = set()
        self.spot_extra = 0  # the spot margin of the last decision
        self.spot_decisions: list[tuple[float, int, int, str]] = []  # (t, on-demand, spot, reason)
        self.cold_start_s = cold_start_s
        self.warm_pool, self.warm_start_s = warm_pool, warm_start_s
        self.standby: list[tuple[float, float]] = []  # (launched at, booted at) of each stand-by replica
        self.standby_intervals: list[tuple[float, float]] = []  # (launched, promoted) of stand-bys used so far
        self.rng = random.Random(f"cold-start-{seed}")
        self.next_decision_s = 0.0
        self.next_vertical_s = getattr(policy, "vertical_interval_s", math.inf)
        self.finished: list = []
        self.vertical_read: set[str] = set()  # the replicas the previous vertical tick read
        self.vertical_ready: set[str] = set()  # and those ready then
        self.decisions: list[tuple[float, int, int]] = []  # (t, current, desired)
        self.limits: list[tuple[float, int]] = []
        self.samples: list[tuple[float, float, float]] = []  # (t, demand in requests, demand in MU), every tick

    def _cold_start(self) -> float | None:
        if isinstance(self.cold_start_s, tuple):
            return self.rng.uniform(*self.cold_start_s)
        return self.cold_start_s

    def tick(self, fleet, actions, now: float) -> None:
        sample = DemandSample(
            t=now,
            in_flight=fleet.in_flight,
            queued=fleet.queued,
            in_flight_mu=fleet.in_flight_mu,
            queued_mu=fleet.queued_mu,
            arrivals=fleet.arrivals_last_tick,
            arrivals_mu=getattr(fleet, "arrivals_mu_last_tick", 0.0),
        )
        self.policy.observe(sample)
        self.samples.append((now, sample.requests, sample.mu))
        self.finished += [r for r in fleet.finished_last_tick if r.status == "ok"]
        if self.warm_pool and len(self.standby) < self.warm_pool:
            for _ in range(self.warm_pool - len(self.standby)):
                self.standby.append((now, now + (self._cold_start() or 0.0)))
        for r in fleet.replicas:
            if not self.handle_notices or r.terminate_at_s is None:
                continue
            if r.replica_id not in self.noticed:
                self.noticed.add(r.replica_id)
                self.next_decision_s = now  # the decision below replaces it
            lead = self.notice_drain_lead_s
            if r.replica_id not in self.notice_drained and (lead is None or now >= r.terminate_at_s - lead):
                # Stop routing to it and let its streams finish.
                self.notice_drained.add(r.replica_id)
                actions.drain(r.replica_id)
        if now >= self.next_decision_s:
            self.next_decision_s = now + self.policy.interval_s
            if self.spot is not None:
                self._horizontal_spot(fleet, actions, now)
            else:
                self._horizontal(fleet, actions, now)
        if now >= self.next_vertical_s:
            self.next_vertical_s = now + self.policy.vertical_interval_s
            self._vertical(fleet, actions)

    def scale_events(self) -> list[tuple[float, int]]:
        """(t, +1 scale-up / −1 scale-down) per decision that changed the replica count."""
        return [(t, 1 if desired > current else -1) for t, current, desired in self.decisions if desired != current]

    def _horizontal(self, fleet, actions, now: float) -> None:
        ready = [r for r in fleet.replicas if r.state == "ready"]
        starting = [r for r in fleet.replicas if r.state == "starting"]
        current = len(ready) + len(starting)
        desired = self.policy.desired(now=now, ready=len(ready), starting=len(starting))
        self.decisions.append((now, current, desired))
        if desired > current:
            self._launch(actions, desired - current, ON_DEMAND, now)
        elif desired < current:
            victims = sorted(starting, key=lambda r: -r.added_s) + sorted(ready, key=lambda r: r.in_flight)
            for replica in victims[: current - desired]:
                actions.drain(replica.replica_id)

    def _horizontal_spot(self, fleet, actions, now: float) -> None:
        live = [r for r in fleet.replicas if r.state in ("ready", "starting") and r.replica_id not in self.noticed]
        ready = [r for r in live if r.state == "ready"]
        counted = max(0, len(live) - self.spot_extra)  # the margin the last decision added is not capacity
        counted_ready = min(len(ready), counted)
        desired = self.policy.desired(now=now, ready=counted_ready, starting=counted - counted_ready)
        self.decisions.append((now, counted, desired))
        targets = self.spot.targets(desired, now)
        pools = {kind: [r for r in live if r.capacity_type == kind] for kind in (ON_DEMAND, SPOT)}
        if (short := targets.spot - len(pools[SPOT])) > 0:
            added = self._launch(actions, short, SPOT, now)
            if len(added) < short:
                self.spot.spot_refused(now)
                targets = self.spot.targets(desired, now)  # the fallback: the shortfall goes on on-demand
        if (short := targets.on_demand - len(pools[ON_DEMAND])) > 0:
            self._launch(actions, short, ON_DEMAND, now)
        self.spot_extra = targets.extra
        self.spot_decisions.append((now, targets.on_demand, targets.spot, targets.reason))
        # Surplus: starting replicas are cancelled at once; ready ones drain only while the ready fleet keeps the
        # count the policy wants (a fallback on-demand replica stays until the spot one replacing it serves).
        spare = len(ready) - desired
        for kind, target in ((ON_DEMAND, targets.on_demand), (SPOT, targets.spot)):
            surplus = len(pools[kind]) - target
            victims = sorted(pools[kind], key=lambda r: (r.state == "ready", r.in_flight, -r.added_s))
            for r in victims[: max(0, surplus)]:
                if r.state == "ready":
                    if spare <= 0:
                        break
                    spare -= 1
                actions.drain(r.replica_id)

    def _launch(self, actions, n: int, capacity_type: str, now: float) -> list[str]:
        added = []
        for _ in range(n):
            # Stand-bys are on-demand GPUs: a spot launch boots cold.
            cold = self._take_standby(now) if capacity_type == ON_DEMAND else self._cold_start()
            ids = actions.add_replicas(1, cold_start_s=cold, capacity_type=capacity_type)
            for replica_id in ids:
                if self.limits:  # a new replica starts at the limit the vertical axis set, not the default
                    actions.set_concurrency(self.limits[-1][1], replica_id=replica_id)
            added += ids
            if not ids:
                break
        return added

    def _take_standby(self, now: float) -> float | None:
        """A booted stand-by's short start if one is there (it leaves the pool), else a cold start."""
        booted = [s for s in self.standby if s[1] <= now]
        if not booted:
            return self._cold_start()
        self.standby.remove(booted[0])
        self.standby_intervals.append((booted[0][0], now))
        return self.warm_start_s

    def standby_gpu_s(self, *, start: float, end: float, gpus: int = 1) -> float:
        """GPU-seconds the warm pool held inside [start, end]: used stand-bys until promoted, the rest until end."""
        spans = self.standby_intervals + [(launched, end) for launched, _ in self.standby]
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans) * gpus

    def _vertical(self, fleet, actions) -> None:
        window, self.finished = self.finished, []
        ready = [r for r in fleet.replicas if r.state == "ready"]
        size = getattr(self.policy, "vertical_sample", 0)
        read = set(sample_replicas([r.replica_id for r in ready], size))
        # As the live tick: a replica's latencies count when it was read in the previous cycle too, or became ready
        # since (its counts since it started are this cycle's); one already serving that was not read then (new
        # to the sample) gives its gauges only.
        counted = {i for i in read if i in self.vertical_read or i not in self.vertical_ready}
        self.vertical_ready = {r.replica_id for r in ready}
        ready = [r for r in ready if r.replica_id in read]
        window = [r for r in window if r.replica_id in counted]
        self.vertical_read = read
        # Replica-side TTFT (dispatch → first token), as vLLM's histogram sees it: time queued at the proxy is the
        # horizontal axis's business, not a sign that replicas run too many sequences.
        ttfts = sorted(
            (r.first_token_s - r.dispatch_s) * 1000
            for r in window
            if r.first_token_s is not None and r.dispatch_s is not None
        )
        tpots = sorted(r.tpot_s * 1000 for r in window if r.tpot_s is not None)
        limit = self.policy.adjust_concurrency(
            ttft_p95_ms=percentile(ttfts, 95),
            tpot_p95_ms=percentile(tpots, 95),
            kv_usage=max((r.kv_usage for r in ready), default=None),
            waiting_per_replica=(sum(r.num_waiting for r in ready) / len(ready)) if ready else None,
            busy_fraction=(
                sum(r.in_flight for r in ready) / sum(max(1, r.concurrency_limit) for r in ready) if ready else None
            ),
        )
        self.limits.append((fleet.now, limit))
        actions.set_concurrency(limit)


def engine_seconds_per_request(profile, concurrency: float, *, in_tok: float = 500, out_tok: float = 300) -> float:
    """Mean in-flight time W of a request on a replica of ``profile`` holding ``concurrency`` sequences.

    With chunked prefill a step that carries prompt tokens stalls every decoding sequence for the prefill, so the
    decode rate is cut by the share of time spent prefilling, ``f = λ·p`` (``p``: prefill seconds per request, the
    per-step overhead spread over the prompts one step's token budget holds). With ``s`` the decode-only time of
    ``out_tok`` tokens and ``t`` the prefill of one prompt, ``W = t + s / (1 − f)`` and Little's law ``B = λ·W``
    give ``W² − (t + B·p + s)·W + t·B·p = 0``; W is its larger root. Ignoring the stall (``W = t + s``)
    overestimates an A100 replica's request rate by ~1.8× at 500-token prompts and 45 sequences.
    """
    b = max(float(concurrency), 1.0)
    per_step = max(1.0, profile.max_num_batched_tokens / max(in_tok, 1.0))
    p = in_tok / profile.prefill_tokens_per_s + profile.prefill_overhead_s / per_step
    t = profile.prefill_s(int(in_tok))
    context = b * (in_tok + out_tok / 2)
    s = max(out_tok - 1, 0) * profile.decode_step_s(int(round(b)), int(context))
    total = t + b * p + s
    return (total + math.sqrt(max(total * total - 4 * t * b * p, 0.0))) / 2
