"""``bench economics``: the heterogeneous planner's cheapest mix against the best single GPU type, on three workload
mixes, each plan checked in the discrete-event simulator (docs/algorithms.md#the-heterogeneous-planner).

The model is Llama 3.1 8B on the simulator's roofline profiles of one L40S, one A100 80 GB and one H100
(``capacity/hardware/profiles.py``). Prices are public on-demand list prices per GPU-hour (AWS, us-east-1,
2024 list, Linux): g6e.xlarge (1 × L40S) $1.861/h; p4de.24xlarge (8 × A100 80 GB) $40.966/h → $5.12 per GPU;
p5.48xlarge (8 × H100) $98.32/h → $12.29 per GPU. SLO: TTFT ≤ 1 s, TPOT ≤ 50 ms (Mélange's conversational TPOT
scale). Each plan is simulated for a few minutes of Poisson arrivals per bucket; ``slo_attainment`` is the share of
requests within both SLOs on the mixed plan; ``one_removed_attainment`` is the best of the same with the mix one
replica short, of each type in turn (the plan is tight: each should miss).

The comparison at the SLO (docs/algorithms.md#the-heterogeneous-planner, "Against each single type at the SLO"):
the planner's default share rule (a bucket's prefill may take half the TTFT SLO on a type) keeps L40S and A100 off
the 6-7k-token prompts, which made H100 the best single type by construction. So each type alone is sized in
simulation, with no share rule: the fewest replicas whose pooled attainment over the run's seeds is ≥ 99 % with one
fewer missing (``single_types``); ``best_single_type`` is the cheapest of them. The mix is the planner's cheapest plan
over a grid of its two knobs (the prefill's share of the TTFT SLO, ``TTFT_SHARES``; the headroom each rate is
planned at, ``HEADROOMS``) that meets 99 % in simulation, then trimmed a replica at a time while it still does
(``mixed_replicas``, ``slo_attainment``); ``mixed_vs_best_single`` is its cost over the best single type's. The
planner's own default plan stays beside it (``planner_default``). ``milp_optimum_vs_single`` is the planner's model
alone (full rates, any prefill share): its cheapest mix over its cheapest single type, the most a mix saves on this
workload at these prices by the model's own figures, so a goal it puts out of reach is seen to be.

Seeds: benchmarks/protocol.py's ``economics`` training seeds; ``--held-out`` runs the held-out ones (``--opt seed=N``
runs one seed). Each plan is simulated on every seed's arrivals and judged on the pooled attainment.

Workloads (request-size histograms: prompt tokens / output tokens / requests per second):

* ``short_chat``: conversational turns, LMSYS-Chat-like: mostly short prompts and answers, with a 2 % tail of
  pasted documents (6,144-token prompts) that only a fast GPU prefills within the TTFT SLO.
* ``long_docs``: summarisation and RAG over documents: 2k–7k-token prompts, 256–512-token answers.
* ``mixed``: both populations behind one endpoint (chat by count, documents by tokens).
"""

from __future__ import annotations

import random
import time

from django.core.management.base import CommandError

from benchmarks import protocol
from benchmarks.capacity import economics_spot
from capacity.hardware.profiles import get_profile
from capacity.planning.mix import (
    Bucket,
    PlanError,
    ReplicaType,
    Slo,
    best_single_type,
    bucket_fit,
    plan_mix,
    with_capacities,
)
from capacity.planning.presets import WORKLOADS
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import LeastRequestRouter
from gateway.routing.cost_aware import CostAwareRouter, SizeBucket, TypeFigures
from simulator.des import Simulation, VirtualClock
from simulator.workloads import SimRequest, filler_text, poisson_times

SLO = Slo(ttft_s=1.0, tpot_s=0.05)
# --smoke: 5 s of arrivals per plan; the spot section on the shortest days, at a tenth of its peak, one history day.
SMOKE = {
    "duration_s": "5", "period_s": "1200", "peak_rps": "2", "history_days": "1", "tuning_days": "1",
    "ttft_shares": "0.5,1.0", "headrooms": "0.8", "seed": "1",
}  # fmt: skip
HELD_OUT = True  # bench economics --held-out: benchmarks/protocol.py's held-out seeds
TARGET = 0.99  # the SLO attainment every compared plan must reach in simulation
# The planner's knobs the mix is searched over (docs/algorithms.md#the-heterogeneous-planner): the share of the TTFT
# SLO a bucket's prefill may take on a type (0.5, the default, keeps L40S and A100 off 6-7k-token prompts) and the
# headroom each type's rate is planned at (0.8, the default).
TTFT_SHARES = (0.5, 0.65, 0.8, 1.0)
HEADROOMS = (0.6, 0.7, 0.8, 0.9)
ENGINES = {"l40s": "llama-8b-l40s", "a100": "llama-8b-a100", "h100": "llama-8b-h100"}
TYPES = [
    ReplicaType("l40s", usd_per_gpu_hour=1.861),  # g6e.xlarge
    ReplicaType("a100", usd_per_gpu_hour=40.966 / 8),  # p4de.24xlarge
    ReplicaType("h100", usd_per_gpu_hour=98.32 / 8),  # p5.48xlarge
]


