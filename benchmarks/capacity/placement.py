"""``bench placement``: replicas bigger than one GPU placed on a cluster of interconnect domains, under four
policies and two oracles (placement, docs/placement.md).

The cluster: 8 HGX nodes (8 GPUs each, one NVLink domain per node) and one NVL72 rack (18 nodes of 4 GPUs, one
domain): 136 GPUs. The stream: 24 endpoints with tensor-parallel sizes 1, 2, 4 and 8, and one multi-node endpoint of
16 GPUs (which only the rack holds, as 4 whole nodes; one replica at least), each scaling up and down on a 60 s autoscaler tick at the real
time scale (event time in seconds; a replica lives from its scale-up to the scale-down that removes it, minutes to
hours). Each endpoint's replica count follows a diurnal curve of its own phase with AR(1) noise; the endpoints' mean
GPUs are scaled so that demand averages ``demand`` (0.9) of the cluster, above it at the peaks. A scale-down withdraws
the endpoint's newest replica, placed or still waiting. The stream is the same for every policy.

Policies: ``naive`` (each rank of a replica takes a free GPU in turn; a replica starts once it holds its group),
``gang`` (all or nothing, first fit, no topology), ``infercap`` (all or nothing inside one domain, best fit keeping
whole nodes and the rack free, equal shares on rack nodes for a group no node holds, with the defragmenting step:
a few TP-1 replicas moved, make-before-break, to open room for a group that has waited; ``--opt defrag=0``: best fit
alone), ``bound`` (the oracle: the whole stream scheduled on the
cluster relaxed to one pool, with no topology and no fragmentation; ``fluid_gpu_allocation`` is the ceiling
min(cluster, demand) no policy passes), and ``repack`` (the ceiling that keeps the topology: domains and gangs as infercap keeps them, but every
running replica may be re-placed from scratch whenever the scheduler looks, free; ``repacks`` and ``moved`` in its
detail count what that migration would cost). Every policy serves waiting replicas in arrival order and starts any
that fits (backfill).

Last line keys: ``placement.<policy>.{deadlocks,gpu_allocation,groups_across_domains,pending_p99_s}`` (allocation:
GPU-seconds served over GPU-seconds asked for; pending: seconds from scale-up to start, or to withdrawal; its p99 over all seeds' replicas together), then
``placement.<policy>.detail`` (per seed), ``placement.infercap.pending_p99_vs_repack``,
``placement.repack.pending_p99_vs_bound``, ``placement.goals``, ``placement.setup``, ``placement.seeds``,
``placement.seed_set``, ``placement.wall_s``, each policy's ``pending_max_s_by_size`` (worst wait per size, all
seeds) and the step's cost: ``placement.infercap.{moves,moves_per_hour,copy_gpu_h,reserved_gpu_h,
lost_serving_gpu_h}``. Options
(``--opt``): ``hours`` of stream (12 quick, 48 full), ``demand`` (0.9), ``seeds`` (training seeds unless
``--held-out``), ``defrag`` (1), ``defrag_wait_s``, ``move_load_s``, ``defrag_moves_per_plan``,
``defrag_moves_per_hour``, ``defrag_max_moved_gpus`` (``DefragConfig``'s defaults), ``move``
(``make_before_break``, or ``break_before_make``: the source freed at once, its serving lost during the load).
"""

from __future__ import annotations

import math
import random
import time

from benchmarks import protocol
from capacity.percentiles import percentile
from placement.cluster import hgx_nodes, rack
from placement.defrag import DefragConfig
from placement.policies import POLICIES
from simulator.placement.defrag_replay import defrag_replay
from simulator.placement.repack import repack_replay
from simulator.placement.replay import Request, fluid_allocation, replay

HELD_OUT = True
SMOKE = {"hours": "1"}
TICK_S = 60.0
DAY_S = 86_400.0
TP_SIZES = (1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 4, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8)
MULTI_NODE_GPUS = 16
COMMON_SWING = 0.1  # the day all endpoints share (their users' daytime), as a fraction of their mean
OWN_SWING = 0.2  # each endpoint's own diurnal swing, of a random phase
DRAIN_S = (5.0, 60.0)  # a removed replica finishes its streams before its GPUs are free
BENCH_POLICIES = (*POLICIES, "repack")  # repack: the ceiling that keeps the topology (simulator/placement/repack.py)


