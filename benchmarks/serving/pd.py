"""``bench pd``: prefill/decode disaggregation against the best aggregated fleet at equal GPUs, in the discrete-event
model (``simulator/pd_des.py``, the calibrated engine model of every replica).

For each workload (short chat, long-context RAG with a strict TPOT, a mix) the planner
(``capacity.planning.disaggregation``) sizes both designs for a target rate; the bench takes the GPUs of the design it
recommends and simulates, on that many GPUs:

* ``aggregated``: mixed replicas, the least-loaded router (pending prefill seconds plus running streams): the best
  aggregated fleet;
* ``round_robin``: the same replicas, round robin: the floor;
* ``disaggregated``: the planner's prefill/decode split (scaled to the GPUs when it recommends aggregated), the
  proxy's pairing (least pending prefill, then fewest running decode streams);
* ``oracle``: the ceiling, from oracles only: the best over every split of the GPUs (1 to G − 1 prefill replicas,
  whatever the planner chose) with clairvoyant pairings that know each stream's remaining output (the fewest
  stream-steps shared with the new stream, ``oracle_overlap``; in a full run also the least remaining work,
  ``oracle``). Neither the planner's split nor the proxy's pairing is in it, so the planner's fleet is judged
  against it (``planner_vs_ceiling``), not part of it. Each of those oracle fleets also runs at the comparison's
  load (below), for the TPOT ceiling (``benchmarks/serving/pd_tpot.py``);
* ``bound``: an analytic capacity bound over the same splits: the rate at which the busier pool saturates (prefill
  compute or its link, or the decode pool at the largest batch within the TPOT), per GPU. A bound on the
  pools' throughput, not a simulation: a finite run can pass it a little near saturation.

Goodput per GPU is DistServe's: the highest arrival rate at which ≥ 90 % of requests meet both the TTFT and TPOT SLO
(bisection on the same requests, times scaled), times the share that met it, over GPUs. ``ttft_p90_ratio`` and
``tpot_p90_ratio`` compare disaggregated with aggregated at one load, the comparison's: the aggregated fleet's own
highest rate (where it still meets its SLO), both fleets on the same requests; each is the p90 over the requests counted
of a request's TTFT, or of its mean time per output token after the first. ``tpot_p90_ratio_at_capacity`` compares
them each at its own highest rate instead. ``planner_check``: the planner's two fleets simulated at the target rate,
and one replica fewer.

Last line keys: ``pd.<workload>.goodput_per_gpu_ratio`` (disaggregated ÷ aggregated), ``pd.<workload>.planner_choice``,
``pd.<workload>.choice_goodput_ratio`` (the planner's choice ÷ aggregated: what infercap loses or gains),
``pd.<workload>.ttft_p90_ratio``, ``pd.<workload>.tpot_p90_ratio``, ``pd.<workload>.ceiling_ratio`` (the oracle
search ÷ aggregated), ``pd.<workload>.planner_vs_ceiling`` (the planner's split ÷ the ceiling),
``pd.<workload>.bound_ratio``, ``pd.<workload>.tpot_p90_ratio_at_capacity``, ``pd.<workload>.tpot_p90_ratio_ceiling``
(each seed's lowest TPOT p90 ratio at the comparison's load of any oracle fleet that meets the SLO attainment there,
averaged) with ``pd.<workload>.tpot_p90_ceiling_split`` (each seed's split), ``pd.<workload>.split_meeting_both`` (an
oracle fleet's split with ≥ 1.5× goodput per GPU and TPOT p90 ≤ 0.7× at once, on its means over the seeds; null if
none), ``pd.<workload>.oracle_splits`` (each oracle fleet's two means), ``pd.<workload>.planner_threshold`` (the
``pd_min_uncached_tokens`` the planner recommends, with its share straight to decode and its GPUs;
``planner_check.threshold`` simulates its pools at the target rate with and without it), ``pd.<workload>.detail``;
``pd.real_engine.*`` (what tests/engine/test_pd_real_engine.py measured on the two real engines at its last run
here, with its time and commit in ``pd.real_engine.source``; null if it has not run), ``pd.seeds``, ``pd.seed_set``,
``pd.wall_s``.

Options (``--opt``): ``duration_s`` of arrivals per run (45 quick, 180 full; the first third is warm-up and not
counted), ``steps`` of the bisection (6 quick, 8 full), ``workloads`` (comma-separated names), ``seeds`` (comma-separated: training seeds only unless
``--held-out``).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from benchmarks import protocol
from benchmarks.serving.pd_tpot import ATTAINMENT, tpot_ceiling, tpot_ceiling_summary, tpot_ratios
from capacity.hardware.profiles import get_profile
from capacity.planning.barriers import Hardware, ModelShape
from capacity.planning.disaggregation import PDSLO, PDWorkload, StepModel, plan_disaggregation
from simulator.pd_des import PDFleet, PDSimulation, pd_mix_requests
from simulator.workloads import poisson_times

HELD_OUT = True
SMOKE = {"duration_s": "6", "steps": "2"}
# Llama 3.1 8B on one H100 (the roofline profile), its context raised for 16k-token prompts; KV 128 KiB per token.
PROFILE = get_profile("llama-8b-h100").with_options(max_model_len=32768)
MODEL = ModelShape(n_layers=32, n_kv_heads=8, d_head=128, dtype_bytes=2, weights_gb=16.06)
HARDWARE = Hardware(gpu_memory_gb=80.0, overhead_gb=10.0, gpus_per_replica=1, usd_per_gpu_hour=0.0)
LINK_GBPS = 400.0  # one 400 Gb/s NIC per GPU (InfiniBand NDR / RoCE), the KV connector's path
LINK_LATENCY_S = 0.001
# The ceiling's clairvoyant pairings (simulator/pd_des.py): the quick run tries the first only.
CEILING_ROUTERS = ("oracle_overlap", "oracle")


@dataclass(frozen=True)
class PDWorkloadSpec:
    name: str
    shapes: list  # (weight, prompt range, output range)
    slo: PDSLO
    rate: float  # the planner's target, requests per second

    def requests(self, rate: float, duration_s: float, seed: int):
        """Arrivals over ``duration_s`` at ``rate``: the same unit-rate draw scaled, so every rate sees the same
        request sizes in the same order."""
        count = max(20, round(rate * duration_s))
        times = [t / rate for t in poisson_times(1.0, count=count, seed=seed)]
        return list(pd_mix_requests(times, shapes=self.shapes, seed=seed, prefix=self.name))

    def planner_workload(self) -> PDWorkload:
        total = sum(w for w, _, _ in self.shapes)
        mean = sum(w * (p[0] + p[1]) / 2 for w, p, _ in self.shapes) / total
        second = sum(w * ((p[1] - p[0]) ** 2 / 12 + ((p[0] + p[1]) / 2) ** 2) for w, p, _ in self.shapes) / total
        out = sum(w * (o[0] + o[1]) / 2 for w, _, o in self.shapes) / total
        # a stream's context weighted by how long it decodes (its output)
        held = sum(w * (o[0] + o[1]) / 2 * ((p[0] + p[1]) / 2 + (o[0] + o[1]) / 4) for w, p, o in self.shapes)
        ranges = tuple((w, p[0], p[1]) for w, p, _ in self.shapes)
        sd = max(0.0, second - mean**2) ** 0.5
        return PDWorkload(self.rate, mean, out, sd, held / total / out, prompt_ranges=ranges)


WORKLOADS = {
    "short_chat": PDWorkloadSpec("short_chat", [(1.0, (128, 1024), (64, 256))], PDSLO(ttft_s=1.0, tpot_s=0.05), 40.0),
    "long_rag": PDWorkloadSpec("long_rag", [(1.0, (4096, 16384), (128, 512))], PDSLO(ttft_s=3.0, tpot_s=0.015), 8.0),
    "mix": PDWorkloadSpec(
        "mix",
        [(0.7, (128, 1024), (64, 256)), (0.3, (4096, 16384), (128, 512))],
        PDSLO(ttft_s=3.0, tpot_s=0.025),
        16.0,
    ),
}


def _simulate(spec: PDWorkloadSpec, fleet: PDFleet, rate: float, duration_s: float, seed: int):
    """One run; the figures count the requests that arrived after the first third (the fleet warmed up), so an
    overloaded fleet's growing queue shows instead of hiding in a short run's start."""
    result = PDSimulation(fleet).run(spec.requests(rate, duration_s, seed))
    return result.subset(lambda r: r.arrival_s >= duration_s / 3)


def _attainment(spec, result) -> float:
    return result.slo_attainment(ttft_s=spec.slo.ttft_s, tpot_s=spec.slo.tpot_s)


def max_goodput(spec: PDWorkloadSpec, fleet: PDFleet, *, duration_s: float, seed: int, steps: int) -> dict:
    """The highest rate (bisection, geometric) at which ≥ 90 % of the requests meet the SLO, and its goodput/GPU."""
    lo, hi = 0.25 * spec.rate, 4.0 * spec.rate
    best = None
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        result = _simulate(spec, fleet, mid, duration_s, seed)
        if _attainment(spec, result) >= ATTAINMENT:
            lo, best = mid, (mid, result)
        else:
            hi = mid
    if best is None:
        best = (lo, _simulate(spec, fleet, lo, duration_s, seed))
    rate, result = best
    attainment = _attainment(spec, result)
    return {
        "rate": round(rate, 3),
        "attainment": round(attainment, 4),
        "goodput_per_gpu": round(rate * attainment / fleet.gpus, 4) if attainment >= ATTAINMENT else 0.0,
        "gpus": fleet.gpus,
        "tpot_p90_s": _r(result.percentile("tpot_s", 90)),  # at that rate: the fleet's own operating point
    }


def _latency(spec, result) -> dict:
    return {
        "attainment": round(_attainment(spec, result), 4),
        "ttft_p90_s": _r(result.percentile("ttft_s", 90)),
        "tpot_p90_s": _r(result.percentile("tpot_s", 90)),
        "transfer_p90_s": _r(_p90([r.extra["transfer_s"] for r in result.requests if "transfer_s" in r.extra])),
    }


def _p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(0.9 * len(values)))] if values else None


def _r(value):
    return None if value is None else round(value, 4)


def _fleets(plan, gpus: int) -> tuple[PDFleet, PDFleet, PDFleet, int]:
    base = {"profile": PROFILE, "kv_bytes_per_token": plan.kv_bytes_per_token, "link_gbps": LINK_GBPS}
    base["link_latency_s"] = LINK_LATENCY_S
    if plan.prefill.replicas is not None and plan.decode.replicas is not None:
        share = plan.prefill.replicas / (plan.prefill.replicas + plan.decode.replicas)
    else:
        share = 0.5
    prefill = min(gpus - 1, max(1, round(gpus * share)))
    aggregated = PDFleet(replicas=gpus, **base)
    floor = PDFleet(replicas=gpus, router="round_robin", **base)
    disaggregated = PDFleet(replicas=gpus - prefill, prefill_replicas=prefill, mode="disaggregated", **base)
    return aggregated, floor, disaggregated, prefill


def run_workload(spec: PDWorkloadSpec, *, duration_s: float, steps: int, seed: int, routers, progress) -> dict:
    plan = plan_disaggregation(
        model=MODEL,
        hardware=HARDWARE,
        step=StepModel.from_profile(PROFILE),
        workload=spec.planner_workload(),
        slo=spec.slo,
        link_gbps=LINK_GBPS,
        link_latency_s=LINK_LATENCY_S,
    )
    chosen_gpus = plan.disaggregated_gpus if plan.pays else plan.aggregated.gpus
    gpus = max(2, chosen_gpus or plan.disaggregated_gpus or 2)
    aggregated, floor, disaggregated, prefill = _fleets(plan, gpus)
    runs = {}
    for name, fleet in (("aggregated", aggregated), ("round_robin", floor), ("disaggregated", disaggregated)):
        runs[name] = max_goodput(spec, fleet, duration_s=duration_s, seed=seed, steps=steps)
        progress(f"pd {spec.name} seed {seed}: {name} on {gpus} GPUs: {runs[name]}")
    at_rate = max(runs["aggregated"]["rate"], 0.05 * spec.rate)
    same_load = {
        "rate": at_rate,
        "aggregated": _latency(spec, _simulate(spec, aggregated, at_rate, duration_s, seed)),
        "disaggregated": _latency(spec, _simulate(spec, disaggregated, at_rate, duration_s, seed)),
    }
    ceiling_args = {"routers": routers, "at_rate": at_rate, "duration_s": duration_s, "seed": seed, "steps": steps}
    runs["oracle"], splits = _ceiling(spec, plan, gpus, **ceiling_args)
    runs["bound"] = _capacity_bound(spec, plan, gpus)
    progress(f"pd {spec.name} seed {seed}: ceiling {runs['oracle']}, bound {runs['bound']}")
    splits = tpot_ratios(splits, aggregated=runs["aggregated"], same_load=same_load["aggregated"])
    return {
        "plan": {
            "recommended": plan.recommended,
            "explanation": plan.explanation,
            "aggregated_replicas": plan.aggregated.replicas,
            "prefill_replicas": plan.prefill.replicas,
            "decode_replicas": plan.decode.replicas,
            "gpu_ratio": plan.gpu_ratio,
            "threshold": {k: v for k, v in plan.threshold.items() if k != "candidates"},
        },
        "gpus": gpus,
        "split": {"prefill": prefill, "decode": gpus - prefill},
        "fleets": runs,
        "same_load": same_load,
        "splits": splits,
        "tpot_ceiling": tpot_ceiling(splits),
        "planner_check": _planner_check(spec, plan, duration_s=duration_s, seed=seed),
    }


def _ceiling(spec, plan, gpus: int, *, routers, at_rate: float, duration_s: float, seed: int, steps: int):
    """The best disaggregated fleet on ``gpus`` GPUs over every split and the clairvoyant pairings ``routers``, and
    every one of those fleets (``oracle_fleets``) with its latencies at ``at_rate``, the comparison's load."""
    best, rows = None, []
    for fleet in oracle_fleets(plan, gpus, routers):
        figures = max_goodput(spec, fleet, duration_s=duration_s, seed=seed, steps=steps)
        figures.update(prefill_replicas=fleet.prefill_replicas, router=fleet.router)
        if best is None or figures["goodput_per_gpu"] > best["goodput_per_gpu"]:
            best = figures
        same_load = _latency(spec, _simulate(spec, fleet, at_rate, duration_s, seed))
        rows.append(figures | {"decode_replicas": fleet.replicas, "same_load": same_load})
    return best, rows


