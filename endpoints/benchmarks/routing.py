"""``bench routing``: every routing policy on llm-d's shared-prefix workload in the discrete-event simulator.

8 simulated replicas (``qwen3-32b-h100x2``, the model of llm-d's benchmark); 32 groups × 32 prompts,
2,048-token system prompt, 256-token question, 256-token output; Poisson arrivals in rising QPS stages,
one continuous run per policy (caches stay warm across stages), until the first *saturated* stage: by
Little's law, more than ``qps × TTFT_SLO`` requests waiting (or ``qps × (TTFT_SLO + (out − 1) × TPOT_SLO)``
in flight) at a stage's end means the fleet no longer keeps its SLO.

Per policy: SLO-meeting throughput (requests/s, arrived in a stage, that met TTFT and TPOT, best stage),
TTFT p50/p95 and output tokens/s at the highest stage every policy ran ("highest common load"),
prefix-cache hit rate (the engines' own counters) and max/mean MU routed per replica. Then a hot-prefix
variant (half the traffic in one group: ours vs pure prefix affinity without the load bound) and a
multi-turn chat workload. ``--live`` runs the shared-prefix workload through the real proxy instead.

Prompts use this module's own random text: each group's system prompt and each question differ from
the first block on, which is what makes prefix affinity matter.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from endpoints.routing import make_router
from endpoints.runtimes.sim.des import Simulation
from endpoints.runtimes.sim.profiles import get_profile
from endpoints.runtimes.sim.results import SimResult, percentile
from endpoints.runtimes.sim.tokens import output_text
from endpoints.runtimes.sim.workloads import SimRequest, poisson_times

POLICIES = ("round_robin", "least_request", "power_of_two", "llmd", "infercap")
_WORDS = (
    "data",
    "node",
    "gpus",
    "kv_c",
    "fast",
    "slow",
    "tick",
    "rack",
    "warm",
    "cold",
    "load",
    "unit",
    "heap",
    "page",
)


def random_text(tokens: int, rng: random.Random) -> str:
    """``tokens`` simulator tokens (4 characters each) of random words."""
    return "".join(rng.choices(_WORDS, k=tokens))


@dataclass(frozen=True)
class Setup:
    profile: str = "qwen3-32b-h100x2"
    replicas: int = 8
    groups: int = 32
    prompts_per_group: int = 32
    system_tokens: int = 2048
    question_tokens: int = 256
    output_tokens: int = 256
    ttft_slo_s: float = 2.0  # the endpoint defaults (Endpoint.ttft_slo_ms / tpot_slo_ms)
    tpot_slo_s: float = 0.1
    stages: tuple[float, ...] = (20, 40, 60, 80, 100, 120, 140, 160, 180, 200, 220, 240)
    stage_s: float = 20.0
    hot_share: float = 0.5
    seed: int = 1

    @property
    def slo_in_flight_per_qps(self) -> float:
        return self.ttft_slo_s + (self.output_tokens - 1) * self.tpot_slo_s


QUICK = Setup(stages=(40, 80, 120, 160, 200, 240, 280), stage_s=8.0)


# -- workloads ---------------------------------------------------------------------------------------------


def shared_prefix_requests(setup: Setup, times: Iterator[float], *, hot_share: float = 0.0) -> Iterator[SimRequest]:
    rng = random.Random(f"routing-bench-text-{setup.seed}")
    systems = [random_text(setup.system_tokens, rng) for _ in range(setup.groups)]
    questions = [
        [random_text(setup.question_tokens, rng) for _ in range(setup.prompts_per_group)] for _ in range(setup.groups)
    ]
    pick = random.Random(f"routing-bench-pick-{setup.seed}")
    for i, t in enumerate(times):
        group = 0 if hot_share and pick.random() < hot_share else pick.randrange(setup.groups)
        yield SimRequest(
            request_id=f"sp-{i}",
            arrival_s=t,
            prompt_parts=(systems[group], questions[group][pick.randrange(setup.prompts_per_group)]),
            output_tokens=setup.output_tokens,
            extra={"group": group},
        )


def multi_turn_requests(*, sessions: int, turns: int, rate: float, seed: int) -> Iterator[SimRequest]:
    """Chat sessions: each turn's prompt is the whole conversation so far; ``x-session-id`` set."""
    rng = random.Random(f"routing-bench-mt-{seed}")
    system = random_text(512, rng)

    def turn(session: str, k: int, history: str, at: float) -> SimRequest:
        user = random_text(64, rng)
        request = SimRequest(
            request_id=f"{session}-t{k}",
            arrival_s=at,
            prompt_parts=(system, history + user),
            output_tokens=128,
            session_id=session,
        )
        if k + 1 < turns:

            def followup(result, _history=history + user) -> SimRequest | None:
                answer = output_text(0, result.output_tokens or 0)
                return turn(session, k + 1, _history + answer, result.finish_s + rng.expovariate(1 / 3.0))

            request.followup = followup
        return request

    for i, t in enumerate(poisson_times(rate, count=sessions, seed=seed)):
        yield turn(f"s{i}", 0, "", t)