def cluster_nodes():
    return hgx_nodes(8) + rack("nvl72-a", nodes=18, gpus=4)


def stream(*, seed: int, hours: float, demand: float, gpus: int) -> list[Request]:
    """The seed's stream with its endpoints' sizes scaled until the GPUs it asks for average ``demand`` of the
    cluster (three rescalings: the multi-node endpoint's floor of one replica makes demand not quite proportional)."""
    scale = demand * gpus
    for _ in range(3):
        requests = _draw(seed=seed, hours=hours, total_gpus=scale)
        asked = sum(r.size * (r.release_s - r.arrive_s) for r in requests) / (hours * 3600.0)
        scale *= demand * gpus / asked
    return requests


def _draw(*, seed: int, hours: float, total_gpus: float) -> list[Request]:
    """Scale-ups and scale-downs of every endpoint, tick by tick, as replica requests with their release times."""
    rng, drains = random.Random(seed), random.Random(-seed)
    sizes = [*TP_SIZES, MULTI_NODE_GPUS]
    shares = [rng.uniform(0.5, 1.5) for _ in sizes]
    mean_gpus = [total_gpus * s / sum(shares) for s in shares]
    phases = [rng.uniform(0, 2 * math.pi) for _ in sizes]
    noise = [0.0] * len(sizes)
    live: list[list[int]] = [[] for _ in sizes]
    open_at: dict[int, tuple[int, float]] = {}
    requests: list[Request] = []
    horizon_s = hours * 3600.0
    for tick in range(math.ceil(horizon_s / TICK_S)):
        now = tick * TICK_S
        for e, size in enumerate(sizes):
            noise[e] = 0.97 * noise[e] + rng.gauss(0, 0.06)
            day = COMMON_SWING * math.sin(2 * math.pi * now / DAY_S)
            day += OWN_SWING * math.sin(2 * math.pi * now / DAY_S + phases[e])
            want = max(1 if size == MULTI_NODE_GPUS else 0, round(mean_gpus[e] * (1 + day + noise[e]) / size))
            while len(live[e]) < want:
                rid = len(open_at)
                open_at[rid] = (e, now)
                live[e].append(rid)
            while len(live[e]) > want:
                rid = live[e].pop()
                requests.append(_request(rid, open_at[rid], sizes, now + drains.uniform(*DRAIN_S)))
    for e in range(len(sizes)):
        for rid in live[e]:
            requests.append(_request(rid, open_at[rid], sizes, horizon_s))
    return sorted(requests, key=lambda r: r.id)


def _request(rid: int, opened: tuple[int, float], sizes: list[int], release_s: float) -> Request:
    e, arrive_s = opened
    return Request(rid, f"tp{sizes[e]}-{e:02d}", sizes[e], arrive_s, release_s)


def defrag_config(opts: dict) -> DefragConfig | None:
    """The defragmenting step infercap ships with (``--opt defrag=0``: the best fit alone), its knobs as options."""
    if str(opts.get("defrag", "1")) == "0":
        return None
    default = DefragConfig()
    return DefragConfig(
        wait_s=float(opts.get("defrag_wait_s", default.wait_s)),
        load_s=float(opts.get("move_load_s", default.load_s)),
        max_moves_per_plan=int(opts.get("defrag_moves_per_plan", default.max_moves_per_plan)),
        max_moves_per_hour=int(opts.get("defrag_moves_per_hour", default.max_moves_per_hour)),
        max_moved_gpus=int(opts.get("defrag_max_moved_gpus", default.max_moved_gpus)),
        make_before_break=str(opts.get("move", "make_before_break")) != "break_before_make",
    )


def _replay(policy: str, nodes, requests, defrag: DefragConfig | None):
    if policy == "repack":
        return repack_replay(nodes, requests)
    if policy == "infercap" and defrag is not None:
        return defrag_replay(nodes, requests, defrag)
    return replay(nodes, requests, policy)


