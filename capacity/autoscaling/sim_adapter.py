"""Our policies (or a baseline) behind the engine simulator's ``Autoscaler`` hook (pure: no Django).

``endpoints.runtimes.sim.des.Simulation`` calls ``tick(fleet, actions, now)`` every simulated second with a
``FleetView``; this adapter feeds the policy one demand sample per tick, asks for a replica count every
``policy.interval_s`` and a concurrency limit every ``policy.vertical_interval_s`` (when the policy has a vertical
axis), and acts through ``FleetActions``: add replicas (cold start), cancel starting ones, drain ready ones (the
simulator removes a draining replica once its last request finished).
"""

import math

from capacity.autoscaling.demand import DemandSample


class EngineSimAutoscaler:
    def __init__(self, policy, *, cold_start_s: float | None = None) -> None:
        self.policy = policy
        self.cold_start_s = cold_start_s
        self.next_decision_s = 0.0
        self.next_vertical_s = getattr(policy, "vertical_interval_s", math.inf)
        self.finished: list = []
        self.decisions: list[tuple[float, int, int]] = []  # (t, current, desired)
        self.limits: list[tuple[float, int]] = []

    def tick(self, fleet, actions, now: float) -> None:
        self.policy.observe(
            DemandSample(
                t=now,
                in_flight=fleet.in_flight,
                queued=fleet.queued,
                in_flight_mu=fleet.in_flight_mu,
                queued_mu=fleet.queued_mu,
                arrivals=fleet.arrivals_last_tick,
            )
        )
        self.finished += [r for r in fleet.finished_last_tick if r.status == "ok"]
        if now >= self.next_decision_s:
            self.next_decision_s = now + self.policy.interval_s
            self._horizontal(fleet, actions, now)
        if now >= self.next_vertical_s:
            self.next_vertical_s = now + self.policy.vertical_interval_s
            self._vertical(fleet, actions)

    def _horizontal(self, fleet, actions, now: float) -> None:
        ready = [r for r in fleet.replicas if r.state == "ready"]
        starting = [r for r in fleet.replicas if r.state == "starting"]
        current = len(ready) + len(starting)
        desired = self.policy.desired(now=now, ready=len(ready), starting=len(starting))
        self.decisions.append((now, current, desired))
        if desired > current:
            actions.add_replicas(desired - current, cold_start_s=self.cold_start_s)
        elif desired < current:
            victims = sorted(starting, key=lambda r: -r.added_s) + sorted(ready, key=lambda r: r.in_flight)
            for replica in victims[: current - desired]:
                actions.drain(replica.replica_id)

    def _vertical(self, fleet, actions) -> None:
        window, self.finished = self.finished, []
        ttfts = sorted(r.ttft_s * 1000 for r in window if r.ttft_s is not None)
        tpots = sorted(r.tpot_s * 1000 for r in window if r.tpot_s is not None)
        ready = [r for r in fleet.replicas if r.state == "ready"]
        limit = self.policy.adjust_concurrency(
            ttft_p95_ms=_p95(ttfts),
            tpot_p95_ms=_p95(tpots),
            kv_usage=max((r.kv_usage for r in ready), default=None),
            waiting_per_replica=(sum(r.num_waiting for r in ready) / len(ready)) if ready else None,
            busy_fraction=(
                sum(r.in_flight for r in ready) / sum(max(1, r.concurrency_limit) for r in ready) if ready else None
            ),
        )
        self.limits.append((fleet.now, limit))
        actions.set_concurrency(limit)


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]
