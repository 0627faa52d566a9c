"""``bench autoscale``: static peak, HPA-like, KPA-like and our two-axis autoscaler on the bursty trace.

Every policy drives the shared discrete-event engine simulator (``endpoints.runtimes.sim.des``, the engine the routing
bench and the simulator use) through ``capacity.autoscaling.sim_adapter``: ``llama-13b-a100`` replicas
(docs/algorithms.md#simulator-engine-profiles: A100 prefill at 6,000 tok/s with chunked prefill stalling decode, decode
step 7.45 ms + 0.105 ms per sequence), a cold start drawn from 60–120 s per replica, least-request routing, the proxy's
own admission (``endpoints.runtimes.sim.admission.ProxyAdmission`` over ``endpoints.admission``, with the production
defaults: a 512-request queue, 429 after the class's max queue age, Retry-After from the measured drain rate),
chat-shaped requests (prompts 200–800 tokens, outputs 100–500, means 500 / 300,
docs/algorithms.md#the-reference-request) priced in MU with the model profile's default coefficients, and the Endpoint
model's default SLO (TTFT ≤ 2 s, TPOT ≤ 100 ms). The requests are ``critical`` (shed after 30 s queued, the wait this
bench has always allowed); ``--opt priority_class=standard`` sheds after 10 s instead, which starves the baselines'
queue-driven demand signal: in the quick run HPA-like and KPA-like then scale to ~30 replicas instead of 60 and shed
14-17% of requests, and KPA-like holds 2.5% fewer GPU-hours than ours at half its SLO attainment. Static peak holds enough replicas for the trace's peak
rate at the baselines' 64-sequence limit and 0.7 utilization (a replica then serves ~5.8 req/s, prefill stalls
included; see ``sim_adapter.engine_seconds_per_request``). Sized with the decode-only in-flight time (3.9 s instead of
7.7 s at 44.8 sequences: at 6,000 tok/s a loaded replica spends ~45% of its time in prefill), static peak gets 8
replicas instead of 14 and meets the SLO for only 78% of requests: that, and a trace whose spikes reached ~270 req/s
(sized for an H100-class prefill), is why every policy missed the SLO on this engine. Speed: ~8,000 simulated requests
per wall second on a few replicas, ~4,000 with 15 or more (every dispatch builds one routing view per replica);
``sim_requests_per_wall_s`` reports it per run.

The trace is one compressed "day" (quick: 3 h, full: 8 h) of the bursty shape: diurnal cycle, three 10× spikes
within 3 s, near-zero night. The spikes repeat at the same hour every day. Ours (``infercap``) gets a history day:
its predictive floor records only request arrivals (independent of any policy), so the previous day's arrivals
(another Poisson draw of the same rate) are fed to it before the scored day instead of being simulated.
``infercap_reactive`` is ours without the predictive floor, to show what the floor contributes. A second run on a
steady load counts flaps (scale-downs within 5 min of a scale-up). The full run adds
``crosscheck_fleetsim``: the same comparison on the autoscaler's own, cheaper fleet model (``fleetsim``,
H100-class prefill), kept only as a cross-check of the engine-simulator figures.
"""

import math
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor

from django.core.management.base import CommandError

from capacity.autoscaling import predictive
from capacity.autoscaling.baselines import HpaLikePolicy, KpaLikePolicy, StaticPolicy
from capacity.autoscaling.fleetsim import FleetSim, SimConfig, count_flaps, generate_requests
from capacity.autoscaling.sim_adapter import EngineSimAutoscaler, engine_seconds_per_request
from capacity.autoscaling.traces import BurstyTrace
from capacity.autoscaling.two_axis import InfercapPolicy
from capacity.units import MUCoefficients, estimate_request_mu
from endpoints.admission import CLASSES, CRITICAL, DEFAULT_MAX_AGE_S, DEFAULT_MAX_QUEUE
from endpoints.routing.baselines import LeastRequestRouter
from endpoints.runtimes.sim import workloads
from endpoints.runtimes.sim.admission import ProxyAdmission
from endpoints.runtimes.sim.des import Simulation
from endpoints.runtimes.sim.profiles import get_profile

