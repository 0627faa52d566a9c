"""``bench lora``: many tenants' LoRA adapters on shared base-model replicas, in the discrete-event simulator.

Fleet: 8 replicas of ``qwen3-32b-h100x2`` with 8 adapter slots each (``--max-loras 8``); 200 adapters whose request
shares follow Zipf (s = 1), each with a load time drawn once, uniform in 0.5–2 s, and a rank of 8, 16 or 32 (the
step overhead: +10 % per rank 16 when a batch holds an adapter; ``simulator/adapter_slots.py``). Every request
names an adapter; prompts are random text of 256–1,024 tokens (no shared prefixes: this bench is about adapters),
answers 64–256 tokens. SLO: TTFT ≤ 2 s (the adapter's load included) and TPOT ≤ 100 ms, the endpoint defaults.

Each policy runs independent Poisson runs (a warm-up, then the measured window: slots start empty) at rising offered rates (``Setup.rates``, stopping after the first rate
where fewer than half the requests meet the SLO). ``slo_throughput`` is the best rate's requests/s that met the SLO;
``ttft_p90_ms`` and ``adapter_loads_per_1k_at_reference`` are at the reference rate (``Setup.reference_qps``), the
same for every policy; ``adapter_loads_per_1k`` is at ``low_qps`` (below). The upper bound is infercap with every adapter resident (200 slots, no load time), which keeps only
the LoRA step overhead: no router can beat the adapters' absence of churn. The loads have a bound of their own,
``loads_lower_bound_per_1k`` (per stage, and at both rates): Belady's MIN (evict the adapter needed furthest in the future) on one cache of all
the fleet's slots, replaying the requests in arrival order. It is the fewest loads any router could make serving
requests as they arrive, knowing the future and free of placement (a fleet's 8 × 8 slots are no better than one
64-slot cache); MIN is optimal among demand and prefetching policies alike for the number of loads. A policy whose
queues hold requests for seconds can go below it (requests waiting for one load share it), but not while meeting
the TTFT SLO, which is shorter than most loads.

The loads comparison is also made at ``low_qps`` (10), where the policies keep most requests within the SLO
(``low_rate``): there a load is one request's load, while at the reference rate requests queue behind loads and
share them, which makes every policy's count fall below even MIN's. Beside MIN (knows the future) it reports the
best rule that knows every adapter's true share but not the future (``popular_first_loads``: evict the least
popular; in expectation the best online rule for independent requests, though one stream may favour another),
infercap without the books' history, and infercap with a wrong one (another catalog's: a popularity shift). infercap reads each adapter's rate over a past of ``history_s`` (``history_rates``, another draw from
the catalog: live, the usage records' last day); round robin and the LoRA-affinity filter read none, as their sources
do not. ``lora_affinity_lfu`` is the filter given the same history (``lora_affinity.LoraAffinityLfuRouter``: infercap's
popularity book decides which idle adapter a full replica unloads), so infercap is also compared with a baseline that
knows what it knows; every ratio against ``lora_affinity`` has a ``_lfu`` twin against it.

The loads goal (infercap ≤ 0.5× the baseline's loads per 1,000 requests) is reported at both rates: the reference
rate it was first set at (``..._at_reference``) and ``low_qps`` (where it has been judged since), against both
baselines (``goals_met``).

Seeds (benchmarks/protocol.py): a run uses the ``lora`` training seeds (1-3 and 101, on which infercap's LoRA weights
were chosen); ``bench lora --held-out`` the held-out ones, which no decision has seen; ``--opt seed=N`` one seed.
Over several seeds each figure is the seeds' mean (``stages`` are the first seed's) and ``per_seed`` has every seed's
ratios, their spread the interval a single stream hides. docs/lora.md has the figures.
"""

from __future__ import annotations

import functools
import heapq
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from benchmarks import protocol
from benchmarks.capacity.plot import frontier_svg
from benchmarks.serving.words import random_text
from gateway.routing import make_router
from gateway.routing.lora_affinity import LoraAffinityLfuRouter
from simulator.adapter_slots import LoraConfig, uniform_load_times
from simulator.des import Simulation
from simulator.results import SimResult
from simulator.workloads import SimRequest, poisson_times

