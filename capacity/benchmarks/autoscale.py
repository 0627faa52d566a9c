"""``bench autoscale``: static peak, HPA-like, KPA-like and our two-axis autoscaler on the bursty trace.

Every policy drives the same discrete-event fleet (13B profile, cold start 60–120 s, TTFT ≤ 2 s and TPOT ≤ 100 ms
SLO, 30 s max queue age) on the same arrivals. Ours runs a history day first (its predictive floor needs a
yesterday) and every policy is scored on the second day only. The baselines have no vertical axis: they keep the
endpoint's configured concurrency limit; static peak is sized for the trace's peak rate at that limit and the
target utilization. A second, steady-load run counts flaps (scale-downs within 5 min of a scale-up).
"""

import math
import time

from django.core.management.base import CommandError

from capacity.autoscaling.baselines import HpaLikePolicy, KpaLikePolicy, StaticPolicy
from capacity.autoscaling.fleetsim import FleetSim, SimConfig, count_flaps, generate_requests, spike_absorb_s
from capacity.autoscaling.infercap import InfercapPolicy
from capacity.autoscaling.traces import BurstyTrace

POLICIES = ("static_peak", "hpa", "kpa", "infercap")
# Ours with one mechanism switched off, to show what each contributes (``--opt ablations=1``; on in the full run).
ABLATIONS = ("infercap_no_vertical", "infercap_no_predictive")


def _options(quick: bool, opts: dict) -> dict:
    o = {
        "period_s": 3600.0 if quick else 4 * 3600.0,
        "peak_rps": 30.0,
        "night_rps": 0.3,
        "steady_rps": 12.0,
        "steady_s": 1200.0 if quick else 3600.0,
        "concurrency_limit": 64,
        "concurrency_max": 256,
        "max_replicas": 40,
        "seed": 1,
        "warm_pool": 0,
        "ablations": 0 if quick else 1,
    }
    for key, value in opts.items():
        if key not in o:
            raise CommandError(f"unknown option {key!r}; known: {', '.join(o)}")
        try:
            o[key] = type(o[key])(value)
        except ValueError as exc:
            raise CommandError(f"option {key}: {exc}") from exc
    if o["period_s"] < 600 or o["peak_rps"] <= 0 or o["max_replicas"] < 1:
        raise CommandError("need period_s >= 600, peak_rps > 0 and max_replicas >= 1")
    return o


def _policy(name: str, o: dict, profile, *, period_s: float | None, static_replicas: int):
    limit = o["concurrency_limit"]
    if name == "static_peak":
        policy = StaticPolicy(replicas=static_replicas)
    elif name == "hpa":
        policy = HpaLikePolicy(target_per_replica=limit * 0.7, min_replicas=1, max_replicas=o["max_replicas"])
    elif name == "kpa":
        policy = KpaLikePolicy(target_concurrency=limit, min_replicas=1, max_replicas=o["max_replicas"])
    else:
        fixed = name == "infercap_no_vertical"
        return InfercapPolicy(
            name=name,
            min_replicas=1,
            max_replicas=o["max_replicas"],
            concurrency_limit=limit,
            concurrency_min=limit if fixed else 4,
            concurrency_max=limit if fixed else o["concurrency_max"],
            ttft_slo_ms=2000,
            tpot_slo_ms=100,
            predictive_period_s=None if name == "infercap_no_predictive" else period_s,
            predictive_lead_s=profile.cold_max_s,
            warm_pool=o["warm_pool"],
            seconds_per_request=profile.seconds_per_request,
        )
    policy.concurrency_limit = limit
    return policy