class PlanRouter:
    """Sends each request to the replica type the plan gave its bucket (by the plan's shares, seeded), then to the
    least loaded replica of that type."""

    name = "plan"

    def __init__(self, replica_types: dict[str, str], shares: dict[str, dict[str, float]], seed: int = 0):
        self.replica_types = replica_types
        self.shares = shares
        self.rng = random.Random(f"plan-router-{seed}")

    def pick(self, request: RouteRequest, replicas: list[ReplicaView], now: float) -> str | None:
        bucket = request.request_id.rsplit(":", 1)[0]
        if not self.shares.get(bucket):
            return None  # no replica left that serves this bucket within the SLO: it waits, and misses
        types, weights = zip(*self.shares[bucket].items(), strict=True)
        wanted = self.rng.choices(types, weights)[0]
        live = [v for v in replicas if v.healthy and not v.draining and self.replica_types.get(v.replica_id) == wanted]
        if not live:
            return None
        return min(live, key=lambda v: (v.in_flight, v.replica_id)).replica_id

    def on_routed(self, request, replica_id, now):
        pass

    def on_finished(self, request, replica_id, now):
        pass


def workload(buckets: list[Bucket], *, duration_s: float, seed: int) -> list[SimRequest]:
    out = []
    for k, bucket in enumerate(buckets):
        for i, t in enumerate(poisson_times(bucket.rate_rps, duration_s=duration_s, seed=seed * 100 + k)):
            out.append(
                SimRequest(
                    request_id=f"{bucket.name}:{i}",
                    arrival_s=t,
                    prompt_parts=(filler_text(bucket.prompt_tokens, seed=f"{bucket.name}-{seed}-{i}"),),
                    output_tokens=bucket.output_tokens,
                )
            )
    out.sort(key=lambda r: r.arrival_s)
    return out


def simulate(replicas: dict[str, int], shares, requests: list[SimRequest], *, seed: int, router=None) -> float:
    """SLO attainment of ``replicas`` (type → count) serving ``requests`` routed by the plan's shares, or by
    ``router(replica_types)`` (replica id → type name)."""
    names = [name for name, n in sorted(replicas.items()) for _ in range(n)]
    replica_types = {f"r{i}": name for i, name in enumerate(names)}
    sim = Simulation(
        router=PlanRouter(replica_types, shares, seed=seed) if router is None else router(replica_types),
        replica_profiles=[get_profile(ENGINES[name]) for name in names],
        clock=VirtualClock(),
        seed=seed,
    )
    result = sim.run(iter(requests))
    return result.slo_attainment(ttft_s=SLO.ttft_s, tpot_s=SLO.tpot_s)


def one_removed(replicas: dict[str, int]) -> list[dict[str, int]]:
    """The mix one replica short, once per replica type it uses."""
    out = []
    for name in sorted(replicas):
        fewer = dict(replicas)
        fewer[name] -= 1
        out.append({k: v for k, v in fewer.items() if v > 0})
    return out


def types_serve(types, bucket: str, name: str) -> bool:
    return any(t.name == name and t.capacity_rps.get(bucket, 0.0) > 0 for t in types)


def shares_without(shares: dict, fleet: dict[str, int], types) -> dict:
    """The plan's shares on ``fleet``: a type the fleet no longer has passes its buckets' load to the types left that
    serve them."""
    return {
        b: {t: s for t, s in row.items() if t in fleet} or {t: 1.0 for t in fleet if types_serve(types, b, t)}
        for b, row in shares.items()
    }