POLICIES = ("round_robin", "lora_affinity", "lora_affinity_lfu", "infercap")
HISTORY_READERS = ("infercap", "lora_affinity_lfu")  # the policies given the books' popularity history
BASELINES = ("lora_affinity", "lora_affinity_lfu")  # infercap is compared with both
HELD_OUT = True  # bench lora --held-out: benchmarks/protocol.py's held-out seeds
EVAL_SEED = 101  # a Setup's default seed (a training seed now: it took part in decisions)
TUNING_SEEDS = (1, 2, 3)
RANKS = ((8, 0.5), (16, 0.3), (32, 0.2))


@dataclass(frozen=True)
class Setup:
    profile: str = "llama-8b-h100"
    replicas: int = 8
    max_loras: int = 8
    adapters: int = 200
    zipf_s: float = 1.0
    load_low_s: float = 0.5
    load_high_s: float = 2.0
    overhead: float = 0.1
    prompt_tokens: tuple[int, int] = (256, 1024)
    output_tokens: tuple[int, int] = (64, 256)
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    rates: tuple[float, ...] = (40, 60, 80, 100, 120, 140, 160)
    reference_qps: float = 80
    warmup_s: float = 30.0  # arrivals before the measured window: the slots start empty, churn settles
    duration_s: float = 60.0
    seed: int = EVAL_SEED
    history_s: float = 600.0  # the books' past that infercap's popularity starts from (another draw of the catalog)
    low_qps: float = 10.0  # the loads comparison where policies meet the SLO (module docstring)
    low_duration_s: float = 300.0  # its measured window: 3,000 requests at 10 qps (60 s held ~600: ±0.1 on a ratio)


QUICK = Setup(rates=(80, 120), warmup_s=10.0, duration_s=20.0, low_duration_s=120.0)
# --smoke: the quick rates in 3-second windows, a 60 s history and a 10 s low-rate window.
SMOKE = {"duration_s": "3", "warmup_s": "1", "history_s": "60", "low_duration_s": "10", "seed": "101"}


@dataclass(frozen=True)
class Catalog:
    names: tuple[str, ...]
    weights: tuple[float, ...]
    load_s: dict
    rank: dict


@functools.lru_cache(maxsize=8)
def catalog(adapters: int, zipf_s: float, low_s: float, high_s: float, seed: int) -> Catalog:
    """The adapters, their Zipf shares (in a seeded random order of names) and their load times and ranks."""
    rng = random.Random(f"lora-catalog-{seed}")
    names = [f"tenant{i % 50}-ft{i}" for i in range(adapters)]
    rng.shuffle(names)
    weights = tuple(1.0 / (k + 1) ** zipf_s for k in range(adapters))
    ranks = {name: rng.choices([r for r, _ in RANKS], [w for _, w in RANKS])[0] for name in names}
    return Catalog(tuple(names), weights, uniform_load_times(names, low_s, high_s, seed), ranks)


def _catalog(setup: Setup) -> Catalog:
    return catalog(setup.adapters, setup.zipf_s, setup.load_low_s, setup.load_high_s, setup.seed)


def requests(setup: Setup, qps: float) -> Iterator[SimRequest]:
    """Poisson arrivals at ``qps`` for ``duration_s``, each naming a Zipf-drawn adapter."""
    cat = _catalog(setup)
    rng = random.Random(f"lora-requests-{setup.seed}-{qps:g}")  # 80 and 80.0 draw the same stream
    span_s = setup.warmup_s + setup.duration_s
    for i, t in enumerate(poisson_times(qps, duration_s=span_s, seed=setup.seed * 7919 + int(qps))):
        adapter = rng.choices(cat.names, cat.weights)[0]
        prompt = random_text(rng.randint(*setup.prompt_tokens), rng)
        yield SimRequest(f"q{i}", t, (prompt,), rng.randint(*setup.output_tokens), adapter=adapter)