# -- one policy, rising stages -----------------------------------------------------------------------------


def _staged_times(setup: Setup, sim_ref: list, stopped: list) -> Iterator[float]:
    """Rising Poisson stages; stops after the first stage at whose end the fleet is saturated."""
    start = 0.0
    for index, qps in enumerate(setup.stages):
        yield from poisson_times(qps, duration_s=setup.stage_s, start_s=start, seed=setup.seed * 1000 + index)
        start += setup.stage_s
        fleet = sim_ref[0].fleet_view()
        # Little's law on the waiting requests (proxy backlog + engines' waiting queues): more than
        # qps × TTFT SLO of them means the average wait alone already exceeds the TTFT SLO.
        waiting = fleet.queued + sum(r.num_waiting for r in fleet.replicas)
        if waiting > qps * setup.ttft_slo_s or fleet.in_flight > qps * setup.slo_in_flight_per_qps:
            stopped.append(index)
            return


def run_staged(setup: Setup, policy: str, router_options: dict | None = None) -> dict:
    router = make_router(policy, seed=setup.seed, **(router_options or {}))
    sim = Simulation(router=router, replicas=setup.replicas, profile=get_profile(setup.profile), seed=setup.seed)
    stopped: list[int] = []
    result = sim.run(shared_prefix_requests(setup, _staged_times(setup, [sim], stopped)))
    last_stage = stopped[0] if stopped else len(setup.stages) - 1
    stages = [_stage_figures(setup, result, k) for k in range(last_stage + 1)]
    return {"result": result, "stages": stages, "saturated_at_qps": setup.stages[last_stage] if stopped else None}


def _stage_window(setup: Setup, k: int) -> tuple[float, float]:
    return k * setup.stage_s, (k + 1) * setup.stage_s


def _stage_figures(setup: Setup, result: SimResult, k: int) -> dict:
    lo, hi = _stage_window(setup, k)
    arrived = [r for r in result.requests if lo <= r.arrival_s < hi]
    good = sum(r.meets(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s) for r in arrived)
    # Requests never completed count as infinitely late, so a saturated stage's percentiles are honest.
    ttfts = [r.ttft_s if r.ttft_s is not None else math.inf for r in arrived]
    tokens_out = _tokens_generated_between(result, lo, hi)
    return {
        "qps": setup.stages[k],
        "requests": len(arrived),
        "slo_rps": good / setup.stage_s,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "output_tok_s": tokens_out / setup.stage_s,
    }


def _tokens_generated_between(result: SimResult, lo: float, hi: float) -> float:
    """Output tokens produced inside [lo, hi), spreading each request's decode evenly over its decode time."""
    total = 0.0
    for r in result.requests:
        if r.first_token_s is None or r.finish_s is None or not r.output_tokens:
            continue
        start, end = r.first_token_s, max(r.finish_s, r.first_token_s + 1e-9)
        overlap = max(0.0, min(end, hi) - max(start, lo))
        total += r.output_tokens * overlap / (end - start)
    return total


def load_over_mean(result: SimResult, *, since_s: float = 0.0) -> float:
    """max / mean of the MU routed to each replica (requests arriving after ``since_s``)."""
    per_replica = {rep.replica_id: 0.0 for rep in result.replicas}
    for r in result.requests:
        if r.replica_id is not None and r.arrival_s >= since_s:
            per_replica[r.replica_id] = per_replica.get(r.replica_id, 0.0) + r.mu
    loads = list(per_replica.values())
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean else 1.0


# -- the benchmark -----------------------------------------------------------------------------------------


