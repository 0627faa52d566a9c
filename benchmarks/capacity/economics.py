"""``bench economics``: the heterogeneous planner's cheapest mix against the best single GPU type, on three workload
mixes, each plan checked in the discrete-event simulator (docs/algorithms.md#the-heterogeneous-planner).

The model is Llama 3.1 8B on the simulator's roofline profiles of one L40S, one A100 80 GB and one H100
(``capacity/hardware/profiles.py``). Prices are public on-demand list prices per GPU-hour (AWS, us-east-1,
2024 list, Linux): g6e.xlarge (1 × L40S) $1.861/h; p4de.24xlarge (8 × A100 80 GB) $40.966/h → $5.12 per GPU;
p5.48xlarge (8 × H100) $98.32/h → $12.29 per GPU. SLO: TTFT ≤ 1 s, TPOT ≤ 50 ms (Mélange's conversational TPOT
scale). Each plan is simulated for a few minutes of Poisson arrivals per bucket; ``slo_attainment`` is the share of
requests within both SLOs on the mixed plan; ``one_removed_attainment`` is the best of the same with the mix one
replica short, of each type in turn (the plan is tight: each should miss).

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

from benchmarks.capacity import economics_spot
from capacity.hardware.profiles import get_profile
from capacity.planning.mix import Bucket, ReplicaType, Slo, best_single_type, bucket_fit, plan_mix, with_capacities
from capacity.planning.presets import WORKLOADS
from gateway.routing.base import ReplicaView, RouteRequest
from gateway.routing.baselines import LeastRequestRouter
from gateway.routing.cost_aware import CostAwareRouter, SizeBucket, TypeFigures
from simulator.des import Simulation, VirtualClock
from simulator.workloads import SimRequest, filler_text, poisson_times

SLO = Slo(ttft_s=1.0, tpot_s=0.05)
# --smoke: 5 s of arrivals per plan; the spot section on the shortest days, at a tenth of its peak, one history day.
SMOKE = {"duration_s": "5", "period_s": "1200", "peak_rps": "2", "history_days": "1", "tuning_days": "1"}
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


def one_removed(plan) -> list[dict[str, int]]:
    """The mix one replica short, once per replica type it uses."""
    out = []
    for name in sorted(plan.replicas):
        fewer = dict(plan.replicas)
        fewer[name] -= 1
        out.append({k: v for k, v in fewer.items() if v > 0})
    return out


def types_serve(types, bucket: str, name: str) -> bool:
    return any(t.name == name and t.capacity_rps.get(bucket, 0.0) > 0 for t in types)


def evaluate(name: str, buckets: list[Bucket], *, duration_s: float, seed: int, progress) -> dict:
    engines = {t: get_profile(profile) for t, profile in ENGINES.items()}
    types = with_capacities(TYPES, engines, buckets, SLO)
    started = time.perf_counter()
    mixed = plan_mix(buckets, types)
    single_name, single = best_single_type(buckets, types)
    solve_s = time.perf_counter() - started
    requests = workload(buckets, duration_s=duration_s, seed=seed)
    attainment = simulate(mixed.replicas, mixed.shares, requests, seed=seed)
    # One replica short, of each type in turn (its share of the load moves to the type's other replicas; a type
    # left with none has its buckets' load moved to the types that remain): the best of these must still miss.
    shorts = []
    for short in one_removed(mixed):
        shares = {
            b: {t: s for t, s in row.items() if t in short} or {t: 1.0 for t in short if types_serve(types, b, t)}
            for b, row in mixed.shares.items()
        }
        shorts.append((simulate(short, shares, requests, seed=seed), short))
    attainment_short, short = max(shorts, key=lambda item: item[0])
    single_attainment = simulate(single.replicas, single.shares, requests, seed=seed)
    routing = mixed_fleet_routing(mixed, types, engines, buckets, requests, seed=seed, plan_attainment=attainment)
    progress(
        f"{name}: mixed {mixed.replicas} ${mixed.usd_per_hour:.2f}/h (SLO {attainment:.4f}, one short "
        f"{attainment_short:.4f}); best single {single.replicas} ${single.usd_per_hour:.2f}/h (SLO "
        f"{single_attainment:.4f}); {len(requests)} requests; the mix routed by request size and cost "
        f"{routing['cost_aware']:.4f}, cheapest first {routing['cheapest_first']:.4f}, by least requests "
        f"{routing['least_request']:.4f}"
    )
    return {
        "single_type": single_name,
        "single_type_replicas": single.replicas,
        "single_type_usd": round(single.usd_per_hour, 3),
        "single_type_slo_attainment": round(single_attainment, 4),
        "mixed_replicas": mixed.replicas,
        "mixed_usd": round(mixed.usd_per_hour, 3),
        "mixed_vs_single": round(mixed.usd_per_hour / single.usd_per_hour, 4),
        "slo_attainment": round(attainment, 4),
        "one_removed_replicas": short,
        "one_removed_attainment": round(attainment_short, 4),
        "requests": len(requests),
        "solve_s": round(solve_s, 3),
        "routing": routing,
        "why": mixed.why,
    }


def mixed_fleet_routing(mixed, types, engines, buckets, requests, *, seed: int, plan_attainment: float) -> dict:
    """SLO attainment of the mixed plan's fleet under three routers (docs/algorithms.md#routing-a-mixed-fleet):
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
            mixed.replicas,
            None,
            requests,
            seed=seed,
            router=lambda replica_types, shares=shares: CostAwareRouter(replica_types, figures, sizes, shares),
        )
        for shares in (mixed.shares, None)
    )
    blind = simulate(
        mixed.replicas, None, requests, seed=seed, router=lambda replica_types: LeastRequestRouter(seed=seed)
    )
    return {
        "plan": round(plan_attainment, 4),
        "cost_aware": round(cost_aware, 4),
        "cheapest_first": round(greedy, 4),
        "least_request": round(blind, 4),
    }


def run(*, quick: bool = False, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    duration_s = float(opts.pop("duration_s", 30.0 if quick else 180.0))
    seed = int(opts.pop("seed", 1))
    figures = {
        name: evaluate(name, buckets, duration_s=duration_s, seed=seed, progress=progress)
        for name, buckets in WORKLOADS.items()
    }
    try:
        spot = economics_spot.evaluate(quick=quick, seed=seed, progress=progress, opts=opts)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    return {
        "bench": "economics",
        "quick": quick,
        "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s},
        "duration_s": duration_s,
        "workloads": figures,
        "spot": spot,
    }
