"""The overload section of ``bench reliability``: 3× and 10× an endpoint's capacity, with one fallback endpoint,
mixed priorities and five tenants, in the simulator (``simulator.overload``: the proxy's admission
code, slot-model replicas). The figures per level are ``overload.<level>.{critical_slo_attainment,
answered_fraction, fallback_fraction, degraded_fraction, shed_fraction, proxy_5xx, fairness_max_dev}``.

The scenario: a primary of 3 replicas × 4 slots answering 32 tokens at 50 ms/token (about 7 requests/s, "C"),
degrading sheddable then standard requests to 8 tokens under overload; a fallback on cheaper capacity, 1 replica
× 8 slots of a model 2.5× faster per token, that degrades too. Offered: 5% critical ("gold", reserved 0.6 C),
15% standard ("silver", reserved 1.6 C: reservations are oversold, as they are when capacity is lost), 80%
sheddable from three best-effort tenants (40/25/15%) with no reservation. Every tenant accepts fallbacks;
critical is not in the fallback classes. The first 10 s (5 s quick) warm the drain meter and are not counted."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import Counter
from pathlib import Path

from benchmarks.harness.reliability.harness import Platform
from billing.models import UsageRecord
from capacity.percentiles import percentile
from endpoints.models import Replica, ReplicaState
from simulator.overload import OverloadRun, SimEndpoint, SimTenant, summarize

LEVELS = (("3x", 3.0), ("10x", 10.0))
FULL_TOKENS = 32
DEGRADED_TOKENS = 8
TTFT_SLO_S = 2.0  # the harness endpoint's 2000 ms
PRIMARY = SimEndpoint(
    name="primary",
    replicas=3,
    concurrency=4,
    ttft_s=0.1,
    tpot_s=0.05,
    mu_per_token=0.01,
    mu_base=0.1,
    degrade_max_tokens=DEGRADED_TOKENS,
)
FALLBACK = SimEndpoint(
    name="fallback",
    replicas=1,
    concurrency=8,
    ttft_s=0.05,
    tpot_s=0.02,
    mu_per_token=0.004,
    mu_base=0.05,
    degrade_max_tokens=DEGRADED_TOKENS,
)
MIX = {  # tenant → (share of the offered load, class, reserved share of C)
    "gold": (0.05, "critical", 0.6),
    "silver": (0.15, "standard", 1.6),
    "bronze": (0.40, "sheddable", 0.0),
    "tin": (0.25, "sheddable", 0.0),
    "lead": (0.15, "sheddable", 0.0),
}


def capacity_rps(spec: SimEndpoint) -> float:
    return spec.replicas * spec.concurrency / spec.service_s(FULL_TOKENS)


def tenants_at(level: float) -> list[SimTenant]:
    c = capacity_rps(PRIMARY)
    mu_each = PRIMARY.mu(FULL_TOKENS)
    return [
        SimTenant(name, reserved_mu_per_s=reserved * c * mu_each, rates={klass: share * level * c})
        for name, (share, klass, reserved) in MIX.items()
    ]


def simulate(
    level: float,
    *,
    duration_s: float,
    warmup_s: float,
    seed: int = 1,
    with_fallback: bool = True,
    fair_pain: bool = True,
    slot_share: float | None = None,
) -> dict:
    tenants = tenants_at(level)
    sim = OverloadRun(
        primary=dataclasses.replace(PRIMARY, degrade_slot_share=slot_share),
        fallback=FALLBACK if with_fallback else None,
        tenants=tenants,
        duration_s=duration_s,
        full_tokens=FULL_TOKENS,
        seed=seed,
        fair_pain=fair_pain,
    )
    outcomes = sim.run()
    figures = summarize(outcomes, tenants, ttft_slo_s=TTFT_SLO_S, window=(warmup_s, duration_s))
    # The simulator has no HTTP server: a 5xx cannot happen there (the live run counts the proxy's).
    return {**figures, "proxy_5xx": 0, "offered_rps": round(level * capacity_rps(PRIMARY), 1), "mode": "simulated"}


def simulated_section(*, quick: bool, progress=print, slot_share: float | None = None) -> dict:
    """Both levels, each beside two baselines on the same arrivals: no fallback endpoint (degradation and fair
    pain only) and no fair pain (refusals by queue age and size, on whoever waited); with a ``slot_share`` on the
    primary, a third: the same without it."""
    duration_s, warmup_s = (40.0, 5.0) if quick else (180.0, 10.0)
    out = {}
    for label, level in LEVELS:
        run = {"duration_s": duration_s, "warmup_s": warmup_s, "slot_share": slot_share}
        figures = simulate(level, **run)
        figures["baseline_no_fallback"] = _brief(simulate(level, **run, with_fallback=False))
        figures["baseline_no_fair_pain"] = _brief(simulate(level, **run, fair_pain=False))
        if slot_share is not None:
            figures["slot_share"] = slot_share
            figures["baseline_no_slot_share"] = _brief(simulate(level, **{**run, "slot_share": None}))
        progress(f"overload {label} (simulated, {duration_s:.0f} s): {figures}")
        out[label] = figures
    return out


def _brief(figures: dict) -> dict:
    keys = (
        "critical_slo_attainment",
        "answered_fraction",
        "shed_fraction",
        "fairness_max_dev",
        "critical_ttft_ms_p99",
    )
    return {k: figures[k] for k in keys}


def overload_section(
    *, quick: bool, live: bool = False, progress=print, slots_per_replica: int = 2, slot_share: float | None = None
) -> dict:
    """The simulated levels; with ``live``, also each level through the real platform (``<level>.live``). With
    ``slot_share``, the primary degrades by that share of its replicas' slots too (``degrade_slot_share``)."""
    section = simulated_section(quick=quick, progress=progress, slot_share=slot_share)
    if live:
        for label, figures in live_section(
            quick=quick, progress=progress, slots_per_replica=slots_per_replica, slot_share=slot_share
        ).items():
            section.setdefault(label, {})["live"] = figures
    return section


