"""The discrete-event runner's spot capacity: a market that lends replicas and takes them back (pure).

Mixed into ``des.Simulation`` (``SpotOps``) with a ``SpotMarket``. An autoscaler asks for spot replicas through
``FleetActions.add_replicas(n, capacity_type="spot")``; the market refuses while spot is unavailable (an outage
window of its trace: the launch returns fewer ids, and the caller falls back), and gives each replica it lends a
seeded lifetime (exponential, ``reclaims_per_replica_day`` per replica-day on average). At the end of it the cloud
sends an interruption notice, ``notice_s`` (30-120 s, drawn) before it takes the instance; an outage also notices
every spot replica running when it starts. What the platform does with a notice is the autoscaler's business (stop
routing, drain, replace: ``FleetActions.drain``); the simulation only reports it (``ReplicaStatus.terminate_at_s``)
and, when the time is up, removes the replica: a request that had not streamed its first token goes back to the
routing backlog and is sent elsewhere, as the proxy retries before the first byte; one that was streaming is
resumed elsewhere as the proxy resumes it (``gateway/proxy/resume.py``: the continuation's prompt is the prompt
plus the tokens streamed, its output what is left; its TTFT stays the first replica's), up to
``Simulation.resume_streams`` times, and lost beyond that or with ``resume_streams=0`` (status ``error``, reason
``spot_reclaimed``). docs/algorithms.md#spot-capacity.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from simulator.fleet import _SPOT

DAY_S = 86_400.0


@dataclass
class SpotMarket:
    reclaims_per_replica_day: float = 1.0
    day_s: float = DAY_S  # the length of a "day" for the rate (a compressed trace day counts as one)
    notice_s: tuple[float, float] = (30.0, 120.0)
    unavailable: tuple[tuple[float, float], ...] = ()  # (start, end) windows with no spot capacity to be had
    seed: int = 0
    rng: random.Random = field(init=False, repr=False)
    reclaims: list[tuple[float, str]] = field(init=False, default_factory=list)  # (noticed at, replica id)
    refused: int = field(init=False, default=0)  # launches refused for want of capacity

    def __post_init__(self) -> None:
        if self.reclaims_per_replica_day < 0:
            raise ValueError("reclaims_per_replica_day must be zero or more")
        low, high = self.notice_s
        if not 0 < low <= high:
            raise ValueError("notice_s must be a (low, high) range of positive seconds")
        self.rng = random.Random(f"spot-market-{self.seed}")

    def available(self, now: float) -> bool:
        return not any(start <= now < end for start, end in self.unavailable)

    def lifetime_s(self) -> float:
        if self.reclaims_per_replica_day == 0:
            return float("inf")
        return self.rng.expovariate(self.reclaims_per_replica_day / self.day_s)

    def draw_notice_s(self) -> float:
        return self.rng.uniform(*self.notice_s)


class SpotOps:
    """Spot replicas for ``des.Simulation`` (which provides clock, spot_market, _push, add_replica, …)."""

    def _schedule_outages(self) -> None:
        for start, _end in self.spot_market.unavailable if self.spot_market is not None else ():
            self._push(start, _SPOT, ("outage", None, 0.0))

    def add_spot_replicas(self, n: int, *, cold_start_s: float | None = None) -> list[str]:
        """Up to ``n`` spot replicas: none while the market has no spot capacity."""
        market, now = self.spot_market, self.clock.now()
        if market is None or not market.available(now):
            if market is not None:
                market.refused += n
            return []
        ids = []
        for _ in range(n):
            replica_id = self.add_replica(cold_start_s=cold_start_s, capacity_type="spot")
            life = market.lifetime_s()
            if life != float("inf"):
                self.reclaim(replica_id, at_s=now + life, notice_s=market.draw_notice_s())
            ids.append(replica_id)
        return ids

    def reclaim(self, replica_id: str, *, at_s: float | None = None, notice_s: float = 120.0) -> None:
        """The cloud's interruption notice for ``replica_id`` at ``at_s``; the instance goes ``notice_s`` later."""
        self._push(self.clock.now() if at_s is None else at_s, _SPOT, ("notice", replica_id, notice_s))

    def _apply_spot(self, kind: str, replica_id: str | None, notice_s: float) -> None:
        now = self.clock.now()
        if kind == "outage":
            for rep in list(self.replicas.values()):
                if rep.capacity_type == "spot":
                    self._notice(rep.replica_id, self.spot_market.draw_notice_s())
        elif kind == "notice":
            self._notice(replica_id, notice_s)
        elif kind == "terminate":
            self._terminate(replica_id, now)

    def _notice(self, replica_id: str, notice_s: float) -> None:
        rep = self.replicas.get(replica_id)
        if rep is None or rep.terminate_at_s is not None:
            return  # already gone (drained, removed) or already noticed
        now = self.clock.now()
        rep.terminate_at_s = now + notice_s
        rep.record.noticed_s = now
        self.spot_market.reclaims.append((now, replica_id))
        self._push(rep.terminate_at_s, _SPOT, ("terminate", replica_id, 0.0))

    def _cut_in_flight(self, rep, now: float, *, lost_reason: str) -> None:
        """The requests of a replica taken away (a reclaim, a crash), as the proxy handles a replica that goes away
        mid-request: one that has not streamed its first token goes to another replica (it keeps its arrival time);
        a streaming one is resumed on another replica from what the client has read, up to ``resume_streams`` times;
        beyond that it is lost (``lost_reason``). Neither goes back to the replica it failed on."""
        replica_id = rep.replica_id
        for request_id, (route, result, seq) in list(rep.in_flight.items()):
            self.router.on_finished(route, replica_id, now)
            if seq.first_token_s is None:
                route.extra["retried_from"] = replica_id
                result.extra["retried_from"] = replica_id
            elif route.extra.get("resumes", 0) < self.resume_streams:
                route.extra["resumes"] = route.extra.get("resumes", 0) + 1
                route.extra["streamed_tokens"] = route.extra.get("streamed_tokens", 0) + seq.generated
                route.extra.setdefault("first_token_s", seq.first_token_s)
                route.extra.setdefault("scheduled_s", seq.scheduled_s)
                result.extra["resumed_from"] = replica_id
            else:
                result.status, result.reason, result.finish_s = "error", lost_reason, now
                result.output_tokens = route.extra.get("streamed_tokens", 0) + seq.generated
                self._finished_tick.append(result)
                continue
            route.extra["failed_on"] = replica_id
            result.replica_id, result.dispatch_s = None, None
            self._pending[request_id] = (route, result, seq.tag)
            self._backlog.append(route)

    def _terminate(self, replica_id: str, now: float) -> None:
        rep = self.replicas.get(replica_id)
        if rep is None:
            return  # drained and removed within the notice
        self._cut_in_flight(rep, now, lost_reason="spot_reclaimed")
        rep.in_flight.clear()
        rep.in_flight_mu = 0.0
        rep.record.reclaimed_s = now
        self.remove_replica(replica_id)
        self._pump()