POLICIES = ("static_peak", "hpa", "kpa", "infercap")
REACTIVE = "infercap_reactive"  # ours without the predictive floor: always reported, next to the four
ABLATIONS = ("infercap_no_vertical",)  # ``--opt ablations=1``; on in the full run
PROFILE = "llama-13b-a100"
SLO = {"ttft_s": 2.0, "tpot_s": 0.1}  # endpoints.models.Endpoint defaults: ttft_slo_ms 2000, tpot_slo_ms 100
COLD_START_S = (60.0, 120.0)
PROMPT_TOKENS, OUTPUT_TOKENS = (200, 800), (100, 500)
REFERENCE = (500, 300)  # the request shape the concurrency limit is set for (docs/algorithms.md#the-reference-request)
# The model profile's default MU coefficients (capacity.models.ModelProfile): 500 in / 300 out = 3.55 MU.
COEFFS = MUCoefficients(alpha=0.001, alpha_cached=0.0001, beta=0.01, gamma=0.05, mu_per_min=1000.0)


def _options(quick: bool, opts: dict) -> dict:
    o = {
        # A compressed day: 3 h quick, 8 h full (``--opt period_s=86400`` for a real one, ~10 min). Each spike costs
        # ours ~13 min of spike-sized capacity (cold-start lead, the spike, the 5-min scale-down window, bounded
        # steps down), so the shorter the day the smaller the savings: 1 h gives ~69%, 2 h ~80%, 3 h ~82%, 4 h ~84%.
        "period_s": 10_800.0 if quick else 28_800.0,
        "peak_rps": 10.0,
        "night_rps": 0.2,
        "steady_rps": 4.0,
        "steady_s": 900.0 if quick else 3600.0,
        "concurrency_limit": 64,
        "concurrency_max": 256,
        "max_replicas": 60,
        "seed": 1,
        "priority_class": CRITICAL,
        "ablations": 0 if quick else 1,
        "crosscheck": 0 if quick else 1,
        # Worker processes for the independent runs (one per spare core; 1 on a 2-core machine).
        "jobs": max(1, min(4, (os.cpu_count() or 1) - 1)),
    }
    for key, value in opts.items():
        if key not in o:
            raise CommandError(f"unknown option {key!r}; known: {', '.join(o)}")
        try:
            o[key] = type(o[key])(value)
        except ValueError as exc:
            raise CommandError(f"option {key}: {exc}") from exc
    if o["priority_class"] not in CLASSES:
        raise CommandError(f"option priority_class: one of {', '.join(CLASSES)}")
    if o["period_s"] < 1800 or o["peak_rps"] <= 0 or o["max_replicas"] < 1 or o["steady_rps"] <= 0:
        raise CommandError("need period_s >= 1800, peak_rps > 0, steady_rps > 0 and max_replicas >= 1")
    return o