def run(
    *, quick: bool = False, plot: str | None = None, live: bool = False, progress: Callable = print, **options
) -> dict:
    setup = QUICK if quick else Setup()
    if "stages" in options:
        setup = Setup(**{**setup.__dict__, "stages": tuple(float(q) for q in str(options.pop("stages")).split(","))})
    for key in ("stage_s", "hot_share", "replicas", "seed"):
        if key in options:
            kind = type(getattr(setup, key))
            setup = Setup(**{**setup.__dict__, key: kind(options.pop(key))})
    if options:
        raise ValueError(f"unknown options for bench routing: {', '.join(sorted(options))}")
    if live:
        from endpoints.benchmarks.routing_live import run_live

        return run_live(setup=setup, quick=quick, progress=progress)

    started = time.perf_counter()
    runs = {}
    for policy in POLICIES:
        t0 = time.perf_counter()
        runs[policy] = run_staged(setup, policy)
        best = max(s["slo_rps"] for s in runs[policy]["stages"])
        progress(
            f"{policy}: stages up to {runs[policy]['stages'][-1]['qps']:g} qps, best SLO-meeting {best:.1f} req/s "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    common = min(len(r["stages"]) for r in runs.values()) - 1
    policies = {}
    for policy, data in runs.items():
        at_common = data["stages"][common]
        result = data["result"]
        policies[policy] = {
            "slo_rps": round(max(s["slo_rps"] for s in data["stages"]), 2),
            "ttft_p50_ms": _ms(at_common["ttft_p50_s"]),
            "ttft_p95_ms": _ms(at_common["ttft_p95_s"]),
            "output_tok_s": round(at_common["output_tok_s"], 1),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
            "max_over_mean_load": round(load_over_mean(result), 3),
            "saturated_at_qps": data["saturated_at_qps"],
        }
    ours = policies["infercap"]
    figures = {
        "workload": {
            "profile": setup.profile,
            "replicas": setup.replicas,
            "groups": setup.groups,
            "prompts_per_group": setup.prompts_per_group,
            "tokens": [setup.system_tokens, setup.question_tokens, setup.output_tokens],
            "stages_qps": list(setup.stages),
            "stage_s": setup.stage_s,
            "slo": {"ttft_s": setup.ttft_slo_s, "tpot_s": setup.tpot_slo_s},
            "highest_common_qps": setup.stages[common],
        },
        "policies": policies,
        "ratio_vs_round_robin": _ratio(ours["slo_rps"], policies["round_robin"]["slo_rps"]),
        "ratio_vs_llmd": _ratio(ours["slo_rps"], policies["llmd"]["slo_rps"]),
        "ttft_p50_ratio_vs_round_robin": _ratio(ours["ttft_p50_ms"], policies["round_robin"]["ttft_p50_ms"]),
    }
    progress("hot-prefix variant")
    figures["hot_prefix"] = hot_prefix(setup, best_qps=ours["slo_rps"])
    progress("multi-turn sessions")
    figures["multi_turn"] = multi_turn(setup, quick=quick)
    figures["goals"] = goals(figures)
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    if plot:
        from endpoints.benchmarks.routing_plot import write_svg

        write_svg(plot, runs)
        progress(f"wrote {plot}")
    return figures


def hot_prefix(setup: Setup, *, best_qps: float) -> dict:
    """Half the traffic in one group, at 60% of our best throughput: bounded load vs pure affinity."""
    qps = max(10.0, 0.6 * best_qps)
    duration = setup.stage_s * 3
    out = {"qps": round(qps, 1), "hot_share": setup.hot_share}
    variants = {"infercap": {}, "affinity": {"load_bound": 1e9, "load_slack": 1e9}}
    for name, router_options in variants.items():
        router = make_router("infercap", seed=setup.seed, **router_options)
        sim = Simulation(router=router, replicas=setup.replicas, profile=get_profile(setup.profile), seed=setup.seed)
        times = poisson_times(qps, duration_s=duration, seed=setup.seed + 7)
        result = sim.run(shared_prefix_requests(setup, times, hot_share=setup.hot_share))
        out[name] = {
            "max_over_mean_load": round(load_over_mean(result, since_s=setup.stage_s), 3),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
            "slo_attainment": round(result.slo_attainment(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s), 4),
            "ttft_p50_ms": _ms(result.percentile("ttft_s", 50)),
        }
    out["max_over_mean_load"] = out["infercap"]["max_over_mean_load"]
    out["hit_rate_vs_affinity"] = _ratio(out["infercap"]["prefix_hit_rate"], out["affinity"]["prefix_hit_rate"])
    return out


def multi_turn(setup: Setup, *, quick: bool) -> dict:
    sessions, turns, rate = (160, 5, 16.0) if quick else (600, 6, 30.0)
    out = {"sessions": sessions, "turns": turns, "session_rate_per_s": rate}
    for policy in ("round_robin", "llmd", "infercap"):
        router = make_router(policy, seed=setup.seed)
        sim = Simulation(router=router, replicas=setup.replicas, profile=get_profile(setup.profile), seed=setup.seed)
        result = sim.run(multi_turn_requests(sessions=sessions, turns=turns, rate=rate, seed=setup.seed))
        out[policy] = {
            "slo_attainment": round(result.slo_attainment(ttft_s=setup.ttft_slo_s, tpot_s=setup.tpot_slo_s), 4),
            "ttft_p50_ms": _ms(result.percentile("ttft_s", 50)),
            "prefix_hit_rate": round(result.prefix_hit_rate(), 4),
        }
    return out


def goals(figures: dict) -> dict:
    hot = figures["hot_prefix"]
    checks = {
        "slo_rps_ge_2x_round_robin": (figures["ratio_vs_round_robin"] or 0) >= 2.0,
        "slo_rps_ge_1.1x_llmd": (figures["ratio_vs_llmd"] or 0) >= 1.1,
        "ttft_p50_le_0.1x_round_robin": (figures["ttft_p50_ratio_vs_round_robin"] or math.inf) <= 0.1,
        "hot_prefix_max_over_mean_le_1.3": hot["max_over_mean_load"] <= 1.3,
        "hot_prefix_hit_rate_ge_0.8x_affinity": (hot["hit_rate_vs_affinity"] or 0) >= 0.8,
    }
    return {**checks, "all": all(checks.values())}


def _ms(seconds: float | None) -> float | None:
    """Milliseconds, None when undefined (no request, or never served)."""
    return round(seconds * 1000, 1) if seconds is not None and math.isfinite(seconds) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None