def run_seed(*, seed: int, hours: float, demand: float, progress, defrag: DefragConfig | None = None) -> dict:
    nodes = cluster_nodes()
    gpus = sum(n.gpus for n in nodes)
    requests = stream(seed=seed, hours=hours, demand=demand, gpus=gpus)
    demanded = sum(r.size * (r.release_s - r.arrive_s) for r in requests)
    out = {
        "seed": seed,
        "requests": len(requests),
        "mean_demand": round(demanded / (gpus * hours * 3600.0), 3),
        "fluid_gpu_allocation": round(fluid_allocation(requests, gpus), 4),
    }
    pending = {}
    for policy in BENCH_POLICIES:
        started = time.perf_counter()
        result = _replay(policy, nodes, requests, defrag)
        out[policy], pending[policy] = result.figures(), result.pending_s
        progress(
            f"seed {seed} {policy}: allocation {out[policy]['gpu_allocation']}, pending p99 "
            f"{out[policy]['pending_p99_s']:.0f} s, deadlocks {out[policy]['deadlocks']}, across domains "
            f"{out[policy]['groups_across_domains']} ({time.perf_counter() - started:.1f} s)"
        )
    return out, pending


def _seeds(opts: dict, *, quick: bool, held_out: bool) -> tuple[int, ...]:
    seeds = protocol.seeds_for("placement", held_out=held_out)
    if "seeds" in opts:
        seeds = tuple(int(s) for s in str(opts["seeds"]).split(","))
        if not held_out and any(protocol.is_held_out("placement", s) for s in seeds):
            raise ValueError("held-out seeds run only with --held-out (benchmarks/protocol.py)")
    return seeds


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, held_out: bool = False, **opts):
    started = time.perf_counter()
    hours = float(opts.get("hours", 12 if quick else 48))
    demand = float(opts.get("demand", 0.9))
    seeds = _seeds(opts, quick=quick, held_out=held_out)
    defrag = defrag_config(opts)
    progress(f"placement: {len(seeds)} seed(s), {hours:g} h of stream each at {demand:.0%} demand; defrag {defrag}")
    runs, pending = zip(
        *(run_seed(seed=s, hours=hours, demand=demand, progress=progress, defrag=defrag) for s in seeds), strict=True
    )
    figures: dict = {}
    for policy in BENCH_POLICIES:
        rows = [r[policy] for r in runs]
        figures[f"placement.{policy}.deadlocks"] = sum(r["deadlocks"] for r in rows)
        figures[f"placement.{policy}.gpu_allocation"] = _mean([r["gpu_allocation"] for r in rows])
        across = [r["groups_across_domains"] for r in rows]
        figures[f"placement.{policy}.groups_across_domains"] = None if None in across else sum(across)
        waits = [w for p in pending for w in p[policy]]
        figures[f"placement.{policy}.pending_p99_s"] = round(percentile(waits, 99), 1) if waits else None
        worst: dict = {}
        for row in rows:
            for size, wait_s in row["pending_max_s_by_size"].items():
                worst[size] = round(max(worst.get(size, 0.0), wait_s), 1)
        figures[f"placement.{policy}.pending_max_s_by_size"] = worst
        figures[f"placement.{policy}.detail"] = rows
    figures.update(_move_costs(runs, hours))
    figures["placement.infercap.pending_p99_vs_repack"] = _ratio(figures, "infercap", "repack")
    figures["placement.repack.pending_p99_vs_bound"] = _ratio(figures, "repack", "bound")
    figures["placement.goals"] = _goals(figures)
    figures["placement.setup"] = {
        "cluster": "8 HGX nodes × 8 GPUs (a domain each) + 1 NVL72 rack (18 nodes × 4 GPUs, one domain)",
        "gpus": sum(n.gpus for n in cluster_nodes()),
        "endpoints": f"{len(TP_SIZES)} with TP {sorted(set(TP_SIZES))} + 1 of {MULTI_NODE_GPUS} GPUs",
        "time_scale": f"real: event time in seconds, a {TICK_S:g} s autoscaler tick, {hours:g} h per seed",
        "demand": demand,
        "runs": [{k: r[k] for k in ("seed", "requests", "mean_demand", "fluid_gpu_allocation")} for r in runs],
    }
    figures["placement.setup"]["defrag"] = vars(defrag) if defrag else None
    figures["placement.seeds"] = list(seeds)
    figures["placement.seed_set"] = "held_out" if held_out else "training"
    figures["placement.wall_s"] = round(time.perf_counter() - started, 1)
    if plot:
        with open(plot, "w") as out:
            out.write(_svg(figures))
    return figures