# -- through the real platform -----------------------------------------------------------------------------
LIVE_TENANTS = {  # name → (class of its key, reserved MU/min on the primary: None = best effort)
    "gold": ("critical", 1e9),
    "silver": ("standard", 1e9),
    "bronze": ("sheddable", None),
    "tin": ("sheddable", None),
    "lead": ("sheddable", None),
}


def live_section(*, quick: bool, progress=print, slots_per_replica: int = 2, slot_share: float | None = None) -> dict:
    """The same levels and mix through real sockets: the proxy (uvicorn), 3 simulated replicas of 2 slots behind
    the primary and 1 faster one (speed 2.5) with 4 slots behind its fallback, no Celery worker. Gold and silver reserve more
    than they send (excess 0); the best-effort tenants' whole traffic is excess (no best-effort MU cap, the
    operator's choice here)."""
    duration_s = 10.0 if quick else 30.0
    platform = Platform(
        progress=progress,
        with_worker=False,
        # Fewer slots than the fault scenarios' 4 per replica: 10x must stay within what this machine's client and
        # proxy processes can offer and relay, so the replicas, not the CPU, are what is overloaded.
        concurrency_limit=slots_per_replica,
        fallback_concurrency=2 * slots_per_replica,
        fallback_replicas=1,
        degrade_max_tokens=DEGRADED_TOKENS,
        degrade_slot_share=slot_share,
        max_tokens=FULL_TOKENS,
        extra_tenants=LIVE_TENANTS,
        extra_env={"INFERCAP_PROXY_BEST_EFFORT_MU_PER_MIN": "0"},
    )
    out = {}
    with platform:
        slots = platform.replicas * platform.concurrency_limit
        base = asyncio.run(platform.closed_loop(clients=slots, duration_s=4, priority="standard"))
        capacity = sum(1 for o in base if o.status == 200 and o.done) / 4.0
        progress(f"overload live: capacity ≈ {capacity:.1f} req/s")
        for label, level in LEVELS:
            rates = {name: MIX[name][0] * level * capacity for name in LIVE_TENANTS}
            replica_pids = _replica_pids(platform)
            before, wall_before = len(platform.outcomes), time.monotonic()
            cpu_before, replicas_before = _cpu_s(platform.procs["proxy"].pid), sum(map(_cpu_s, replica_pids))
            outcomes = asyncio.run(platform.open_loop_tenants(rate_per_s=rates, duration_s=duration_s))
            figures = live_figures(outcomes, platform.outcomes[before:])
            figures.update(proxy_side_critical(platform, outcomes))
            figures["offered_rps"] = round(sum(rates.values()), 1)
            # CPU seconds per wall second: the proxy near 1, or the replicas near the machine's free cores, would be
            # the bottleneck rather than the replicas' simulated GPUs.
            wall = time.monotonic() - wall_before
            figures["proxy_cpu_share"] = round((_cpu_s(platform.procs["proxy"].pid) - cpu_before) / wall, 2)
            figures["replicas_cpu_share"] = round((sum(map(_cpu_s, replica_pids)) - replicas_before) / wall, 2)
            progress(f"overload {label} (live, {duration_s:.0f} s): {figures}")
            out[label] = figures
        books = platform.wait_books_settled(timeout_s=60)
    for figures in out.values():
        figures["lost_usage"] = books["lost"]
        figures["duplicated_usage"] = books["duplicated"]
    return out