@functools.lru_cache(maxsize=32)
def history_rates(setup: Setup, qps: float) -> dict[str, float]:
    """Each adapter's request rate in a past of ``history_s`` at ``qps``: what the usage records give the live proxy
    (their last day, ``endpoints.services.refresh_adapter_rates``). Drawn from the same catalog with its own seed, so
    the measured requests are not the ones counted."""
    cat = _catalog(setup)
    rng = random.Random(f"lora-history-{setup.seed}-{qps:g}")
    counts = Counter(rng.choices(cat.names, cat.weights, k=max(1, round(qps * setup.history_s))))
    return {name: n / setup.history_s for name, n in counts.items()}


def lora_config(setup: Setup, *, bound: bool = False) -> LoraConfig:
    cat = _catalog(setup)
    if bound:  # every adapter resident: no loads, no evictions
        return LoraConfig(
            max_loras=setup.adapters, load_s=lambda name: 0.0, rank=cat.rank.get, overhead=setup.overhead
        )
    return LoraConfig(max_loras=setup.max_loras, load_s=cat.load_s.get, rank=cat.rank.get, overhead=setup.overhead)


def fewest_loads(adapters: Sequence[str], slots: int) -> list[bool]:
    """Belady's MIN on a cache of ``slots`` adapters: per request, whether it needed a load (the cache starts
    empty). On a miss with the cache full, the adapter whose next request is furthest away (or never comes) leaves."""
    if slots <= 0:
        return [True] * len(adapters)
    never = len(adapters)
    following, seen = [never] * len(adapters), {}
    for i in range(len(adapters) - 1, -1, -1):
        following[i], seen[adapters[i]] = seen.get(adapters[i], never), i
    held: dict[str, int] = {}  # adapter → index of its next request
    furthest: list[tuple[int, str]] = []  # max-heap of (−next request, adapter); stale entries skipped
    loads = []
    for i, name in enumerate(adapters):
        loads.append(name not in held)
        if name not in held and len(held) >= slots:
            while True:
                nxt, victim = heapq.heappop(furthest)
                if held.get(victim) == -nxt:
                    del held[victim]
                    break
        held[name] = following[i]
        heapq.heappush(furthest, (-following[i], name))
    return loads


def popular_first_loads(adapters: Sequence[str], slots: int, share: Callable[[str], float]) -> list[bool]:
    """On a cache of ``slots`` adapters, evict the one of lowest true ``share``: the best rule knowing each
    adapter's popularity but not the future (A0, optimal for independent requests; Aho, Denning and Ullman 1971).
    Per request, whether it needed a load."""
    held: set[str] = set()
    loads = []
    for name in adapters:
        loads.append(name not in held)
        if name not in held:
            if len(held) >= slots > 0:
                held.remove(min(held, key=lambda a: (share(a), a)))
            if slots > 0:
                held.add(name)
    return loads


def _per_1k_in_window(setup: Setup, stream: Sequence[SimRequest], loads: Sequence[bool]) -> float:
    window = [load for r, load in zip(stream, loads, strict=True) if r.arrival_s >= setup.warmup_s]
    return round(1000 * sum(window) / len(window), 1) if window else 0.0


@functools.lru_cache(maxsize=32)
def loads_online_bound(setup: Setup, qps: float) -> float:
    """``popular_first_loads`` over the fleet's slots with the catalog's true shares, per 1,000 in the window."""
    cat = _catalog(setup)
    share = dict(zip(cat.names, cat.weights, strict=True))
    stream = list(requests(setup, qps))
    loads = popular_first_loads([r.adapter for r in stream], setup.replicas * setup.max_loras, share.__getitem__)
    return _per_1k_in_window(setup, stream, loads)


@functools.lru_cache(maxsize=32)
def loads_lower_bound(setup: Setup, qps: float) -> float:
    """``fewest_loads`` over the fleet's slots for this rate's requests, per 1,000 in the measured window."""
    stream = list(requests(setup, qps))
    loads = fewest_loads([r.adapter for r in stream], setup.replicas * setup.max_loras)
    return _per_1k_in_window(setup, stream, loads)