def _move_costs(runs, hours: float) -> dict:
    """What infercap's defragmenting moves cost over every seed (zeros with ``defrag=0``)."""
    rows = [r["infercap"] for r in runs]
    moves = sum(r.get("moves", 0) for r in rows)
    return {
        "placement.infercap.moves": moves,
        "placement.infercap.moves_per_hour": round(moves / (hours * len(rows)), 2) if rows else None,
        "placement.infercap.copy_gpu_h": round(sum(r.get("copy_gpu_h", 0.0) for r in rows), 2),
        "placement.infercap.reserved_gpu_h": round(sum(r.get("reserved_gpu_h", 0.0) for r in rows), 2),
        "placement.infercap.lost_serving_gpu_h": round(sum(r.get("lost_serving_gpu_h", 0.0) for r in rows), 2),
    }


def _ratio(figures: dict, policy: str, reference: str) -> float | None:
    """One policy's pending p99 over another's (None where the reference waited for nothing)."""
    reference_p99 = figures[f"placement.{reference}.pending_p99_s"]
    return round(figures[f"placement.{policy}.pending_p99_s"] / reference_p99, 3) if reference_p99 else None


def _mean(values):
    return round(sum(values) / len(values), 4) if values else None


def _goals(figures: dict) -> dict:
    """infercap's four goals against naive and the bound (p99 over every seed's replicas together)."""
    get = figures.get
    bound_p99 = get("placement.bound.pending_p99_s") or 0.0
    goals = {
        "no_deadlock_where_naive_deadlocks": get("placement.naive.deadlocks") > 0
        and get("placement.infercap.deadlocks") == 0,
        "no_group_across_domains": get("placement.infercap.groups_across_domains") == 0,
        "allocation_vs_bound": round(
            get("placement.infercap.gpu_allocation") / get("placement.bound.gpu_allocation"), 4
        ),
        "pending_p99_vs_bound": round(get("placement.infercap.pending_p99_s") / bound_p99, 3) if bound_p99 else None,
    }
    goals["allocation_met"] = goals["allocation_vs_bound"] >= 0.95
    goals["pending_met"] = goals["pending_p99_vs_bound"] is not None and goals["pending_p99_vs_bound"] <= 1.2
    goals["all"] = all(goals[k] for k in ("no_deadlock_where_naive_deadlocks", "no_group_across_domains",
                                          "allocation_met", "pending_met"))  # fmt: skip
    return goals


def _svg(figures: dict) -> str:
    """Per policy: GPU allocation (bar, left scale) and pending p99 relative to the bound's (bar, right)."""
    colors = {"naive": "#c44e52", "gang": "#8172b2", "infercap": "#55a868", "bound": "#4c72b0", "repack": "#937860"}
    bound_p99 = figures["placement.bound.pending_p99_s"] or 1.0
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="690" height="280" font-size="11">']
    parts.append('<text x="10" y="15">GPU allocation (left) and pending p99 ÷ bound (right), per policy</text>')
    for i, policy in enumerate(BENCH_POLICIES):
        allocation = figures[f"placement.{policy}.gpu_allocation"] or 0.0
        ratio = (figures[f"placement.{policy}.pending_p99_s"] or 0.0) / bound_p99
        for j, (value, label) in enumerate(
            ((allocation, f"{allocation:.3f}"), (min(ratio / 5, 1.0), f"{ratio:.2f}×"))
        ):
            x, h = 40 + i * 130 + j * 44, 200 * value
            fill = colors[policy] if j == 0 else "#bbb"
            parts.append(f'<rect x="{x}" y="{240 - h:.1f}" width="40" height="{h:.1f}" fill="{fill}"/>')
            parts.append(f'<text x="{x}" y="{235 - h:.1f}">{label}</text>')
        parts.append(f'<text x="{40 + i * 130}" y="258">{policy}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
