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
as the in-flight counts of the other routers are. A replica's type is ``replica_types[id]`` (the simulator's
benches) or its view's ``profile`` (the live proxy: the hardware profile it runs on); a replica of a type the plan
has no figures for gets nothing.

Live, an endpoint with ``routing_policy`` ``cost_aware`` carries the plan as ``Endpoint.routing_plan``, the
``routing_plan`` of ``POST /api/v1/capacity/plan-mix`` (``plan_figures`` reads it)::

    {"buckets": [{"name": "chat", "prompt_tokens": 256, "output_tokens": 128}, ...],
     "types": {"<hardware profile name>": {"usd_per_hour": 1.86, "batch": {"chat": 24}, "rate_rps": {"chat": 3.1}}},
     "shares": {"chat": {"<hardware profile name>": 1.0}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.filters import METRICS_STALE_AFTER_S, eligible


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


class PlanInvalid(ValueError):
    """A routing plan that is not the planner's shape; the message names what is wrong."""


def plan_figures(plan: object) -> dict:
    """``CostAwareRouter``'s keyword arguments (buckets, figures, shares) from a stored routing plan; raises
    ``PlanInvalid`` naming the first thing that is wrong."""
    if not isinstance(plan, dict):
        raise PlanInvalid("must be a JSON object with buckets, types and shares")
    raw_buckets, raw_types, raw_shares = plan.get("buckets"), plan.get("types"), plan.get("shares") or {}
    if not isinstance(raw_buckets, list) or not raw_buckets:
        raise PlanInvalid("buckets: a non-empty list of {name, prompt_tokens, output_tokens}")
    buckets = []
    for i, b in enumerate(raw_buckets):
        ok = isinstance(b, dict) and isinstance(b.get("name"), str) and b["name"]
        sizes = [b.get(k) for k in ("prompt_tokens", "output_tokens")] if ok else []
        if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
            raise PlanInvalid(f"buckets[{i}]: needs a name and positive integer prompt_tokens and output_tokens")
        buckets.append(SizeBucket(b["name"], *sizes))
    names = {b.name for b in buckets}
    if not isinstance(raw_types, dict) or not raw_types:
        raise PlanInvalid("types: an object of hardware profile name to {usd_per_hour, batch, rate_rps}")
    figures = {}
    for kind, t in raw_types.items():
        if not isinstance(t, dict) or not _number(t.get("usd_per_hour")):
            raise PlanInvalid(f"types.{kind}: needs a usd_per_hour of zero or more")
        tables = {}
        for table in ("batch", "rate_rps"):
            values = t.get(table)
            if not isinstance(values, dict) or not set(values) <= names or not all(map(_number, values.values())):
                raise PlanInvalid(f"types.{kind}.{table}: an object of bucket name to a number of zero or more")
            tables[table] = {k: float(v) for k, v in values.items()}
        figures[kind] = TypeFigures(usd_per_hour=float(t["usd_per_hour"]), **tables)
    if not isinstance(raw_shares, dict) or not all(
        b in names and isinstance(row, dict) and set(row) <= set(figures) and all(map(_number, row.values()))
        for b, row in raw_shares.items()
    ):
        raise PlanInvalid("shares: an object of bucket name to {hardware profile name: share}")
    return {"buckets": buckets, "figures": figures, "shares": raw_shares}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


class CostAwareRouter:
    name = "cost_aware"

    def __init__(
        self,
        replica_types: Mapping[str, str] | None = None,
        figures: Mapping[str, TypeFigures] | None = None,
        buckets: Sequence[SizeBucket] = (),
        shares: Mapping[str, Mapping[str, float]] | None = None,
        default_type: str = "",
        seed: int | None = None,  # the registry's common option: this router draws no random numbers
        stale_after_s: float = METRICS_STALE_AFTER_S,
    ) -> None:
        self.stale_after_s = stale_after_s
        replica_types, figures = replica_types or {}, figures or {}
        self.default_type = default_type  # the type of a replica nobody named (the endpoint's own profile)
        if not buckets or not figures:
            raise ValueError("the router needs the planner's request-size buckets and per-type figures")
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
        # The prompt's tokens: the simulator knows them, the proxy passes admission's estimate (4 characters a token,
        # or the ids of a token-id prompt); the text is the fallback for a caller that passes neither.
        prompt = max(1, int(request.extra.get("prompt_tokens") or len(request.prompt_text) // 4))
        output = max(1, int(request.extra.get("max_tokens") or 256))

        def distance(b: SizeBucket) -> float:
            return abs(math.log(prompt / b.prompt_tokens)) + abs(math.log(output / b.output_tokens))

        return min(self.buckets, key=distance).name

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView], now: float) -> str | None:
        bucket = self.bucket_of(request)
        room: dict[str, tuple[float, str]] = {}  # type → (load, replica) of its least loaded replica with room
        spill, spill_key = None, None
        # Healthy, not draining, below its concurrency limit, fresh metrics (or all stale: fail open), with LoRA slots
        # for an adapter's request: as every policy.
        for view in eligible(replicas, self.stale_after_s, adapter=request.adapter):
            kind = self._type_of(view)
            if kind not in self.figures:
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
            kind = self._type_of(next(v for v in replicas if v.replica_id == chosen))
            self.sent[(bucket, kind)] = self.sent.get((bucket, kind), 0) + 1
            request.extra["cost_share"] = self.figures[kind].share(bucket)
        return chosen

    def _type_of(self, view: ReplicaView) -> str:
        return self.replica_types.get(view.replica_id) or view.profile or self.default_type

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