def poisson_arrivals(rate_at, *, start: float, end: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process whose rate is ``rate_at(t)``, piecewise constant per second."""
    rng = random.Random(f"autoscale-{seed}")
    out: list[float] = []
    t = start
    while t < end:
        lam = rate_at(t)
        n = 0
        if lam > 30:
            n = max(0, round(rng.gauss(lam, math.sqrt(lam))))
        elif lam > 0:
            threshold, p = math.exp(-lam), rng.random()
            while p > threshold:
                n += 1
                p *= rng.random()
        out += sorted(t + rng.random() for _ in range(n))
        t += 1.0
    return out


def _cost(request, prompt_tokens: int) -> float:
    return estimate_request_mu(COEFFS, prompt_tokens=prompt_tokens, max_tokens=request.output_tokens)


def _policy(name: str, o: dict, profile, *, static_replicas: int):
    limit = o["concurrency_limit"]
    if name == "static_peak":
        return StaticPolicy(replicas=static_replicas)
    if name == "hpa":
        return HpaLikePolicy(target_per_replica=limit * 0.7, min_replicas=1, max_replicas=o["max_replicas"])
    if name == "kpa":
        return KpaLikePolicy(target_concurrency=limit, min_replicas=1, max_replicas=o["max_replicas"])
    fixed = name == "infercap_no_vertical"
    return InfercapPolicy(
        name=name,
        min_replicas=1,
        max_replicas=o["max_replicas"],
        concurrency_limit=limit,
        concurrency_min=limit if fixed else 8,
        concurrency_max=limit if fixed else o["concurrency_max"],
        ttft_slo_ms=SLO["ttft_s"] * 1000,
        tpot_slo_ms=SLO["tpot_s"] * 1000,
        predictive_period_s=None if name == REACTIVE else o["period_s"],
        predictive_lead_s=COLD_START_S[1],
        seconds_per_request=lambda c: engine_seconds_per_request(
            profile, c, in_tok=REFERENCE[0], out_tok=REFERENCE[1]
        ),
        reference_request_mu=estimate_request_mu(COEFFS, prompt_tokens=REFERENCE[0], max_tokens=REFERENCE[1]),
    )


class _IndependentRequest(workloads.SimRequest):
    """A request with its own prompt (no shared prefix, as ``workloads.uniform``): prefix caching has nothing to
    hit, so it carries no block hashes and the engine skips the cache's bookkeeping (a third of the run time)."""

    def block_hashes(self) -> list[int]:
        return []


def _requests(times: list[float], seed: int, priority_class: str):
    rng = random.Random(f"autoscale-shapes-{seed}")
    for i, t in enumerate(times):
        prompt = rng.randint(*PROMPT_TOKENS)
        yield _IndependentRequest(
            request_id=f"as-{i}",
            arrival_s=t,
            prompt_parts=("x" * (4 * prompt),),
            output_tokens=rng.randint(*OUTPUT_TOKENS),
            priority_class=priority_class,
        )


def simulate(policy, times: list[float], *, o: dict, end_s: float, initial: int, seed: int, history=None):
    """One policy over one day on the engine simulator; returns (simulation result, adapter)."""
    if history and getattr(policy, "predictive_config", None):
        for t in history:  # the previous day's arrivals, as the policy would have recorded them
            predictive.record(policy.history, t=t, arrivals=1, cfg=policy.predictive_config)
    scaler = EngineSimAutoscaler(policy, cold_start_s=COLD_START_S, seed=seed)
    sim = Simulation(
        router=LeastRequestRouter(seed=seed),
        replicas=initial,
        profile=PROFILE,
        admission=ProxyAdmission(replica_mu_per_s=COEFFS.mu_per_min / 60.0),
        autoscaler=scaler,
        cost_fn=_cost,
        concurrency_limit=getattr(policy, "concurrency_limit", o["concurrency_limit"]),
        cold_start_s=sum(COLD_START_S) / 2,
        seed=seed,
    )
    result = sim.run(_requests(times, seed, o["priority_class"]), until_s=end_s + 600.0)
    return result, scaler


def gpu_hours(result, *, start: float, end: float) -> float:
    """GPU time held inside [start, end]: every replica from its launch (cold start included) to its removal."""
    total = 0.0
    for rep in result.replicas:
        stop = rep.removed_s if rep.removed_s is not None else result.end_s
        total += max(0.0, min(stop, end) - max(rep.added_s, start)) * rep.gpus
    return total / 3600.0


def spike_absorb_s(requests, *, onset: float, horizon_s: float) -> float:
    """Seconds from a spike's onset to the arrival of the last request in the horizon that missed its SLO."""
    last_bad = onset
    for r in requests:
        if onset <= r.arrival_s < onset + horizon_s and not r.meets(**SLO):
            last_bad = max(last_bad, r.arrival_s)
    return last_bad - onset


def _row(result, scaler, *, period: float, onsets: list[float]) -> dict:
    scored = [r for r in result.requests if r.arrival_s < period]
    good = sum(r.meets(**SLO) for r in scored)
    horizons = [b - a for a, b in zip(onsets, onsets[1:] + [onsets[-1] + 600.0], strict=False)]
    absorb = [spike_absorb_s(scored, onset=t, horizon_s=min(600.0, h)) for t, h in zip(onsets, horizons, strict=False)]
    completed = [r for r in scored if r.status == "ok"]
    return {
        "gpu_hours": round(gpu_hours(result, start=0.0, end=period), 3),
        "slo_attainment": round(good / len(scored), 5) if scored else 1.0,
        "rate_429": round(sum(r.status == "rejected" for r in scored) / len(scored), 5) if scored else 0.0,
        "spike_absorb_s": round(max(absorb), 1),
        "spike_absorb_each_s": [round(a, 1) for a in absorb],
        "flaps": count_flaps(scaler.scale_events()),
        "requests": len(scored),
        "ttft_p95_s": _p(sorted(r.ttft_s for r in completed), 0.95),
        "tpot_p95_s": _p(sorted(r.tpot_s for r in completed if r.tpot_s is not None), 0.95),
        "peak_replicas": max((s["ready"] + s["starting"] + s["draining"] for s in result.timeline), default=0),
        "final_concurrency_limit": scaler.limits[-1][1] if scaler.limits else None,
    }


def _p(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, math.ceil(q * len(values)) - 1)], 3) if values else None


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    if live:
        raise CommandError("bench autoscale runs in the discrete-event simulator only; drop --live")
    o = _options(quick, opts)
    period = o["period_s"]
    trace = BurstyTrace(period_s=period, peak_rps=o["peak_rps"], night_rps=o["night_rps"])
    profile = get_profile(PROFILE)
    per_replica = o["concurrency_limit"] * 0.7
    w = engine_seconds_per_request(profile, per_replica, in_tok=REFERENCE[0], out_tok=REFERENCE[1])
    static_replicas = math.ceil(trace.peak_rate() * w / per_replica)
    times = poisson_arrivals(trace.rate, start=0.0, end=period, seed=o["seed"])
    history = poisson_arrivals(trace.rate, start=-period, end=0.0, seed=o["seed"] + 100)
    progress(
        f"bursty trace on the engine simulator ({PROFILE}): {len(times)} requests over {period:.0f} s (+ a history "
        f"day of {len(history)} arrivals for the predictive floor); static peak = {static_replicas} replicas "
        f"({per_replica / w:.2f} req/s each at {per_replica:g} in flight)"
    )
    onsets = trace.spike_onsets(day=0)
    figures: dict = {"policies": {}}
    curves, demand = {}, None
    names = POLICIES + (REACTIVE,) + (ABLATIONS if o["ablations"] else ())
    day = {"o": o, "static_replicas": static_replicas, "times": times, "history": history, "onsets": onsets}
    tasks = [("day", name, day) for name in names] + [("steady", name, o) for name in POLICIES]
    steady = {}
    for kind, name, out, wall in _map(tasks, jobs=o["jobs"]):
        if kind == "steady":
            steady[name] = out
            continue
        row, curve, samples = out
        table = figures["policies"] if name not in ABLATIONS else figures.setdefault("ablations", {})
        table[name] = row
        curves[name] = curve
        if name == "infercap":
            demand = samples
        progress(f"{name}: {row} ({wall:.1f} s)")
    for name, flaps in steady.items():
        figures["policies"][name]["steady_flaps"] = flaps
    p = figures["policies"]
    ours, static = p["infercap"], p["static_peak"]
    figures["savings_vs_static"] = round(1 - ours["gpu_hours"] / static["gpu_hours"], 4)
    figures["savings_vs_static_reactive"] = round(1 - p[REACTIVE]["gpu_hours"] / static["gpu_hours"], 4)
    figures["goals"] = {
        "savings_ge_80pct": figures["savings_vs_static"] >= 0.80,
        "slo_ge_99pct": ours["slo_attainment"] >= 0.99,
        "beats_hpa": ours["slo_attainment"] > p["hpa"]["slo_attainment"]
        and ours["gpu_hours"] <= p["hpa"]["gpu_hours"],
        "beats_kpa": ours["slo_attainment"] > p["kpa"]["slo_attainment"]
        and ours["gpu_hours"] <= p["kpa"]["gpu_hours"],
        "no_flaps_on_steady_load": ours["steady_flaps"] == 0,
    }
    figures["setup"] = {
        "simulator": f"endpoints.runtimes.sim.des (shared engine), profile {PROFILE}",
        "period_s": period,
        "peak_rps": o["peak_rps"],
        "night_rps": o["night_rps"],
        "peak_rate_rps": round(trace.peak_rate(), 1),
        "spikes": [
            {"at_s": s.at_fraction * period, "duration_s": s.duration_s, "x": s.multiplier} for s in trace.spikes
        ],
        "requests": {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "reference": REFERENCE},
        "mu_per_reference_request": estimate_request_mu(COEFFS, prompt_tokens=REFERENCE[0], max_tokens=REFERENCE[1]),
        "cold_start_s": list(COLD_START_S),
        "replica": {
            "prefill_tok_s": profile.prefill_tokens_per_s,
            "decode_step_ms": f"{profile.decode_t0_s * 1000:g} + {profile.decode_per_seq_s * 1000:g}·batch",
            "kv_tokens": profile.num_gpu_blocks * profile.block_size,
            "in_flight_s_at_baseline_target": round(w, 2),
        },
        "static_replicas": static_replicas,
        "baseline_concurrency_limit": o["concurrency_limit"],
        "infercap_concurrency_bounds": [8, o["concurrency_max"]],
        "slo": {"ttft_ms": SLO["ttft_s"] * 1000, "tpot_ms": SLO["tpot_s"] * 1000},
        "admission": {
            "code": "endpoints.admission.AdmissionController (the proxy's)",
            "max_queue": DEFAULT_MAX_QUEUE,
            "max_age_s": DEFAULT_MAX_AGE_S,
            "priority_class": o["priority_class"],
        },
        "history": "infercap: previous day's arrivals (another draw) recorded by the predictive floor; not scored",
        "billed": "every replica from launch (cold start included) to removal, within the scored day",
    }
    if o["crosscheck"]:
        started = time.perf_counter()
        figures["crosscheck_fleetsim"] = _fleetsim_crosscheck(o)
        progress(f"crosscheck_fleetsim: {figures['crosscheck_fleetsim']} ({time.perf_counter() - started:.1f} s)")
    if plot:
        _write_svg(plot, curves, demand or [], period)
        progress(f"wrote {plot}")
    return figures


