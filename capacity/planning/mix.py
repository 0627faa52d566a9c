"""The heterogeneous planner: the cheapest mix of replica types that serves a request-size histogram within an SLO
(pure; docs/algorithms.md#the-heterogeneous-planner).

A workload is a histogram of request-size buckets (prompt tokens, output tokens, requests per second). Each replica
type (a hardware profile serving the model) sustains, per bucket, a rate within the SLO: ``bucket_capacity``
derives it from an engine's step-time model (the simulator's roofline profiles, or measured ones), the way Mélange
profiles each GPU per request size. The plan is an integer program solved by SciPy's ``milp`` (HiGHS)::

    minimise   Σ_t  price_t · gpus_t · n_t                       (USD per hour)
    subject to Σ_t  x_bt = 1                      for each bucket b (its load is served somewhere)
               Σ_b  x_bt · rate_b / cap_bt ≤ n_t  for each type t   (a replica's time is shared between buckets)
               0 ≤ n_t ≤ max_replicas_t, n_t integer;  0 ≤ x_bt ≤ 1, x_bt = 0 where cap_bt = 0

``x_bt`` is the share of bucket b's load sent to type t. ``why`` says, per bucket, each type's tokens per dollar
(``cap_bt · (prompt + output) · 3600 / (price_t · gpus_t)``) and where the plan put the load.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

ON_DEMAND = "on_demand"
SPOT = "spot"


class PlanError(ValueError):
    """Bad input or no plan: ``field`` names what is missing or infeasible (an API field error's key)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Bucket:
    name: str
    prompt_tokens: int
    output_tokens: int
    rate_rps: float


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class ReplicaType:
    name: str
    usd_per_gpu_hour: float | None
    gpus_per_replica: int = 1
    capacity_type: str = ON_DEMAND
    max_replicas: int | None = None  # what the market offers; None: unbounded
    capacity_rps: Mapping[str, float] = field(default_factory=dict)  # bucket name → rate one replica sustains

    @property
    def usd_per_replica_hour(self) -> float:
        return (self.usd_per_gpu_hour or 0.0) * self.gpus_per_replica


@dataclass
class MixPlan:
    replicas: dict[str, int]  # type name → replicas (types the plan uses)
    shares: dict[str, dict[str, float]]  # bucket → type → share of its load
    usd_per_hour: float
    optimal: bool
    why: list[dict]
    load: dict[str, float] = field(default_factory=dict)  # type name → replicas' worth of load the plan sends it

    def as_dict(self) -> dict:
        return {
            "replicas": self.replicas,
            "shares": self.shares,
            "usd_per_hour": round(self.usd_per_hour, 4),
            "optimal": self.optimal,
            "load": {name: round(v, 4) for name, v in self.load.items()},
            "why": self.why,
        }


def bucket_capacity(engine, bucket: Bucket, slo: Slo, *, headroom: float = 0.8, ttft_share: float = 0.5) -> float:
    """Requests per second one replica running ``engine`` sustains for ``bucket`` alone within the SLO
    (``bucket_fit``'s rate)."""
    return bucket_fit(engine, bucket, slo, headroom=headroom, ttft_share=ttft_share)[1]


def bucket_fit(
    engine, bucket: Bucket, slo: Slo, *, headroom: float = 0.8, ttft_share: float = 0.5
) -> tuple[int, float]:
    """(B_max, requests per second): the batch of ``bucket``'s requests one replica running ``engine`` decodes
    within the SLO, and the rate it sustains for the bucket alone.

    ``engine`` has the simulator's ``EngineProfile`` step model (``decode_t0_s``, ``decode_per_seq_s``,
    ``decode_per_ctx_token_s``, ``prefill_s(tokens)``, ``max_num_seqs``, ``num_gpu_blocks``, ``block_size``,
    ``max_model_len``). With B sequences decoding at mean context ``prompt + output/2``, each output token costs one
    decode step plus the prefills that arrive meanwhile (``B · prefill / output``, chunked prefill shares the
    steps): ``tpot(B) = t0 + B·(per_seq + per_ctx·ctx + prefill/output)``. B_max is the largest batch with
    ``tpot(B) ≤ SLO`` within the batch and KV limits, and ``B_max / (output · tpot(B_max))`` requests per second
    (Little's law) the most the replica sustains; it is planned at ``headroom`` of that rate (room for Poisson
    bursts and prefill stalls: near the limit, queues and TTFT grow without bound). A bucket whose prefill alone takes more than ``ttft_share`` of the TTFT SLO, or that
    does not fit the context, gets 0.
    """
    prompt, output = bucket.prompt_tokens, max(1, bucket.output_tokens)
    if prompt + output > engine.max_model_len:
        return 0, 0.0
    prefill = engine.prefill_s(prompt)
    if prefill > ttft_share * slo.ttft_s:
        return 0, 0.0
    context = prompt + output / 2
    per_seq = engine.decode_per_seq_s + engine.decode_per_ctx_token_s * context + prefill / output
    budget = slo.tpot_s - engine.decode_t0_s
    if budget <= 0:
        return 0, 0.0
    kv_tokens = engine.num_gpu_blocks * engine.block_size
    batch = min(math.floor(budget / per_seq), engine.max_num_seqs, math.floor(0.9 * kv_tokens / (prompt + output)))
    if batch < 1:
        return 0, 0.0
    tpot = engine.decode_t0_s + batch * per_seq
    return batch, headroom * batch / (output * tpot)


def _check(buckets: Sequence[Bucket], types: Sequence[ReplicaType]) -> None:
    if not buckets:
        raise PlanError("buckets", "the workload has no request-size buckets")
    if not types:
        raise PlanError("profiles", "no hardware profile to plan with")
    for bucket in buckets:
        if bucket.rate_rps < 0 or not math.isfinite(bucket.rate_rps):
            raise PlanError("buckets", f"bucket {bucket.name!r}: rate_rps must be a finite number ≥ 0")
    for t in types:
        if t.usd_per_gpu_hour is None:
            raise PlanError("usd_per_gpu_hour", f"hardware profile {t.name!r} has no price per GPU-hour")
        if t.usd_per_gpu_hour < 0:
            raise PlanError("usd_per_gpu_hour", f"hardware profile {t.name!r}: the price cannot be negative")
    for bucket in buckets:
        if bucket.rate_rps > 0 and not any(t.capacity_rps.get(bucket.name, 0.0) > 0 for t in types):
            raise PlanError(
                "buckets",
                f"bucket {bucket.name!r} ({bucket.prompt_tokens} prompt + {bucket.output_tokens} output tokens) "
                "cannot be served within the SLO by any profile",
            )


def plan_mix(buckets: Sequence[Bucket], types: Sequence[ReplicaType], *, time_limit_s: float = 10.0) -> MixPlan:
    """The cheapest mix (see the module's formulation); raises ``PlanError`` when there is none."""
    # Imported here: SciPy's import costs ~0.3 s, paid only by callers that plan (not by every module importing mix).
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    _check(buckets, types)
    active = [b for b in buckets if b.rate_rps > 0]
    n_t, n_b = len(types), len(active)
    n_vars = n_t + n_b * n_t  # n_t first, then x_bt row by row

    def x(b: int, t: int) -> int:
        return n_t + b * n_t + t

    cost = np.zeros(n_vars)
    cost[:n_t] = [t.usd_per_replica_hour for t in types]
    # A tiny tie-break so that equal-cost plans prefer fewer replicas (and zero-price types are not piled on).
    cost[:n_t] += 1e-6
    lower, upper = np.zeros(n_vars), np.ones(n_vars)
    for i, t in enumerate(types):
        upper[i] = np.inf if t.max_replicas is None else t.max_replicas
    rows, lo, hi = [], [], []
    for b, bucket in enumerate(active):
        row = np.zeros(n_vars)
        for t, rtype in enumerate(types):
            row[x(b, t)] = 1.0
            if rtype.capacity_rps.get(bucket.name, 0.0) <= 0:
                upper[x(b, t)] = 0.0
        rows.append(row), lo.append(1.0), hi.append(1.0)
    for t, rtype in enumerate(types):
        row = np.zeros(n_vars)
        row[t] = -1.0
        for b, bucket in enumerate(active):
            cap = rtype.capacity_rps.get(bucket.name, 0.0)
            if cap > 0:
                row[x(b, t)] = bucket.rate_rps / cap
        rows.append(row), lo.append(-np.inf), hi.append(0.0)
    integrality = np.zeros(n_vars)
    integrality[:n_t] = 1
    result = milp(
        cost,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=integrality,
        bounds=Bounds(lower, upper),
        options={"time_limit": time_limit_s},
    )
    if result.status == 2:
        available = ", ".join(f"{t.name} ≤ {t.max_replicas}" for t in types if t.max_replicas is not None)
        raise PlanError("max_replicas", f"the available replicas ({available or 'unbounded'}) cannot serve the load")
    if result.x is None:
        raise PlanError("time_limit_s", f"the solver found no plan within {time_limit_s:g} s ({result.message})")
    return _plan(active, types, result.x, optimal=result.status == 0, x=x)


def _plan(active, types, values, *, optimal: bool, x) -> MixPlan:
    replicas = {t.name: round(values[i]) for i, t in enumerate(types) if round(values[i]) > 0}
    shares: dict[str, dict[str, float]] = {}
    why = []
    for b, bucket in enumerate(active):
        shares[bucket.name] = {
            t.name: round(float(values[x(b, i)]), 4) for i, t in enumerate(types) if values[x(b, i)] > 1e-6
        }
        per_dollar = {}
        for t in types:
            cap = t.capacity_rps.get(bucket.name, 0.0)
            if cap > 0 and t.usd_per_replica_hour > 0:
                tokens = cap * (bucket.prompt_tokens + bucket.output_tokens) * 3600
                per_dollar[t.name] = round(tokens / t.usd_per_replica_hour)
        best = max(per_dollar, key=per_dollar.get) if per_dollar else None
        why.append(
            {
                "bucket": bucket.name,
                "tokens_per_usd": per_dollar,
                "cheapest_per_token": best,
                "served_by": shares[bucket.name],
                "unservable_on": [t.name for t in types if t.capacity_rps.get(bucket.name, 0.0) <= 0],
            }
        )
    load = {
        t.name: sum(
            values[x(b, i)] * bucket.rate_rps / t.capacity_rps[bucket.name]
            for b, bucket in enumerate(active)
            if t.capacity_rps.get(bucket.name, 0.0) > 0
        )
        for i, t in enumerate(types)
        if t.name in replicas
    }
    usd = sum(n * next(t.usd_per_replica_hour for t in types if t.name == name) for name, n in replicas.items())
    return MixPlan(replicas=replicas, shares=shares, usd_per_hour=usd, optimal=optimal, why=why, load=load)


def best_single_type(buckets: Sequence[Bucket], types: Sequence[ReplicaType]) -> tuple[str, MixPlan]:
    """The cheapest plan that uses one type only (the baseline Mélange compares with): each type alone, planned by
    the same program, the cheapest that can serve every bucket."""
    _check(buckets, types)
    best: tuple[str, MixPlan] | None = None
    for rtype in types:
        try:
            plan = plan_mix(buckets, [rtype])
        except PlanError:
            continue
        if best is None or plan.usd_per_hour < best[1].usd_per_hour:
            best = (rtype.name, plan)
    if best is None:
        raise PlanError("profiles", "no single profile can serve every bucket within the SLO")
    return best


def with_capacities(types: Sequence[ReplicaType], engines: Mapping[str, object], buckets, slo: Slo, **kw):
    """``types`` with ``capacity_rps`` filled from each type's engine step model (``engines[type.name]``)."""
    out = []
    for t in types:
        engine = engines[t.name]
        caps = {b.name: bucket_capacity(engine, b, slo, **kw) for b in buckets}
        out.append(
            ReplicaType(
                name=t.name,
                usd_per_gpu_hour=t.usd_per_gpu_hour,
                gpus_per_replica=t.gpus_per_replica,
                capacity_type=t.capacity_type,
                max_replicas=t.max_replicas,
                capacity_rps=caps,
            )
        )
    return out