class SloCheck:
    """Pooled SLO attainment of a fleet over every seed's arrivals; each (fleet, shares) is simulated once."""

    def __init__(self, buckets: list[Bucket], *, duration_s: float, seeds: tuple[int, ...]):
        self.runs = [(seed, workload(buckets, duration_s=duration_s, seed=seed)) for seed in seeds]
        self.seen: dict = {}

    @property
    def requests(self) -> int:
        return sum(len(requests) for _seed, requests in self.runs)

    def __call__(self, replicas: dict[str, int], shares: dict) -> float:
        key = (
            tuple(sorted(replicas.items())),
            tuple(sorted((b, tuple(sorted(r.items()))) for b, r in shares.items())),
        )
        if key not in self.seen:
            met = sum(len(reqs) * simulate(replicas, shares, reqs, seed=seed) for seed, reqs in self.runs)
            self.seen[key] = met / max(1, self.requests)
        return self.seen[key]


def fewest_meeting(meets, start: int, limit: int) -> int | None:
    """The fewest replicas n in 1..limit with ``meets(n)``, searched out from ``start`` by doubling steps, then
    bisected (attainment rises with replicas); None when even ``limit`` misses."""
    lo, hi, step = 0, None, 1  # lo misses (no replica misses), hi meets
    if meets(start):
        hi = start
        while hi - step > lo:
            if not meets(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
    else:
        lo = start
        while hi is None:
            n = min(lo + step, limit)
            if meets(n):
                hi = n
            elif n >= limit:
                return None
            else:
                lo, step = n, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def single_type_at_slo(rtype: ReplicaType, buckets, engines, check: SloCheck, *, meets_at: int | None = None) -> dict:
    """The cheapest fleet of ``rtype`` alone that meets ``TARGET`` in simulation, one replica fewer missing it. The
    search starts from the planner's count with the prefill allowed the whole TTFT SLO (no share rule); it assumes
    attainment rises with replicas, which a few thousand requests' 1 % need not do, so a smaller count already seen
    to meet the SLO (``meets_at``: the mix's search found it) wins."""
    [typed] = with_capacities([rtype], engines, buckets, SLO, ttft_share=1.0)
    shares = {b.name: {rtype.name: 1.0} for b in buckets if b.rate_rps > 0}
    try:
        start = plan_mix(buckets, [typed]).replicas[rtype.name]
    except PlanError as exc:
        return {"replicas": None, "why": str(exc)}
    n = fewest_meeting(lambda k: check({rtype.name: k}, shares) >= TARGET, start, 3 * start + 4)
    if meets_at is not None and check({rtype.name: meets_at}, shares) >= TARGET and (n is None or meets_at < n):
        n = meets_at
    if n is None:
        return {"replicas": None, "planner_replicas": start, "why": f"misses {TARGET:.0%} at {3 * start + 4}"}
    return {
        "replicas": n,
        "usd": round(n * rtype.usd_per_replica_hour, 3),
        "slo_attainment": round(check({rtype.name: n}, shares), 4),
        "one_fewer_attainment": round(check({rtype.name: n - 1}, shares), 4) if n > 1 else 0.0,
        "planner_replicas": start,
    }


def mix_at_slo(buckets, engines, check: SloCheck, *, shares_grid, headrooms) -> dict | None:
    """The planner's cheapest plan over its knobs' grid that meets ``TARGET`` in simulation, trimmed a replica at a
    time (the dearest type first) while it still does; None when no plan of the grid meets it."""
    candidates = []
    for share in shares_grid:
        for headroom in headrooms:
            types = with_capacities(TYPES, engines, buckets, SLO, ttft_share=share, headroom=headroom)
            try:
                plan = plan_mix(buckets, types)
            except PlanError:
                continue
            candidates.append((plan.usd_per_hour, share, headroom, plan, types))
    candidates.sort(key=lambda c: (c[0], -c[1], c[2]))
    chosen = next((c for c in candidates if check(c[3].replicas, c[3].shares) >= TARGET), None)
    if chosen is None:
        return None
    _usd, share, headroom, plan, types = chosen
    fleet, price = dict(plan.replicas), {t.name: t.usd_per_replica_hour for t in types}
    trimmed = True
    while trimmed:
        trimmed = False
        for name in sorted(fleet, key=lambda t: -price[t]):
            fewer = {t: n - (t == name) for t, n in fleet.items() if n - (t == name) > 0}
            if fewer and check(fewer, shares_without(plan.shares, fewer, types)) >= TARGET:
                fleet, trimmed = fewer, True
                break
    return {"plan": plan, "types": types, "share": share, "headroom": headroom, "replicas": fleet,
            "shares": shares_without(plan.shares, fleet, types)}  # fmt: skip


def best_one_short(mix: dict, types, check: SloCheck) -> tuple[float, dict]:
    """The best attainment of the mix one replica short, of each type in turn, and that fleet."""
    shorts = [
        (check(short, shares_without(mix["shares"], short, types)), short) for short in one_removed(mix["replicas"])
    ]
    return max(shorts, key=lambda item: item[0]) if shorts else (0.0, {})


def milp_optimum_vs_single(buckets, engines) -> float:
    """The planner's model alone, at full rates and any prefill share: its cheapest mix over its cheapest single
    type (no simulation margin in either)."""
    types = with_capacities(TYPES, engines, buckets, SLO, ttft_share=1.0, headroom=1.0)
    return round(plan_mix(buckets, types).usd_per_hour / best_single_type(buckets, types)[1].usd_per_hour, 4)


def evaluate(name: str, buckets: list[Bucket], *, duration_s: float, seeds, grid, progress) -> dict:
    engines = {t: get_profile(profile) for t, profile in ENGINES.items()}
    check = SloCheck(buckets, duration_s=duration_s, seeds=seeds)
    started = time.perf_counter()
    default_types = with_capacities(TYPES, engines, buckets, SLO)
    default = plan_mix(buckets, default_types)
    default_name, default_single = best_single_type(buckets, default_types)
    solve_s = time.perf_counter() - started
    mix = mix_at_slo(buckets, engines, check, **grid) or {
        "plan": default, "types": default_types, "share": 0.5, "headroom": 0.8, "replicas": default.replicas,
        "shares": default.shares,
    }  # fmt: skip
    # A plan of the grid that is one type alone is a fleet of that type seen to meet the SLO.
    seen = (
        dict(mix["replicas"]) if len(mix["replicas"]) == 1 and check(mix["replicas"], mix["shares"]) >= TARGET else {}
    )
    singles = {t.name: single_type_at_slo(t, buckets, engines, check, meets_at=seen.get(t.name)) for t in TYPES}
    met = {t: row for t, row in singles.items() if row["replicas"] is not None}
    best_name = min(met, key=lambda t: met[t]["usd"]) if met else None
    mixed, types = mix["plan"], mix["types"]
    price = {t.name: t.usd_per_replica_hour for t in types}
    mixed_usd = sum(n * price[t] for t, n in mix["replicas"].items())
    mix["source"] = "planner"
    if best_name and met[best_name]["usd"] < mixed_usd - 1e-9:
        # One type alone is a mix too (the program's plan at a prefill share of 1 with that type's rates): where the
        # grid's cheapest plan meeting the SLO costs more, the optimum at the SLO is the single type.
        mix |= {"replicas": {best_name: met[best_name]["replicas"]}, "source": "single_type"}
        mix["shares"] = {b.name: {best_name: 1.0} for b in buckets if b.rate_rps > 0}
        mixed_usd = met[best_name]["usd"]
    attainment = check(mix["replicas"], mix["shares"])
    attainment_short, short = best_one_short(mix, types, check)
    # The routers a mixed fleet can run, on the planner's default plan (the fleet docs/algorithms.md's routing
    # section describes, with the figures its routers read).
    seed, requests = check.runs[0]
    default_attainment = check(default.replicas, default.shares)
    routing = mixed_fleet_routing(
        default.replicas, default.shares, default_types, engines, buckets, requests, seed=seed,
        plan_attainment=simulate(default.replicas, default.shares, requests, seed=seed),
    )  # fmt: skip
    best_usd = met[best_name]["usd"] if best_name else None
    ratio = round(mixed_usd / best_usd, 4) if best_usd else None
    progress(
        f"{name}: mix {mix['replicas']} ${mixed_usd:.2f}/h at SLO {attainment:.4f} ({mix['source']}; the grid's at "
        f"share {mix['share']}, headroom {mix['headroom']}; one short {attainment_short:.4f}); each type alone at "
        f"{TARGET:.0%}: "
        + ", ".join(f"{t} {r['replicas']} (${r.get('usd', 0):.2f}/h)" for t, r in singles.items())
        + f"; mix / best single ({best_name}) {ratio}; {check.requests} requests over seeds {list(seeds)}"
    )
    return {
        "best_single_type": best_name,
        "best_single_type_replicas": {best_name: met[best_name]["replicas"]} if best_name else {},
        "best_single_type_usd": best_usd,
        "best_single_type_slo_attainment": met[best_name]["slo_attainment"] if best_name else None,
        "single_types": singles,
        "mixed_vs_best_single": ratio,
        "milp_optimum_vs_single": milp_optimum_vs_single(buckets, engines),
        "single_type": default_name,
        "single_type_replicas": default_single.replicas,
        "single_type_usd": round(default_single.usd_per_hour, 3),
        "mixed_replicas": mix["replicas"],
        "mixed_usd": round(mixed_usd, 3),
        "mixed_vs_single": round(mixed_usd / default_single.usd_per_hour, 4),
        "mixed_source": mix["source"],
        "mixed_ttft_share": mix["share"],
        "mixed_headroom": mix["headroom"],
        "slo_attainment": round(attainment, 4),
        "one_removed_replicas": short,
        "one_removed_attainment": round(attainment_short, 4),
        "planner_default": {
            "replicas": default.replicas,
            "usd": round(default.usd_per_hour, 3),
            "slo_attainment": round(default_attainment, 4),
        },  # fmt: skip
        "goal_met": bool(ratio is not None and ratio <= 0.8 and attainment >= TARGET),
        "requests": check.requests,
        "seeds": list(seeds),
        "solve_s": round(solve_s, 3),
        "routing": routing,
        "why": mixed.why,
    }


def mixed_fleet_routing(
    replicas, plan_shares, types, engines, buckets, requests, *, seed: int, plan_attainment: float
) -> dict:
    """SLO attainment of the mixed plan's fleet (``replicas``, routed by ``plan_shares``) under three routers (docs/algorithms.md#routing-a-mixed-fleet):
    ``plan`` (knows each request's bucket and the plan's shares: the reference a router can reach on this fleet),
    ``cost_aware`` (``gateway.routing.cost_aware``: request sizes only, with the plan's shares and the planner's
    per-type figures), ``cheapest_first`` (the same router without the shares: greedy by cost per request) and
    ``least_request`` (blind to cost and size, as a plain load balancer in front of a mixed pool)."""
    figures = {}
    for t in types:
        fits = {b.name: bucket_fit(engines[t.name], b, SLO) for b in buckets}
        figures[t.name] = TypeFigures(
            usd_per_hour=t.usd_per_replica_hour,
            batch={name: batch for name, (batch, _rate) in fits.items()},
            rate_rps={name: rate for name, (_batch, rate) in fits.items()},
        )
    sizes = [SizeBucket(b.name, b.prompt_tokens, b.output_tokens) for b in buckets]
    cost_aware, greedy = (
        simulate(
            replicas,
            None,
            requests,
            seed=seed,
            router=lambda replica_types, shares=shares: CostAwareRouter(replica_types, figures, sizes, shares),
        )
        for shares in (plan_shares, None)
    )
    blind = simulate(replicas, None, requests, seed=seed, router=lambda replica_types: LeastRequestRouter(seed=seed))
    return {
        "plan": round(plan_attainment, 4),
        "cost_aware": round(cost_aware, 4),
        "cheapest_first": round(greedy, 4),
        "least_request": round(blind, 4),
    }


def run(
    *, quick: bool = False, plot: str | None = None, live: bool = False, progress=print, held_out: bool = False, **opts
) -> dict:
    duration_s = float(opts.pop("duration_s", 30.0 if quick else 180.0))
    seeds = (int(opts.pop("seed")),) if "seed" in opts else protocol.seeds_for("economics", held_out=held_out)
    grid = {
        "shares_grid": tuple(float(v) for v in str(opts.pop("ttft_shares", "")).split(",") if v) or TTFT_SHARES,
        "headrooms": tuple(float(v) for v in str(opts.pop("headrooms", "")).split(",") if v) or HEADROOMS,
    }
    figures = {
        name: evaluate(name, buckets, duration_s=duration_s, seeds=seeds, grid=grid, progress=progress)
        for name, buckets in WORKLOADS.items()
    }
    # The spot day: the set's last seed draws it and runs it (training: seed 1, the day today's figures are on).
    opts.setdefault("trace_seed", str(seeds[-1]))
    try:
        spot = economics_spot.evaluate(quick=quick, seed=seeds[-1], progress=progress, opts=opts)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    return {
        "bench": "economics",
        "quick": quick,
        "held_out": held_out,
        "seeds": list(seeds),
        "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s},
        "target": TARGET,
        "duration_s": duration_s,
        "workloads": figures,
        "spot": spot,
        "goals_met": {
            **{f"{name}_mix_20pct_cheaper": figures[name]["goal_met"] for name in ("short_chat", "mixed")},
            "spot_30pct_cheaper_at_slo": bool(
                spot["savings_vs_on_demand_at_slo"] >= 0.3
                and spot["on_demand_at_slo"]["met"]
                and spot["with_spot_at_slo"]["met"]
            ),
        },
    }