def _task(task):
    """One simulation (a policy over the scored day, or over the steady load); runs in a worker process."""
    kind, name, arg = task
    started = time.perf_counter()
    profile = get_profile(PROFILE)
    if kind == "steady":
        out = _steady_flaps(name, arg, profile)
    else:
        o, static_replicas = arg["o"], arg["static_replicas"]
        policy = _policy(name, o, profile, static_replicas=static_replicas)
        result, scaler = simulate(
            policy,
            arg["times"],
            o=o,
            end_s=o["period_s"],
            initial=static_replicas if name == "static_peak" else 1,
            seed=o["seed"],
            history=arg["history"] if name.startswith("infercap") else None,
        )
        row = _row(result, scaler, period=o["period_s"], onsets=arg["onsets"])
        row["sim_requests_per_wall_s"] = round(len(result.requests) / max(time.perf_counter() - started, 1e-9))
        curve = [(s["t"], s["ready"] + s["starting"] + s["draining"]) for s in result.timeline]
        samples = [(t, req) for t, req, _ in scaler.samples] if name == "infercap" else None
        out = (row, curve, samples)
    return kind, name, out, time.perf_counter() - started


def _map(tasks: list, *, jobs: int):
    """The runs are independent: spread them over ``jobs`` processes (fork: nothing is re-imported)."""
    if jobs <= 1:
        yield from map(_task, tasks)
        return
    # Longest first: the static fleet is the slowest run (every replica is in every routing view all day).
    order = sorted(tasks, key=lambda t: (t[0] != "day", t[1] != "static_peak"))
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        results = {(kind, name): out for kind, name, *out in pool.map(_task, order)}
    for kind, name, _ in tasks:
        yield (kind, name, *results[(kind, name)])