def run_rate(
    setup: Setup,
    policy: str,
    qps: float,
    *,
    bound: bool = False,
    options: dict | None = None,
    history: bool = True,
) -> dict:
    """One Poisson run at ``qps``: SLO-meeting requests/s, adapter loads per 1,000 requests, TTFT p90. infercap
    and ``lora_affinity_lfu`` start from the books' history (``history_rates``) unless ``history`` is False; the
    other baselines read none, as their sources do not."""
    options = dict(options or {})
    if policy in HISTORY_READERS and history and not bound:
        options.setdefault("adapter_history", history_rates(setup, qps))
    if policy == "lora_affinity_lfu":  # a bench baseline, not an endpoint's policy: not in make_router's registry
        router = LoraAffinityLfuRouter(seed=setup.seed, **options)
    else:
        router = make_router(policy, seed=setup.seed, **options)
    sim = Simulation(
        router=router,
        replicas=setup.replicas,
        profile=setup.profile,
        seed=setup.seed,
        lora=lora_config(setup, bound=bound),
    )
    result = sim.run(requests(setup, qps))
    return _figures(setup, result.subset(lambda r: r.arrival_s >= setup.warmup_s), qps)


def _figures(setup: Setup, result: SimResult, qps: float) -> dict:
    """Figures of the requests that arrived in the measured window (after the warm-up)."""
    n = len(result.requests)
    good = sum(r.meets(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s) for r in result.requests)
    loads = sum(bool(r.extra.get("adapter_load")) for r in result.requests)
    ttft = result.percentile("ttft_s", 90)
    return {
        "qps": qps,
        "requests": n,
        "slo_rps": round(good / setup.duration_s, 2),
        "slo_attainment": round(good / n, 4) if n else 0.0,
        "adapter_loads_per_1k": round(1000 * loads / n, 1) if n else 0.0,
        "ttft_p90_ms": round(ttft * 1000, 1) if ttft is not None else None,
    }


def sweep(setup: Setup, policy: str, progress: Callable, *, bound: bool = False, options: dict | None = None) -> dict:
    """Rising rates until fewer than half the requests meet the SLO (the reference rate always runs)."""
    rates = sorted(set(setup.rates) | {setup.reference_qps})
    stages = []
    for qps in rates:
        started = time.perf_counter()
        stage = run_rate(setup, policy, qps, bound=bound, options=options)
        stage["loads_lower_bound_per_1k"] = loads_lower_bound(setup, qps)
        stages.append(stage)
        label = "upper_bound" if bound else policy
        progress(
            f"  {label} @ {qps:g} qps: {stage['slo_rps']} SLO req/s ({stage['slo_attainment']:.0%}), "
            f"{stage['adapter_loads_per_1k']} loads/1k (MIN {stage['loads_lower_bound_per_1k']}), "
            f"TTFT p90 {stage['ttft_p90_ms']} ms "
            f"[{time.perf_counter() - started:.1f} s]"
        )
        if stage["slo_attainment"] < 0.5 and qps >= setup.reference_qps:
            break
    reference = next(s for s in stages if s["qps"] == setup.reference_qps)
    return {
        "slo_throughput": max(s["slo_rps"] for s in stages),
        "adapter_loads_per_1k_at_reference": reference["adapter_loads_per_1k"],
        "ttft_p90_ms": reference["ttft_p90_ms"],
        "slo_attainment_at_reference": reference["slo_attainment"],
        "stages": stages,
    }


def low_rate(setup: Setup, progress: Callable) -> dict:
    """Every policy, and infercap without the books' history and with a wrong one, at ``low_qps``: loads per 1,000
    requests where the policies keep most requests within the SLO, so that loads are loads and not requests queued
    behind one. The wrong history is another catalog's (``seed + 1``): every adapter's past rate is another's, the
    worst a popularity shift since the last day could do."""
    wrong = {"adapter_history": history_rates(replace(setup, seed=setup.seed + 1), setup.low_qps)}
    runs = {name: (name, True, None) for name in POLICIES} | {
        "infercap_without_history": ("infercap", False, None),
        "infercap_with_wrong_history": ("infercap", False, wrong),
    }
    out = {}
    low = replace(setup, duration_s=setup.low_duration_s)
    for label, (policy, history, options) in runs.items():
        started = time.perf_counter()
        out[label] = stage = run_rate(low, policy, setup.low_qps, history=history, options=options)
        progress(
            f"  {label} @ {setup.low_qps:g} qps: {stage['adapter_loads_per_1k']} loads/1k "
            f"({stage['slo_attainment']:.0%} within the SLO) [{time.perf_counter() - started:.1f} s]"
        )
    return out


