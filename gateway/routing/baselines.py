"""Baseline policies kept for comparison: round robin, least request, power of two choices (pure)."""

import random
from collections.abc import Sequence

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.filters import eligible


class RouterBase:
    """Shared plumbing: a seeded RNG for tie-breaks and no-op lifecycle hooks."""

    name = "base"

    def __init__(self, *, seed: int | None = None, stale_after_s: float = 2.0):
        self.rng = random.Random(seed)
        self.stale_after_s = stale_after_s

    def candidates(self, replicas: Sequence[ReplicaView], request: RouteRequest | None = None) -> list[ReplicaView]:
        """The shared filters; a request naming an adapter never goes to a replica without LoRA slots."""
        return eligible(replicas, self.stale_after_s, request.adapter if request is not None else None)

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        return None

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        return None

    def on_first_token(self, request: RouteRequest, replica_id: str, now: float) -> None:
        return None

    def _random_best(self, scored: list[tuple[float, ReplicaView]]) -> str:
        best = max(score for score, _ in scored)
        ties = [r for score, r in scored if score >= best - 1e-12]
        return ties[0].replica_id if len(ties) == 1 else self.rng.choice(ties).replica_id


class RoundRobinRouter(RouterBase):
    """Cycles through replicas in id order, skipping those the filters reject (Kubernetes Service style)."""

    name = "round_robin"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._last: str | None = None

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = sorted(self.candidates(replicas, request), key=lambda r: r.replica_id)
        if not candidates:
            return None
        # Continue after the last replica picked, by id, so that replicas joining or failing do not reset the cycle.
        chosen = next((r for r in candidates if self._last is None or r.replica_id > self._last), candidates[0])
        self._last = chosen.replica_id
        return chosen.replica_id


class LeastRequestRouter(RouterBase):
    """Fewest requests in flight from this router; ties broken at random."""

    name = "least_request"

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        return self._random_best([(-r.in_flight, r) for r in candidates])


class PowerOfTwoRouter(RouterBase):
    """Samples two replicas at random and keeps the one with fewer requests in flight (then fewer waiting)."""

    name = "power_of_two"

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        candidates = self.candidates(replicas, request)
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0].replica_id
        a, b = self.rng.sample(candidates, 2)
        return min((a, b), key=lambda r: (r.in_flight, r.num_waiting)).replica_id