def _steady_flaps(name: str, o: dict, profile) -> int:
    """Flaps on a steady Poisson load after a cold ramp-up: any scale-down within 5 min of a scale-up counts."""
    duration = o["steady_s"]
    times = poisson_arrivals(lambda t: o["steady_rps"], start=0.0, end=duration, seed=o["seed"] + 1)
    steady_static = math.ceil(o["steady_rps"] / 4.0)
    # Ours without history: a steady load has no yesterday.
    policy = _policy(REACTIVE if name == "infercap" else name, o, profile, static_replicas=steady_static)
    _, scaler = simulate(
        policy, times, o=o, end_s=duration, initial=steady_static if name == "static_peak" else 1, seed=o["seed"]
    )
    return count_flaps(scaler.scale_events())


def _fleetsim_crosscheck(o: dict) -> dict:
    """The comparison on ``fleetsim`` (the autoscaler's own fleet model, H100-class prefill): a cross-check only."""
    period = o["period_s"]
    trace = BurstyTrace(period_s=period, peak_rps=o["peak_rps"], night_rps=o["night_rps"])
    fprofile = SimConfig().profile
    per_replica = o["concurrency_limit"] * 0.7
    static_n = math.ceil(trace.peak_rate() * fprofile.seconds_per_request(per_replica) / per_replica)
    requests = generate_requests(trace.rate, start=0.0, end=2 * period, seed=o["seed"])
    out = {"model": "capacity.autoscaling.fleetsim (own fleet model, prefill 16,000 tok/s)", "policies": {}}
    for name in POLICIES:
        if name == "infercap":
            policy = InfercapPolicy(
                min_replicas=1, max_replicas=o["max_replicas"], concurrency_limit=o["concurrency_limit"],
                concurrency_min=4, concurrency_max=o["concurrency_max"], ttft_slo_ms=2000, tpot_slo_ms=100,
                predictive_period_s=period, predictive_lead_s=fprofile.cold_max_s,
                seconds_per_request=fprofile.seconds_per_request,
            )  # fmt: skip
            fresh, score_from, end = [r.fresh() for r in requests], period, 2 * period
        else:
            policy = _policy(name, o, None, static_replicas=static_n)
            policy.concurrency_limit = o["concurrency_limit"]
            fresh, score_from, end = [r.fresh(-period) for r in requests if r.arrival >= period], 0.0, period
        sim = FleetSim(
            policy,
            fresh,
            cfg=SimConfig(score_from=score_from, seed=o["seed"], priority_class=o["priority_class"]),
            end=end,
            initial_replicas=static_n if name == "static_peak" else 1,
        )
        result = sim.run()
        out["policies"][name] = {
            "gpu_hours": round(result.gpu_hours, 3),
            "slo_attainment": round(result.slo_attainment, 5),
            "rate_429": round(result.rate_429, 5),
        }
    p = out["policies"]
    out["savings_vs_static"] = round(1 - p["infercap"]["gpu_hours"] / p["static_peak"]["gpu_hours"], 4)
    return out