def proxy_side_critical(platform: Platform, outcomes: list, slo_s: float = TTFT_SLO_S) -> dict:
    """Critical SLO attainment as the proxy measured it (the usage records' TTFT, from the request's arrival at
    the proxy), beside the client's: on a loaded machine the load generator's own lag, before the request reaches
    the proxy, can exceed the SLO by itself."""
    ids = [o.request_id for o in outcomes if o.priority == "critical" and o.request_id]
    platform.wait_books_settled(timeout_s=30)
    rows = UsageRecord.objects.filter(request_id__in=ids).values_list("status", "ttft_ms")
    good = sum(1 for status, ttft_ms in rows if status == "ok" and ttft_ms is not None and ttft_ms <= slo_s * 1000)
    critical = [o for o in outcomes if o.priority == "critical"]
    return {
        "critical_slo_attainment_client": _attainment(critical, slo_s),
        "critical_slo_attainment": round(good / len(critical), 4) if critical else None,
    }


def _attainment(critical: list, slo_s: float = TTFT_SLO_S) -> float | None:
    good = [o for o in critical if o.status == 200 and o.done and o.ttft_s is not None and o.ttft_s <= slo_s]
    return round(len(good) / len(critical), 4) if critical else None


def _replica_pids(platform: Platform) -> list[int]:
    endpoints = [platform.seeded.endpoint_id, platform.seeded.fallback_id]
    refs = Replica.objects.filter(endpoint_id__in=endpoints, state=ReplicaState.READY).values_list(
        "actuator_ref", flat=True
    )
    return [int(ref) for ref in refs if ref.isdigit()]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _ms_quantile(values: list[float], q: float) -> float | None:
    value = percentile(values, q * 100)
    return None if value is None else round(value * 1000, 1)


def live_figures(outcomes: list, everything: list) -> dict:
    n = max(1, len(outcomes))

    def ok(o) -> bool:
        return o.status == 200 and o.done and not o.error_event

    answered = [o for o in outcomes if ok(o)]
    critical = [o for o in outcomes if o.priority == "critical"]
    refused = [o for o in outcomes if not ok(o)]
    excess = {name: (0 if LIVE_TENANTS[name][1] else sum(o.tenant == name for o in outcomes)) for name in LIVE_TENANTS}
    total_excess = sum(excess.values())
    deviation = 0.0
    if refused and total_excess:
        deviation = max(
            abs(sum(o.tenant == name for o in refused) / len(refused) - excess[name] / total_excess)
            for name in LIVE_TENANTS
        )
    return {
        "answered_fraction": round(len(answered) / n, 4),
        "fallback_fraction": round(sum(1 for o in answered if o.fallback_from) / n, 4),
        "degraded_fraction": round(sum(1 for o in answered if o.degraded) / n, 4),
        "shed_fraction": round(len(refused) / n, 4),
        "proxy_5xx": sum(1 for o in everything if o.status >= 500),
        "fairness_max_dev": round(deviation, 4),
        "requests": len(outcomes),
        "critical_ttft_ms_p50": _ms_quantile([o.ttft_s for o in critical if o.ttft_s is not None], 0.5),
        "critical_ttft_ms_p99": _ms_quantile([o.ttft_s for o in critical if o.ttft_s is not None], 0.99),
        "refused_by_tenant_and_status": dict(
            Counter(f"{o.tenant}:{o.status or o.error}" + (f":{o.code}" if o.code else "") for o in refused)
        ),
        "mode": "live",
    }