def oracle_fleets(plan, gpus: int, routers) -> list[PDFleet]:
    """Every split of ``gpus`` (1 to G - 1 prefill replicas) with each clairvoyant pairing: oracles only, never the
    planner's split nor the proxy's pairing."""
    if any(not router.startswith("oracle") for router in routers):
        raise ValueError(f"the ceiling takes clairvoyant pairings only, not {list(routers)}")
    fleet_args = {"mode": "disaggregated", "profile": PROFILE, "kv_bytes_per_token": plan.kv_bytes_per_token}
    fleet_args |= {"link_gbps": LINK_GBPS, "link_latency_s": LINK_LATENCY_S}
    return [
        PDFleet(replicas=gpus - p, prefill_replicas=p, router=router, **fleet_args)
        for p in range(1, gpus)
        for router in routers
    ]


def _capacity_bound(spec, plan, gpus: int) -> dict:
    """The highest rate any split of ``gpus`` can carry without a pool saturating, per GPU: the prefill pool's compute
    (a prompt's shared-step prefill time, linear in its length, so its mean at the mean prompt) or its links, against
    the decode pool's streams at the largest batch within the TPOT (and the KV memory) at the stream-weighted
    context."""
    work, step = spec.planner_workload(), StepModel.from_profile(PROFILE)
    per_prefill = min(
        1 / step.prefill_s(work.input_tokens, shared=True),
        LINK_GBPS * 1e9 / 8 / (work.input_tokens * plan.kv_bytes_per_token),
    )
    ctx = work.decode_context
    kv_tokens = PROFILE.num_gpu_blocks * PROFILE.block_size
    batch = max(
        (b for b in range(1, step.max_batch + 1) if step.decode_step_s(b, ctx) <= spec.slo.tpot_s),
        default=0,
    )
    batch = min(batch, int(kv_tokens // (ctx + work.output_tokens / 2)))
    per_decode = batch / (work.output_tokens * step.decode_step_s(batch, ctx)) if batch else 0.0
    rates = {p: min(p * per_prefill, (gpus - p) * per_decode) for p in range(1, gpus)}
    p = max(rates, key=rates.get)
    return {"rate": round(rates[p], 3), "goodput_per_gpu": round(rates[p] / gpus, 4), "prefill_replicas": p,
            "decode_batch": batch, "gpus": gpus}  # fmt: skip


def _planner_check(spec, plan, *, duration_s: float, seed: int) -> dict:
    """The planner's fleets at its target rate, and each with one replica fewer (the SLO should fail there)."""
    base = {"profile": PROFILE, "kv_bytes_per_token": plan.kv_bytes_per_token, "link_gbps": LINK_GBPS}
    base["link_latency_s"] = LINK_LATENCY_S
    check = {}
    n = plan.aggregated.replicas
    if n:
        check["aggregated"] = {
            "replicas": n,
            "attainment": round(
                _attainment(spec, _simulate(spec, PDFleet(replicas=n, **base), spec.rate, duration_s, seed)), 4
            ),
        }
        if n > 1:
            fewer = _simulate(spec, PDFleet(replicas=n - 1, **base), spec.rate, duration_s, seed)
            check["aggregated"]["attainment_one_fewer"] = round(_attainment(spec, fewer), 4)
    p, d = plan.prefill.replicas, plan.decode.replicas
    if p and d:
        check["disaggregated"] = {"replicas": [p, d]}
        for key, (pp, dd) in (
            ("attainment", (p, d)),
            ("one_fewer_prefill", (p - 1, d)),
            ("one_fewer_decode", (p, d - 1)),
        ):
            if pp and dd:
                fleet = PDFleet(replicas=dd, prefill_replicas=pp, mode="disaggregated", **base)
                result = _simulate(spec, fleet, spec.rate, duration_s, seed)
                check["disaggregated"][key] = round(_attainment(spec, result), 4)
    best = plan.threshold.get("recommended_min_uncached_tokens")
    if best:  # selective disaggregation: the threshold's pools, with it and without it
        [row] = [c for c in plan.threshold["candidates"] if c["min_uncached_tokens"] == best]
        pp, dd = row["prefill_replicas"], row["decode_replicas"]
        check["threshold"] = {"min_uncached_tokens": best, "bypass_share": row["bypass_share"], "replicas": [pp, dd]}
        for key, threshold in (("attainment", best), ("attainment_without", 0)):
            fleet = PDFleet(
                replicas=dd, prefill_replicas=pp, mode="disaggregated", min_uncached_tokens=threshold, **base
            )
            check["threshold"][key] = round(_attainment(spec, _simulate(spec, fleet, spec.rate, duration_s, seed)), 4)
    return check


def _summarise(name: str, per_seed: list[dict]) -> dict:
    def mean(values):
        values = [v for v in values if v is not None]
        return round(sum(values) / len(values), 4) if values else None

    def ratio(block, a, b):
        x, y = block["fleets"][a]["goodput_per_gpu"], block["fleets"][b]["goodput_per_gpu"]
        return x / y if y else None

    choice = per_seed[0]["plan"]["recommended"]
    chosen = "disaggregated" if choice == "disaggregated" else "aggregated"
    same = [b["same_load"] for b in per_seed]
    return {
        f"pd.{name}.goodput_per_gpu_ratio": mean([ratio(b, "disaggregated", "aggregated") for b in per_seed]),
        f"pd.{name}.planner_choice": choice,
        f"pd.{name}.choice_goodput_ratio": mean([ratio(b, chosen, "aggregated") for b in per_seed]),
        f"pd.{name}.ttft_p90_ratio": mean(
            [
                s["disaggregated"]["ttft_p90_s"] / s["aggregated"]["ttft_p90_s"]
                for s in same
                if s["aggregated"]["ttft_p90_s"]
            ]
        ),
        f"pd.{name}.tpot_p90_ratio": mean(
            [
                s["disaggregated"]["tpot_p90_s"] / s["aggregated"]["tpot_p90_s"]
                for s in same
                if s["aggregated"]["tpot_p90_s"]
            ]
        ),
        f"pd.{name}.tpot_p90_ratio_at_capacity": mean(
            [
                b["fleets"]["disaggregated"]["tpot_p90_s"] / b["fleets"]["aggregated"]["tpot_p90_s"]
                for b in per_seed
                if b["fleets"]["aggregated"]["tpot_p90_s"] and b["fleets"]["disaggregated"]["tpot_p90_s"] is not None
            ]
        ),
        **tpot_ceiling_summary(name, per_seed),
        f"pd.{name}.planner_threshold": per_seed[0]["plan"]["threshold"],
        f"pd.{name}.floor_ratio": mean([ratio(b, "round_robin", "aggregated") for b in per_seed]),
        f"pd.{name}.ceiling_ratio": mean([ratio(b, "oracle", "aggregated") for b in per_seed]),
        f"pd.{name}.planner_vs_ceiling": mean([ratio(b, "disaggregated", "oracle") for b in per_seed]),
        f"pd.{name}.bound_ratio": mean([ratio(b, "bound", "aggregated") for b in per_seed]),
        f"pd.{name}.detail": per_seed,
    }


def run(*, quick: bool, plot: str | None = None, live: bool = False, progress=print, held_out: bool = False, **opts):
    started = time.perf_counter()
    duration_s = float(opts.get("duration_s", 45 if quick else 180))
    steps = int(opts.get("steps", 6 if quick else 8))
    names = opts.get("workloads", ",".join(WORKLOADS)).split(",")
    if unknown := set(names) - set(WORKLOADS):
        raise ValueError(f"unknown workloads {sorted(unknown)}; expected {', '.join(WORKLOADS)}")
    seeds = protocol.seeds_for("pd", held_out=held_out)
    if "seeds" in opts:
        seeds = tuple(int(s) for s in str(opts["seeds"]).split(","))
        if not held_out and any(protocol.is_held_out("pd", s) for s in seeds):
            raise ValueError("held-out seeds run only with --held-out (benchmarks/protocol.py)")
    elif quick:
        seeds = seeds[:1]
    figures: dict = {}
    for name in names:
        spec = WORKLOADS[name]
        per_seed = [
            run_workload(
                spec,
                duration_s=duration_s,
                steps=steps,
                seed=s,
                routers=CEILING_ROUTERS[: 1 if quick else 2],
                progress=progress,
            )
            for s in seeds
        ]
        figures.update(_summarise(name, per_seed))
    figures.update(real_engine_figures())
    figures["pd.seeds"] = list(seeds)
    figures["pd.seed_set"] = "held_out" if held_out else "training"
    figures["pd.wall_s"] = round(time.perf_counter() - started, 1)
    if plot:
        with open(plot, "w") as out:
            out.write(_svg(figures, names))
    return figures


REAL_ENGINE_KEYS = ("outputs_match", "external_hit_tokens", "fallbacks_without_error")


def _head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=protocol.ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def real_engine_record() -> Path:
    """Where tests/engine/test_pd_real_engine.py leaves what it measured on the two real engines."""
    return Path(settings.VAR_DIR) / "bench" / "pd_real_engine.json"


def write_real_engine_record(measured: dict) -> Path:
    """The two-engine test's figures (``REAL_ENGINE_KEYS``), with when and at which commit, for this bench."""
    path = real_engine_record()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {key: measured.get(key) for key in REAL_ENGINE_KEYS}
    record |= {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _head()}
    path.write_text(json.dumps(record))
    return path


def real_engine_figures() -> dict:
    """``pd.real_engine.*`` from the two-engine test's last run in this checkout (starting two CPU engines here would
    cost minutes): null when it has not run; ``stale`` when it ran at another commit than this one."""
    path = real_engine_record()
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        figures = {f"pd.real_engine.{key}": None for key in REAL_ENGINE_KEYS}
        figures["pd.real_engine.note"] = (
            f"tests/engine/test_pd_real_engine.py has not left {path}: run it to fill these"
        )
        return figures
    figures = {f"pd.real_engine.{key}": record.get(key) for key in REAL_ENGINE_KEYS}
    figures["pd.real_engine.source"] = {
        "test": "tests/engine/test_pd_real_engine.py",
        "measured_at": record.get("measured_at"),
        "commit": record.get("commit"),
        "stale": record.get("commit") != _head(),
    }
    return figures


def _svg(figures: dict, names: list[str]) -> str:
    """Goodput per GPU of each fleet, per workload, relative to aggregated (first seed)."""
    fleets = ("round_robin", "aggregated", "disaggregated", "oracle")
    colors = ("#bbb", "#4c72b0", "#dd8452", "#55a868")
    width, height, bar = 160 * len(names) + 80, 260, 28
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">']
    for i, name in enumerate(names):
        runs = figures[f"pd.{name}.detail"][0]["fleets"]
        ref = runs["aggregated"]["goodput_per_gpu"] or 1.0
        for j, fleet in enumerate(fleets):
            value = runs[fleet]["goodput_per_gpu"] / ref
            h = min(200.0, 100 * value)
            x = 60 + 160 * i + j * (bar + 4)
            parts.append(f'<rect x="{x}" y="{230 - h:.1f}" width="{bar}" height="{h:.1f}" fill="{colors[j]}"/>')
            parts.append(f'<text x="{x}" y="{225 - h:.1f}">{value:.2f}</text>')
        parts.append(f'<text x="{60 + 160 * i}" y="250">{name}</text>')
    parts.append(
        '<text x="10" y="15">goodput per GPU ÷ aggregated: round robin, aggregated, disaggregated, oracle</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)