def _write_svg(path: str, curves: dict, demand: list, period: float) -> None:
    """Billed replicas per policy over the scored day, with ours' demand (requests in flight + queued) behind."""
    width, height, pad = 900, 360, 40
    top = max((v for c in curves.values() for _, v in c), default=1) or 1
    demand_top = max((v for _, v in demand), default=1) or 1
    colors = {
        "static_peak": "#888",
        "hpa": "#d62728",
        "kpa": "#ff7f0e",
        "infercap": "#1f77b4",
        REACTIVE: "#9467bd",
        "infercap_no_vertical": "#8c564b",
    }

    def xy(t, v, vmax):
        return pad + t / period * (width - 2 * pad), height - pad - v / vmax * (height - 2 * pad)

    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    step = max(1, int(period) // 1000)  # about 1,000 points per curve
    pts = " ".join("{:.1f},{:.1f}".format(*xy(t, v, demand_top)) for t, v in demand[::step] if t <= period)
    lines.append(f'<polyline fill="none" stroke="#2ca02c" stroke-opacity="0.35" points="{pts}"/>')
    for i, (name, curve) in enumerate(curves.items()):
        pts = " ".join("{:.1f},{:.1f}".format(*xy(t, v, top)) for t, v in curve[::step] if t <= period)
        color = colors.get(name, "#17becf")
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        lines.append(f'<text x="{pad + 10 + 120 * i}" y="20" fill="{color}">{name}</text>')
    lines.append(f'<text x="{pad}" y="34" fill="#2ca02c">demand (requests in flight + queued, scaled)</text>')
    lines.append(f'<text x="5" y="{pad + 10}">{top} replicas</text>')
    lines.append(f'<text x="{width - pad - 60}" y="{height - 10}">{period:.0f} s</text>')
    lines.append("</svg>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