def _with_options(setup: Setup, options: dict) -> Setup:
    """``--opt seed=N``, ``duration_s=S``, ``warmup_s=S``, ``history_s=S``, ``low_qps=Q``, ``low_duration_s=S``,
    ``rates=40,80`` (a comma list; the reference rate is the first of them unless ``reference_qps`` is given)."""
    changes: dict = {}
    for key in ("seed",):
        if key in options:
            changes[key] = int(options.pop(key))
    for key in ("duration_s", "warmup_s", "reference_qps", "history_s", "low_qps", "low_duration_s"):
        if key in options:
            changes[key] = float(options.pop(key))
    if "rates" in options:
        changes["rates"] = tuple(float(q) for q in str(options.pop("rates")).split(","))
        changes.setdefault("reference_qps", changes["rates"][0])
    if options:
        raise ValueError(f"unknown options: {', '.join(sorted(options))} (bench lora takes {_with_options.__doc__})")
    return replace(setup, **changes)


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def run(
    *,
    quick: bool = False,
    plot: str | None = None,
    live: bool = False,
    progress: Callable = print,
    held_out: bool = False,
    **options,
):
    if live:
        raise ValueError("bench lora runs in the simulator only")
    one_seed = "seed" in options
    setup = _with_options(QUICK if quick else Setup(), options)
    seeds = (setup.seed,) if one_seed else protocol.seeds_for("lora", held_out=held_out)
    per_seed = {}
    for seed in seeds:
        progress(
            f"bench lora: {setup.replicas} replicas × {setup.max_loras} slots, {setup.adapters} adapters, seed {seed}"
        )
        per_seed[seed] = run_seed(replace(setup, seed=seed), progress)
    figures = mean_figures(list(per_seed.values()))
    figures["setup"] = {
        "seeds": list(seeds), "held_out": held_out, "duration_s": setup.duration_s,
        "reference_qps": setup.reference_qps, "low_qps": setup.low_qps,
    }  # fmt: skip
    figures["goals_met"] = goals(figures)
    figures["per_seed"] = {
        seed: {key: row[key] for key in RATIO_KEYS} | {"low_rate": {k: row["low_rate"][k] for k in LOW_RATIO_KEYS}}
        for seed, row in per_seed.items()
    }
    if plot:
        first = per_seed[seeds[0]]
        _write_plot(plot, {**first["policies"], "upper_bound": first["upper_bound"]})
        progress(f"wrote {plot}")
    return figures


RATIO_KEYS = (
    "ratio_vs_round_robin", "ratio_vs_lora_affinity", "ratio_vs_lora_affinity_lfu", "loads_ratio_vs_lora_affinity",
    "loads_ratio_vs_lora_affinity_lfu", "loads_ratio_vs_lora_affinity_at_reference",
    "loads_ratio_vs_lora_affinity_lfu_at_reference", "ratio_vs_upper_bound",
)  # fmt: skip
LOW_RATIO_KEYS = (
    "loads_ratio_vs_lora_affinity",
    "loads_ratio_vs_lora_affinity_lfu",
    "online_bound_ratio_vs_lora_affinity",
)


def mean_figures(rows: list):
    """The seeds' mean of every number (booleans: all of them; lists and text: the first seed's)."""
    first = rows[0]
    if isinstance(first, dict):
        return {key: mean_figures([row[key] for row in rows]) for key in first if all(key in row for row in rows)}
    if isinstance(first, bool) or not isinstance(first, int | float) or any(row is None for row in rows):
        return all(rows) if isinstance(first, bool) else first
    return round(sum(rows) / len(rows), 4)


def goals(figures: dict) -> dict:
    """The goals against both baselines; the loads goal at the reference rate (where it was first set) and at
    ``low_qps`` (where it has been judged since)."""
    out = {"slo_throughput_1_5x_round_robin": (figures["ratio_vs_round_robin"] or 0) >= 1.5}
    for base in BASELINES:
        out[f"slo_throughput_1_1x_{base}"] = (figures[f"ratio_vs_{base}"] or 0) >= 1.1
        out[f"loads_half_of_{base}"] = (figures[f"loads_ratio_vs_{base}"] or 9) <= 0.5
        out[f"loads_half_of_{base}_at_reference"] = (figures[f"loads_ratio_vs_{base}_at_reference"] or 9) <= 0.5
    return out