def _run_one(name, o, requests, *, period, static_replicas):
    """Ours runs both days and is scored on the second; the others keep no history and run the second day only."""
    profile = SimConfig().profile
    policy = _policy(name, o, profile, period_s=period, static_replicas=static_replicas)
    if name.startswith("infercap"):
        fresh, score_from, end = [r.fresh() for r in requests], period, 2 * period
    else:
        fresh, score_from, end = [r.fresh(-period) for r in requests if r.arrival >= period], 0.0, period
    initial = static_replicas if name == "static_peak" else 1
    sim = FleetSim(
        policy, fresh, cfg=SimConfig(score_from=score_from, seed=o["seed"]), end=end, initial_replicas=initial
    )
    return sim, sim.run()


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, **opts) -> dict:
    if live:
        raise CommandError("bench autoscale runs in the discrete-event simulator only; drop --live")
    o = _options(quick, opts)
    period = o["period_s"]
    trace = BurstyTrace(period_s=period, peak_rps=o["peak_rps"], night_rps=o["night_rps"])
    profile = SimConfig().profile
    per_replica = o["concurrency_limit"] * 0.7
    static_replicas = math.ceil(trace.peak_rate() * profile.seconds_per_request(per_replica) / per_replica)
    requests = generate_requests(trace.rate, start=0.0, end=2 * period, seed=o["seed"])
    progress(
        f"bursty trace: {len(requests)} requests over 2 × {period:.0f} s, static peak = {static_replicas} replicas"
    )

    figures: dict = {"policies": {}}
    curves = {}
    for name in POLICIES + (ABLATIONS if o["ablations"] else ()):
        started = time.perf_counter()
        sim, result = _run_one(name, o, requests, period=period, static_replicas=static_replicas)
        offset = period if name.startswith("infercap") else 0.0
        onsets = [t + offset for t in trace.spike_onsets(day=0)]
        horizons = [b - a for a, b in zip(onsets, onsets[1:] + [onsets[-1] + 600.0], strict=False)]
        absorb = [
            spike_absorb_s(result.requests_scored, onset=t, horizon_s=min(600.0, h), ttft_slo_s=2.0)
            for t, h in zip(onsets, horizons, strict=False)
        ]
        table = figures["policies"] if name in POLICIES else figures.setdefault("ablations", {})
        table[name] = {
            "gpu_hours": round(result.gpu_hours, 3),
            "slo_attainment": round(result.slo_attainment, 5),
            "rate_429": round(result.rate_429, 5),
            "spike_absorb_s": round(max(absorb), 1),
            "spike_absorb_each_s": [round(a, 1) for a in absorb],
            "flaps": count_flaps([e for e in result.scale_events if e[0] >= offset]),
            "requests": result.requests,
            "final_concurrency_limit": sim.limit,
        }
        if name in POLICIES:
            curves[name] = [(t - offset, billed) for t, billed, _, _ in result.replica_series if t >= offset]
        progress(f"{name}: {table[name]} ({time.perf_counter() - started:.1f} s)")

    steady = _steady_flaps(o)
    for name, flaps in steady.items():
        figures["policies"][name]["steady_flaps"] = flaps
    p = figures["policies"]
    ours, static = p["infercap"], p["static_peak"]
    figures["savings_vs_static"] = round(1 - ours["gpu_hours"] / static["gpu_hours"], 4)
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
        "period_s": period,
        "peak_rps": o["peak_rps"],
        "spikes": [
            {"at_s": s.at_fraction * period, "duration_s": s.duration_s, "x": s.multiplier} for s in trace.spikes
        ],
        "cold_start_s": [profile.cold_min_s, profile.cold_max_s],
        "replica": {
            "decode_step_ms": f"{profile.step_t0_s * 1000:g} + {profile.step_k_s * 1000:g}·batch",
            "prefill_tok_s": profile.prefill_tok_s,
            "kv_tokens": profile.kv_tokens,
        },
        "static_replicas": static_replicas,
        "baseline_concurrency_limit": o["concurrency_limit"],
        "infercap_concurrency_bounds": [4, o["concurrency_max"]],
        "infercap_warm_pool": o["warm_pool"],
        "slo": {"ttft_ms": 2000, "tpot_ms": 100},
        "billed": "booting, standby, ready and draining replicas",
    }
    if plot:
        _write_svg(plot, curves, trace, period)
        progress(f"wrote {plot}")
    return figures


def _steady_flaps(o: dict) -> dict:
    """Flaps on a steady Poisson load after a cold ramp-up: any scale-down within 5 min of a scale-up counts."""
    duration = o["steady_s"]
    requests = generate_requests(lambda t: o["steady_rps"], start=0.0, end=duration, seed=o["seed"] + 1)
    out = {}
    for name in POLICIES:
        policy = _policy(name, o, SimConfig().profile, period_s=None, static_replicas=1)
        sim = FleetSim(policy, [r.fresh() for r in requests], cfg=SimConfig(seed=o["seed"]), end=duration)
        out[name] = count_flaps(sim.run().scale_events)
    return out


def _write_svg(path: str, curves: dict, trace: BurstyTrace, period: float) -> None:
    width, height, pad = 900, 360, 40
    top = max((v for c in curves.values() for _, v in c), default=1) or 1
    rate_top = trace.peak_rate() or 1
    colors = {"static_peak": "#888", "hpa": "#d62728", "kpa": "#ff7f0e", "infercap": "#1f77b4"}

    def xy(t, v, vmax):
        return pad + t / period * (width - 2 * pad), height - pad - v / vmax * (height - 2 * pad)

    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    rate_pts = " ".join(
        "{:.1f},{:.1f}".format(*xy(t, trace.rate(t + period), rate_top)) for t in range(0, int(period), 10)
    )
    lines.append(f'<polyline fill="none" stroke="#2ca02c" stroke-opacity="0.35" points="{rate_pts}"/>')
    for i, (name, curve) in enumerate(curves.items()):
        pts = " ".join("{:.1f},{:.1f}".format(*xy(t, v, top)) for t, v in curve[::5])
        lines.append(f'<polyline fill="none" stroke="{colors[name]}" stroke-width="1.5" points="{pts}"/>')
        lines.append(f'<text x="{pad + 10 + 130 * i}" y="20" fill="{colors[name]}">{name}</text>')
    lines.append(f'<text x="{pad + 540}" y="20" fill="#2ca02c">arrival rate (scaled)</text>')
    lines.append(f'<text x="5" y="{pad}">{top} replicas</text>')
    lines.append(f'<text x="{width - pad - 60}" y="{height - 10}">{period:.0f} s</text>')
    lines.append("</svg>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
