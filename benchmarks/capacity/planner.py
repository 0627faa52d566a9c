"""``bench planner``: (a) docs/algorithms.md#the-worked-example figure by figure; (b) planner vs simulation: for three
workloads the planner's N_base from a throughput table the benchmark sweep measured on the simulator, then the
discrete-event simulator at N_base and N_base − 1 (the SLO should hold at N_base and fail below); (c) the
model-unit fit's relative error on held-out shapes (``--live``: over HTTP against a simulated replica process).

Options (``--opt``): ``duration_s`` (each simulated run; 180 quick, 900 full), ``table_requests`` (closed-loop
requests per stream of the throughput table; 4 quick, 8 full), ``fit_requests`` (per stream of the fit's sweep; 20).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from benchmarks.capacity.plot import agreement_svg
from capacity.hardware.profiles import get_profile
from capacity.planning.barriers import (
    SLO,
    WORKED_EXAMPLE,
    Hardware,
    ModelShape,
    ThroughputRow,
    Workload,
    plan,
    spike_scenario,
)
from capacity.replica_benchmark.http_driver import HttpReplicaDriver
from capacity.replica_benchmark.sweep import Shape, SweepConfig, measure_table, run_sweep
from capacity.services import QUICK_SWEEP
from gateway.admission import CLASSES
from gateway.routing.registry import make_router
from simulator import workloads as sim_workloads
from simulator.admission import ProxyAdmission
from simulator.des import Simulation
from simulator.process import start_replica
from simulator.replica_driver import EngineDriver

# (name, reference figure, tolerance: the source rounds; None = exact)
REFERENCE = [
    ("kv_tok_bytes", 163_840, None),
    ("m_kv_gb", 44, None),
    ("kv_tokens_total", 268_000, 0.01),
    ("b_max", 64, None),
    ("w_s", 4.7, 0.01),
    ("l_in_flight", 94, 0.01),
    ("n_mem", 1, None),
    ("n_thr", 2, None),
    ("n_lat", 2, None),
    ("n_base", 2, None),
    ("rho_at_n_base", 0.69, 0.01),
    ("n_with_headroom", 3, None),
    ("usd_per_1m_b64", 0.16, 0.005 / 0.16),
    ("usd_per_1m_b16", 0.41, 0.005 / 0.41),
    ("spike_replicas", 6, None),
    ("spike_backlog_tokens", 445_500, 0.002),
    ("spike_backlog_requests", 1_485, 0.002),
    ("spike_backlog_tokens_at_14_5_req_s", 445_500, None),
]


def worked_example() -> tuple[dict, list[dict]]:
    result = plan(**WORKED_EXAMPLE)
    figures = {
        "kv_tok_bytes": result.kv_tok_bytes,
        "m_kv_gb": result.m_kv_gb,
        "kv_tokens_total": round(result.kv_tokens_total),
        "b_max": result.b_max,
        "w_s": round(result.w_s, 3),
        "l_in_flight": round(result.l_in_flight, 2),
        "n_mem": result.n_mem,
        "n_thr": result.n_thr,
        "n_lat": result.n_lat,
        "n_base": result.n_base,
        "n_with_headroom": result.n_with_headroom,
        "rho_at_n_base": round(result.rho_at_n_base, 4),
        "usd_per_1m_b64": round(result.usd_per_1m_tokens_by_batch[64], 4),
        "usd_per_1m_b16": round(result.usd_per_1m_tokens_by_batch[16], 4),
        "spike_replicas": result.spike.replicas_needed,
        "spike_backlog_tokens": round(result.spike.backlog_tokens),
        "spike_backlog_requests": round(result.spike.backlog_requests, 1),
        # The source rounds a replica's 4,352 / 300 = 14.507 req/s to 14.5; the same formula then gives its figure.
        "spike_backlog_tokens_at_14_5_req_s": round(
            spike_scenario(
                spike=WORKED_EXAMPLE["spike"],
                arrival_rate_per_s=WORKED_EXAMPLE["workload"].arrival_rate_per_s,
                output_tokens=WORKED_EXAMPLE["workload"].output_tokens,
                t_dec_tok_s=result.t_dec_tok_s,
                replicas_before=result.n_with_headroom,
                replica_req_s=14.5,
            ).backlog_tokens
        ),
        "binding_barriers": result.binding_barriers,
    }
    checks = []
    for name, reference, tolerance in REFERENCE:
        ours = figures[name]
        ok = ours == reference if tolerance is None else abs(ours - reference) <= tolerance * abs(reference)
        checks.append({"figure": name, "reference": reference, "ours": ours, "matches": ok})
    return figures, checks


@dataclass(frozen=True)
class SimWorkload:
    name: str
    rate_per_s: float
    input_tokens: int
    output_tokens: int
    min_stream_tok_s: float
    ttft_slo_s: float = 2.0


# --smoke: the simulated runs 30 s instead of 180, the throughput table and the fit's sweep from fewer requests.
SMOKE = {"duration_s": "30", "table_requests": "3", "fit_requests": "6"}

WORKLOADS = (
    SimWorkload("chat 512/128 at 16 req/s", 16.0, 512, 128, 40.0),
    SimWorkload("long output 256/512 at 10 req/s", 10.0, 256, 512, 30.0),
    SimWorkload("RAG 2048/128 at 6 req/s", 6.0, 2048, 128, 30.0),
)
TABLE_LEVELS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
PROFILE = "llama-13b-a100"
# The profile's model and GPU, the worked example's 13B on 80 GB (docs/algorithms.md): the memory barrier's inputs.
MODEL = ModelShape(n_layers=40, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=26.0)
HARDWARE = Hardware(gpu_memory_gb=80.0, overhead_gb=10.0, gpus_per_replica=1, usd_per_gpu_hour=2.5)


def simulate(workload: SimWorkload, replicas: int, b_max: int, duration_s: float, seed: int) -> dict:
    """The DES at ``replicas`` replicas, each limited to B_max concurrent requests. The proxy's admission queues the
    rest, here with no age limit and room for every request: the planner sizes for a queue that drains, not sheds."""
    if replicas < 1:
        return {"replicas": replicas, "slo_met": False, "reason": "no replica"}
    sim = Simulation(
        router=make_router("least_request", seed=seed),  # ties are broken at random: seeded, so runs repeat
        replicas=replicas,
        profile=PROFILE,
        admission=ProxyAdmission(max_queue=100_000, max_age_s=dict.fromkeys(CLASSES, math.inf)),
        concurrency_limit=b_max,
        seed=seed,
    )
    times = sim_workloads.poisson_times(workload.rate_per_s, duration_s=duration_s, seed=seed)
    requests = sim_workloads.uniform(
        times=times, prompt_tokens=workload.input_tokens, output_tokens=workload.output_tokens, seed=seed
    )
    result = sim.run(requests)
    tpot_slo = 1.0 / workload.min_stream_tok_s
    ttft_p95 = result.percentile("ttft_s", 95)
    tpot_p50 = result.percentile("tpot_s", 50)
    unserved = 1.0 - len(result.completed()) / max(1, len(result.requests))
    # The same statistics the sweep chose B_max with: median stream rate, TTFT p95; and nothing left behind.
    met = (
        ttft_p95 is not None
        and ttft_p95 <= workload.ttft_slo_s
        and tpot_p50 is not None
        and tpot_p50 <= tpot_slo
        and unserved <= 0.01
    )
    return {
        "replicas": replicas,
        "slo_met": met,
        "ttft_p95_s": round(ttft_p95, 3) if ttft_p95 is not None else None,
        "tpot_p50_ms": round(1000 * tpot_p50, 2) if tpot_p50 is not None else None,
        "attainment": round(result.slo_attainment(ttft_s=workload.ttft_slo_s, tpot_s=tpot_slo), 4),
        "unserved": round(unserved, 4),
        "requests": len(result.requests),
    }


def sim_agreement(workload: SimWorkload, *, quick: bool, progress, opts: dict | None = None) -> dict:
    opts = opts or {}
    driver = EngineDriver(get_profile(PROFILE))
    shape = Shape(workload.input_tokens, workload.output_tokens)
    per_stream = int(opts.get("table_requests", 4 if quick else 8))
    table = measure_table(driver, shape, TABLE_LEVELS, requests_per_stream=per_stream)
    rows = [
        ThroughputRow(
            batch=s.concurrency,
            per_stream_tok_s=s.per_stream_tok_s or 0.0,
            aggregate_tok_s=s.aggregate_tok_s,
            ttft_p50_s=s.ttft_p50_s,
            ttft_p95_s=s.ttft_p95_s,
        )
        for s in table
        if s.per_stream_tok_s
    ]
    result = plan(
        model=MODEL,
        hardware=HARDWARE,
        workload=Workload(workload.rate_per_s, workload.input_tokens, workload.output_tokens),
        slo=SLO(min_stream_tok_s=workload.min_stream_tok_s, ttft_s=workload.ttft_slo_s),
        throughput_table=rows,
    )
    if not result.feasible:
        return {"workload": workload.name, "n_base": None, "explanation": result.explanation}
    duration = float(opts.get("duration_s", 180.0 if quick else 900.0))
    at_n = simulate(workload, result.n_base, result.b_max, duration, seed=1)
    below = simulate(workload, result.n_base - 1, result.b_max, duration, seed=1)
    progress(
        f"{workload.name}: B_max {result.b_max}, N_base {result.n_base} ({', '.join(result.binding_barriers)}), "
        f"ρ {result.rho_at_n_base:.2f} → SLO at N_base {'met' if at_n['slo_met'] else 'MISSED'}, "
        f"at N_base−1 {'met' if below['slo_met'] else 'missed'}"
    )
    off_by = 0
    if not at_n["slo_met"]:
        off_by = _replicas_needed(workload, result.n_base, result.b_max, duration) - result.n_base
    elif below["slo_met"]:
        off_by = -_replicas_spare(workload, result.n_base, result.b_max, duration)
    return {
        "workload": workload.name,
        "n_base": result.n_base,
        "b_max": result.b_max,
        "binding": result.binding_barriers,
        "rho_at_n_base": round(result.rho_at_n_base, 3),
        "erlang_c_wait_ms": round(1000 * result.queue_wait_s_at_n_base, 2)
        if math.isfinite(result.queue_wait_s_at_n_base)
        else None,
        "slo_met_at_n_base": at_n["slo_met"],
        "slo_met_at_n_base_minus_1": below["slo_met"],
        "planner_off_by_replicas": off_by,
        "at_n_base": at_n,
        "at_n_base_minus_1": below,
    }


def _replicas_needed(workload, n_base, b_max, duration, limit=8) -> int:
    for n in range(n_base + 1, n_base + limit):
        if simulate(workload, n, b_max, duration, seed=1)["slo_met"]:
            return n
    return n_base + limit


def _replicas_spare(workload, n_base, b_max, duration) -> int:
    n = n_base - 1
    while n > 1 and simulate(workload, n - 1, b_max, duration, seed=1)["slo_met"]:
        n -= 1
    return n_base - n


def fit_error(*, quick: bool, live: bool, progress, opts: dict | None = None) -> dict:
    opts = opts or {}
    profile = get_profile(PROFILE)
    # 30 tok/s per stream: the 13B profile's roofline caps a stream at 78 tok/s (60 at batch 1 with its efficiency),
    # so 60 tok/s would leave no batch to fit at.
    cfg = SweepConfig(
        tpot_slo_ms=1000 / 30, ttft_slo_ms=2000, requests_per_stream=int(opts.get("fit_requests", 6 if live else 20))
    )
    if live:
        cfg = SweepConfig(tpot_slo_ms=1000 / 30, ttft_slo_ms=2000, **QUICK_SWEEP)
        with start_replica(profile=PROFILE, speed=1.0) as replica:
            result = run_sweep(HttpReplicaDriver(replica.url), cfg, progress)
    else:
        result = run_sweep(EngineDriver(profile), cfg)
    fit = result["fit"]
    progress(f"MU fit ({result['driver']}): held-out relative error {fit['held_out_relative_error']:.3f}")
    return {
        "driver": result["driver"],
        "b_max": result["b_max"],
        "alpha": round(fit["alpha"], 6),
        "alpha_cached": round(fit["alpha_cached"], 6),
        "beta": round(fit["beta"], 6),
        "gamma": round(fit["gamma"], 6),
        "mu_per_min": round(result["mu_per_min"], 1),
        "held_out_relative_error": round(fit["held_out_relative_error"], 4),
        "held_out_max_relative_error": round(fit["held_out_max_relative_error"], 4),
    }


def run(*, quick: bool = False, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    started = time.perf_counter()
    figures, checks = worked_example()
    mismatches = [c["figure"] for c in checks if not c["matches"]]
    progress(f"worked example: {len(checks) - len(mismatches)}/{len(checks)} figures match" + (
        f" (off: {', '.join(mismatches)})" if mismatches else ""))  # fmt: skip
    agreement = [sim_agreement(w, quick=quick, progress=progress, opts=opts) for w in WORKLOADS]
    fit = fit_error(quick=quick, live=live, progress=progress, opts=opts)
    if plot:
        with open(plot, "w") as handle:
            handle.write(agreement_svg(agreement))
        progress(f"wrote {plot}")
    return {
        "worked_example": {k: v for k, v in figures.items() if k != "binding_barriers"},
        "worked_example_checks": checks,
        "sim_agreement": [
            {k: a.get(k) for k in ("workload", "n_base", "slo_met_at_n_base", "slo_met_at_n_base_minus_1")}
            | {k: a.get(k) for k in ("b_max", "rho_at_n_base", "planner_off_by_replicas", "binding")}
            for a in agreement
        ],
        "sim_detail": agreement,
        "fit_error": fit["held_out_relative_error"],
        "fit": fit,
        "seconds": round(time.perf_counter() - started, 1),
    }