def run_seed(setup: Setup, progress: Callable) -> dict:
    """Every policy's sweep, the upper bound and the low rate, on ``setup.seed``."""
    policies = {name: sweep(setup, name, progress) for name in POLICIES}
    upper = sweep(setup, "infercap", progress, bound=True)
    low = low_rate(setup, progress)
    for name in POLICIES:
        # The headline loads figure is the low rate's: there a load is a request's (module docstring).
        policies[name]["low_rate"] = low[name]
        policies[name]["adapter_loads_per_1k"] = low[name]["adapter_loads_per_1k"]
    ours = policies["infercap"]
    figures = {
        "policies": policies,
        "upper_bound": upper,
        "ratio_vs_round_robin": _ratio(ours["slo_throughput"], policies["round_robin"]["slo_throughput"]),
        "ratio_vs_upper_bound": _ratio(ours["slo_throughput"], upper["slo_throughput"]),
        "loads_lower_bound_per_1k_at_reference": loads_lower_bound(setup, setup.reference_qps),
    }
    for base in BASELINES:
        theirs = policies[base]
        figures[f"ratio_vs_{base}"] = _ratio(ours["slo_throughput"], theirs["slo_throughput"])
        figures[f"loads_ratio_vs_{base}"] = _ratio(ours["adapter_loads_per_1k"], theirs["adapter_loads_per_1k"])
        figures[f"loads_ratio_vs_{base}_at_reference"] = _ratio(
            ours["adapter_loads_per_1k_at_reference"], theirs["adapter_loads_per_1k_at_reference"]
        )
    # The best loads ratio any router serving in arrival order could reach against the baseline (see the docstring):
    # at the reference rate above 1, since queued requests share loads there.
    figures["loads_floor_ratio_vs_lora_affinity_at_reference"] = _ratio(
        figures["loads_lower_bound_per_1k_at_reference"],
        policies["lora_affinity"]["adapter_loads_per_1k_at_reference"],
    )
    figures["low_rate"] = low_rate_figures(setup, low)
    return figures


def low_rate_figures(setup: Setup, low: dict) -> dict:
    baseline_low = low["lora_affinity"]["adapter_loads_per_1k"]
    window = replace(setup, duration_s=setup.low_duration_s)
    out = {
        "qps": setup.low_qps,
        "infercap_without_history": low["infercap_without_history"],
        "infercap_with_wrong_history": low["infercap_with_wrong_history"],
        "loads_ratio_vs_lora_affinity": _ratio(low["infercap"]["adapter_loads_per_1k"], baseline_low),
        "loads_ratio_vs_lora_affinity_lfu": _ratio(
            low["infercap"]["adapter_loads_per_1k"], low["lora_affinity_lfu"]["adapter_loads_per_1k"]
        ),
        "loads_ratio_without_history": _ratio(low["infercap_without_history"]["adapter_loads_per_1k"], baseline_low),
        "loads_ratio_with_wrong_history": _ratio(
            low["infercap_with_wrong_history"]["adapter_loads_per_1k"], baseline_low
        ),
        "loads_online_bound_per_1k": loads_online_bound(window, setup.low_qps),
        "loads_lower_bound_per_1k": loads_lower_bound(window, setup.low_qps),
    }
    out["online_bound_ratio_vs_lora_affinity"] = _ratio(out["loads_online_bound_per_1k"], baseline_low)
    out["floor_ratio_vs_lora_affinity"] = _ratio(out["loads_lower_bound_per_1k"], baseline_low)
    return out


def _write_plot(path: str, runs: dict) -> None:
    curves = {name: [(s["qps"], s["slo_attainment"]) for s in run["stages"]] for name, run in runs.items()}
    svg = frontier_svg(curves, title="bench lora: SLO attainment by offered load", x_label="offered requests/s")
    with open(path, "w") as out:
        out.write(svg)
