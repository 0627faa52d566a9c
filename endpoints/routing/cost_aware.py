"""Routing across a fleet of mixed GPU types by cost under the SLO (pure; docs/algorithms.md#routing-a-mixed-fleet).

The heterogeneous planner (``capacity.planning.mix``) sized the fleet from per-type figures: for each request-size
bucket, the batch ``B`` of such requests one replica of a type decodes within the TPOT SLO (0 where its prefill
alone breaks the TTFT SLO or it does not fit), and the rate that batch sustains. This router uses the same figures
per request, without knowing the plan's buckets of the requests (a benchmark knows them; a proxy does not):

* A request's bucket is the nearest by prompt and output length (log scale), from what the proxy knows before
  sending it: the prompt's tokens (estimated) and ``max_tokens``.
* On a replica of type ``t`` it holds ``1/B_t`` of the replica while it runs (its share: the per-type model unit,
  so a replica's capacity is 1), and costs ``price_t / (3600 · rate_t)`` dollars.
* With the plan's shares (which share of each bucket's load goes to which type: the integer program's cost-optimal
  assignment), each bucket's requests are dealt to its types in those proportions (a deficit count per bucket and
  type: the type furthest behind its share goes next), to the least loaded replica of the type with room for the
  request's share (load + share ≤ 1: the SLO-compliant batch).
* Without shares, or when the type the shares name has no room, it goes to the cheapest type with room (greedy):
  small requests fill the cheap GPUs and spill over to the fast ones when the cheap ones are full, and long
  prompts go where their prefill meets the TTFT SLO. Greedy alone is not enough on a fleet whose fast type is the
  only one for some requests: small requests spilling onto it take the room those need (``bench economics``
  shows it on the mixed workload). With no room anywhere, the feasible replica left with the lowest load after
  it (it queues there).

The load is the router's own count of the shares it sent and has not seen finish (``on_routed``/``on_finished``),
as the in-flight counts of the other routers are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from endpoints.routing.base import ReplicaView, RouteRequest


@dataclass(frozen=True)
class SizeBucket:
    name: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TypeFigures:
    """One replica type, as the planner saw it: USD per replica-hour and, per bucket, the SLO-compliant batch and
    the rate it sustains (requests per second; 0: the type cannot serve the bucket within the SLO)."""

    usd_per_hour: float
    batch: Mapping[str, float]
    rate_rps: Mapping[str, float]

    def usd_per_request(self, bucket: str) -> float:
        rate = self.rate_rps.get(bucket, 0.0)
        return self.usd_per_hour / (3600.0 * rate) if rate > 0 else math.inf

    def share(self, bucket: str) -> float:
        batch = self.batch.get(bucket, 0.0)
        return 1.0 / batch if batch > 0 else math.inf


class CostAwareRouter:
    name = "cost_aware"

    def __init__(
        self,
        replica_types: Mapping[str, str],
        figures: Mapping[str, TypeFigures],
        buckets: Sequence[SizeBucket],
        shares: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        if not buckets:
            raise ValueError("the router needs the planner's request-size buckets")
        missing = set(replica_types.values()) - set(figures)
        if missing:
            raise ValueError(f"no figures for replica types: {', '.join(sorted(missing))}")
        self.replica_types = dict(replica_types)
        self.figures = dict(figures)
        self.buckets = list(buckets)
        self.shares = {b: dict(row) for b, row in (shares or {}).items()}
        self.sent: dict[tuple[str, str], int] = {}  # (bucket, type) → requests dealt
        self.load: dict[str, float] = {}
        self._held: dict[str, float] = {}  # request id → the share it holds on its replica

    def bucket_of(self, request: RouteRequest) -> str:
        prompt = max(1, int(request.extra.get("prompt_tokens") or max(1, len(request.prompt_text) // 4)))
        output = max(1, int(request.extra.get("max_tokens") or 256))

        def distance(b: SizeBucket) -> float:
            return abs(math.log(prompt / b.prompt_tokens)) + abs(math.log(output / b.output_tokens))

        return min(self.buckets, key=distance).name

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        bucket = self.bucket_of(request)
        room: dict[str, tuple[float, str]] = {}  # type → (load, replica) of its least loaded replica with room
        spill, spill_key = None, None
        for view in replicas:
            kind = self.replica_types.get(view.replica_id)
            if kind is None or not view.healthy or view.draining:
                continue
            share = self.figures[kind].share(bucket)
            if share == math.inf:
                continue  # this type cannot serve the bucket within the SLO
            load = self.load.get(view.replica_id, 0.0)
            if load + share <= 1.0:
                if kind not in room or (load, view.replica_id) < room[kind]:
                    room[kind] = (load, view.replica_id)
            elif spill_key is None or (load + share, view.replica_id) < spill_key:
                spill, spill_key = view.replica_id, (load + share, view.replica_id)
        kind = self._planned_type(bucket, room) or min(
            room, key=lambda k: (self.figures[k].usd_per_request(bucket), room[k]), default=None
        )
        chosen = room[kind][1] if kind is not None else spill
        if chosen is not None:
            kind = self.replica_types[chosen]
            self.sent[(bucket, kind)] = self.sent.get((bucket, kind), 0) + 1
            request.extra["cost_share"] = self.figures[kind].share(bucket)
        return chosen

    def _planned_type(self, bucket: str, room: Mapping[str, tuple[float, str]]) -> str | None:
        """The type the plan's shares say is furthest behind for this bucket, if it has room."""
        row = self.shares.get(bucket)
        if not row:
            return None
        dealt = sum(self.sent.get((bucket, k), 0) for k in row) + 1
        kind = max(row, key=lambda k: (row[k] * dealt - self.sent.get((bucket, k), 0), k))
        return kind if kind in room else None

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        share = request.extra.get("cost_share", 0.0)
        self._held[request.request_id] = share
        self.load[replica_id] = self.load.get(replica_id, 0.0) + share

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        share = self._held.pop(request.request_id, 0.0)
        self.load[replica_id] = max(0.0, self.load.get(replica_id, 0.0) - share)
